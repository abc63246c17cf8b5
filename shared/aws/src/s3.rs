//! `S3Blobs`: the files tools return, as objects of the deployment's bucket (`BATON_BUCKET`),
//! keyed `<runId>/<fileId>`, with their media type and file name. The bucket's lifecycle
//! rule deletes them after the retention period, like the runs that name them.

use aws_sdk_s3::Client;
use aws_sdk_s3::error::ProvideErrorMetadata;
use aws_sdk_s3::primitives::ByteStream;
use tracing::instrument;

use crate::sdk::map_sdk_err;
use baton_core::error::PortError;
use baton_core::ports::{Blob, Blobs};

pub struct S3Blobs {
    client: Client,
    bucket: String,
}

impl S3Blobs {
    pub fn new(client: Client, bucket: impl Into<String>) -> Self {
        Self {
            client,
            bucket: bucket.into(),
        }
    }
}

#[async_trait::async_trait]
impl Blobs for S3Blobs {
    #[instrument(skip(self, blob), fields(bytes = blob.bytes.len()))]
    async fn put(&self, key: &str, blob: &Blob) -> Result<(), PortError> {
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .content_type(&blob.media_type)
            .metadata("name", &blob.name)
            .body(ByteStream::from(blob.bytes.clone()))
            .send()
            .await
            .map_err(|e| map_sdk_err("PutObject", e))?;
        Ok(())
    }

    #[instrument(skip(self))]
    async fn get(&self, key: &str) -> Result<Option<Blob>, PortError> {
        let out = match self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
        {
            Ok(o) => o,
            Err(e) if e.code() == Some("NoSuchKey") => return Ok(None),
            Err(e) => return Err(map_sdk_err("GetObject", e)),
        };
        let name = out
            .metadata()
            .and_then(|m| m.get("name"))
            .cloned()
            .unwrap_or_else(|| "file".into());
        let media_type = out
            .content_type()
            .unwrap_or("application/octet-stream")
            .to_owned();
        let bytes = out
            .body
            .collect()
            .await
            .map_err(|e| PortError::unavailable(format!("GetObject {key}: {e}"), e))?
            .into_bytes()
            .to_vec();
        Ok(Some(Blob {
            name,
            media_type,
            bytes,
        }))
    }
}
