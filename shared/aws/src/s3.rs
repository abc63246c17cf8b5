//! `S3Blobs`: the files tools return, as objects of the deployment's bucket (`BATON_BUCKET`),
//! keyed `<runId>/<fileId>`, with their media type and file name. The bucket's lifecycle
//! rule deletes them after the retention period, like the runs that name them.

use aws_sdk_s3::Client;
use aws_sdk_s3::error::ProvideErrorMetadata;
use aws_sdk_s3::primitives::ByteStream;
use tracing::instrument;

use crate::sdk::map_sdk_err;
use aws_sdk_s3::presigning::PresigningConfig;
use baton_core::error::PortError;
use baton_core::ports::{Blob, Blobs, Download, attachment};

/// The text of the object an `s3://bucket/key` URI names (the agents file, read once per
/// container at start-up: it does not fit in Lambda's 4 KB environment).
pub async fn read_text(sdk: &aws_config::SdkConfig, uri: &str) -> Result<String, PortError> {
    let client = Client::new(sdk);
    let (bucket, key) = parse_uri(uri).ok_or_else(|| PortError::Broken {
        message: format!("{uri:?} is not an s3://bucket/key URI"),
        source: None,
    })?;
    let out = client
        .get_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .map_err(|e| map_sdk_err("GetObject", e))?;
    let bytes = out
        .body
        .collect()
        .await
        .map_err(|e| PortError::unavailable(format!("reading {uri}"), e))?
        .into_bytes();
    String::from_utf8(bytes.to_vec())
        .map_err(|e| PortError::broken(format!("{uri} is not UTF-8"), e))
}

/// `s3://bucket/key` as (bucket, key), both non-empty.
pub fn parse_uri(uri: &str) -> Option<(&str, &str)> {
    let (bucket, key) = uri.strip_prefix("s3://")?.split_once('/')?;
    (!bucket.is_empty() && !key.is_empty()).then_some((bucket, key))
}

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
            .metadata("name", encode(&blob.name))
            .body(ByteStream::from(blob.bytes.clone()))
            .send()
            .await
            .map_err(|e| map_sdk_err("PutObject", e))?;
        Ok(())
    }

    #[instrument(skip(self))]
    async fn get(&self, key: &str) -> Result<Option<Blob>, PortError> {
        self.download(key, u64::MAX, std::time::Duration::ZERO)
            .await
            .map(|d| match d {
                Some(Download::Bytes(b)) => Some(b),
                _ => None,
            })
    }

    /// One `GetObject`: its body is read only when it is at most `inline_max` bytes; past
    /// that the body is dropped unread and the object is linked by a presigned `GetObject`
    /// URL that names the file's name and type, valid for `ttl` (and at most as long as the
    /// credentials that sign it).
    #[instrument(skip(self))]
    async fn download(
        &self,
        key: &str,
        inline_max: u64,
        ttl: std::time::Duration,
    ) -> Result<Option<Download>, PortError> {
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
            .map(|n| decode(n))
            .unwrap_or_else(|| "file".into());
        let media_type = out
            .content_type()
            .unwrap_or("application/octet-stream")
            .to_owned();
        let size = out.content_length().and_then(|n| u64::try_from(n).ok());
        if size.is_some_and(|n| n > inline_max) {
            drop(out.body);
            let config = PresigningConfig::expires_in(ttl)
                .map_err(|e| PortError::broken("presigning config", e))?;
            let signed = self
                .client
                .get_object()
                .bucket(&self.bucket)
                .key(key)
                .response_content_type(&media_type)
                .response_content_disposition(attachment(&name))
                .presigned(config)
                .await
                .map_err(|e| map_sdk_err("GetObject (presign)", e))?;
            return Ok(Some(Download::Link(signed.uri().to_owned())));
        }
        let bytes = out
            .body
            .collect()
            .await
            .map_err(|e| PortError::unavailable(format!("GetObject {key}: {e}"), e))?
            .into_bytes()
            .to_vec();
        Ok(Some(Download::Bytes(Blob {
            name,
            media_type,
            bytes,
        })))
    }
}

/// S3 user metadata travels as HTTP headers, ASCII only: a file name is kept percent-encoded.
fn encode(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b' ') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = (bytes[i] == b'%')
            .then(|| text.get(i + 1..i + 3))
            .flatten()
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match hex {
            Some(b) => {
                out.push(b);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    #[test]
    fn file_names_survive_the_metadata_header() {
        for name in ["report.csv", "résumé 2026.pdf", "100% done.txt", "日本.md"] {
            let encoded = super::encode(name);
            assert!(encoded.is_ascii(), "{encoded}");
            assert_eq!(super::decode(&encoded), name);
        }
    }
}
