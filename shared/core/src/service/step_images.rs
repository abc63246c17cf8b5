//! The images a model that sees is given: those the tools in its history returned, read
//! from the run's files.

use super::step_world::StepWorld;
use crate::llm::LlmError;
use crate::timeline::Entry;

impl StepWorld<'_> {
    /// The bytes of the images the tools in `history` returned, the newest first, within
    /// [`crate::llm::MAX_IMAGES`] and the byte caps (an image past them is known by its
    /// summary alone). A fork's are read through the run it came from.
    pub(super) async fn images(
        &self,
        history: &[Entry],
    ) -> Result<Vec<crate::llm::Image>, LlmError> {
        use crate::llm::{MAX_IMAGE_BYTES, MAX_IMAGES, MAX_IMAGES_BYTES, is_image};
        let mut out = Vec::new();
        let mut total = 0usize;
        let files = history.iter().rev().filter_map(|e| match &e.body {
            crate::timeline::EntryBody::File(f) if is_image(&f.media_type) => Some(f),
            _ => None,
        });
        for f in files {
            let size = usize::try_from(f.size).unwrap_or(usize::MAX);
            if out.len() >= MAX_IMAGES {
                break;
            }
            if size > MAX_IMAGE_BYTES || total.saturating_add(size) > MAX_IMAGES_BYTES {
                continue;
            }
            let owners = std::iter::once(self.run.run_id.as_str()).chain(
                self.run
                    .origin
                    .forked_from
                    .as_ref()
                    .map(|f| f.run_id.as_str()),
            );
            for owner in owners {
                let key = format!("{owner}/{}", f.file_id);
                let blob = self
                    .deps
                    .blobs
                    .get(&key)
                    .await
                    .map_err(|e| LlmError::Unavailable {
                        message: format!("reading image `{}` for the model: {e}", f.name),
                        source: Some(Box::new(e)),
                    })?;
                if let Some(blob) = blob {
                    total += blob.bytes.len();
                    out.push(crate::llm::Image {
                        file_id: f.file_id.clone(),
                        media_type: f.media_type.clone(),
                        bytes: blob.bytes,
                    });
                    break;
                }
            }
        }
        Ok(out)
    }
}
