//! `FileBlobs`: the files tools return, kept under the data dir (`files/<runId>/<fileId>`,
//! with a `.json` beside each naming it), written whole to a temporary name and then renamed,
//! so that a reader never sees half a file.

use std::path::{Path, PathBuf};

use baton_core::error::PortError;
use baton_core::ports::{Blob, Blobs};
use serde_json::json;

pub struct FileBlobs {
    dir: PathBuf,
}

impl FileBlobs {
    /// Blobs under `data_dir/files`.
    pub fn new(data_dir: &Path) -> Self {
        Self {
            dir: data_dir.join("files"),
        }
    }

    /// The path of `key`, which must be `<runId>/<fileId>` of plain id characters (no
    /// other path can be named).
    fn path(&self, key: &str) -> Result<PathBuf, PortError> {
        let plain = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        };
        match key.split_once('/') {
            Some((run, file)) if plain(run) && plain(file) => Ok(self.dir.join(run).join(file)),
            _ => Err(PortError::broken(
                format!("not a blob key: {key:?}"),
                std::io::Error::from(std::io::ErrorKind::InvalidInput),
            )),
        }
    }
}

fn io(what: &str, e: std::io::Error) -> PortError {
    if e.kind() == std::io::ErrorKind::StorageFull {
        return crate::store::disk_full(e);
    }
    PortError::unavailable(format!("files: {what}: {e}"), e)
}

#[async_trait::async_trait]
impl Blobs for FileBlobs {
    async fn put(&self, key: &str, blob: &Blob) -> Result<(), PortError> {
        let path = self.path(key)?;
        let blob = blob.clone();
        tokio::task::spawn_blocking(move || {
            let dir = path.parent().unwrap_or(Path::new("."));
            std::fs::create_dir_all(dir).map_err(|e| io("create dir", e))?;
            let meta = json!({"name": blob.name, "mediaType": blob.media_type}).to_string();
            let write = |to: &Path, bytes: &[u8]| {
                let tmp = to.with_extension("partial");
                std::fs::write(&tmp, bytes).map_err(|e| io("write", e))?;
                std::fs::rename(&tmp, to).map_err(|e| io("rename", e))
            };
            write(&path.with_extension("json"), meta.as_bytes())?;
            write(&path, &blob.bytes)
        })
        .await
        .map_err(|e| PortError::unavailable(format!("files: {e}"), e))?
    }

    async fn get(&self, key: &str) -> Result<Option<Blob>, PortError> {
        let path = self.path(key)?;
        tokio::task::spawn_blocking(move || {
            let meta = match std::fs::read(path.with_extension("json")) {
                Ok(m) => m,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(io("read", e)),
            };
            let meta: serde_json::Value = serde_json::from_slice(&meta)
                .map_err(|e| PortError::broken(format!("files: {}: {e}", path.display()), e))?;
            let bytes = match std::fs::read(&path) {
                Ok(b) => b,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(io("read", e)),
            };
            Ok(Some(Blob {
                name: meta["name"].as_str().unwrap_or("file").to_owned(),
                media_type: meta["mediaType"]
                    .as_str()
                    .unwrap_or("application/octet-stream")
                    .to_owned(),
                bytes,
            }))
        })
        .await
        .map_err(|e| PortError::unavailable(format!("files: {e}"), e))?
    }
}
