//! How Baton's stores keep timeline entries as bytes: their JSON, deflated when that is
//! smaller. The embedded SQLite store and the DynamoDB store both use it; the core never
//! sees stored bytes.
//!
//! Timelines are read whole on a cold start, and most of a large entry is text that
//! compresses well, so bodies of [`COMPRESS_FROM`] bytes or more are deflated. The first
//! byte tells the two apart: deflated data starts with 0, which plain JSON never does.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Bodies of this size or more are deflated when that makes them smaller.
pub const COMPRESS_FROM: usize = 256;
const DEFLATED: u8 = 0;

/// Why a stored value could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("entry JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("entry compression: {0}")]
    Io(#[from] std::io::Error),
    #[error("unknown entry encoding (first byte {0:#04x})")]
    Unknown(u8),
}

/// Encodes a value for storage: its JSON, deflated when that is smaller.
pub fn encode<T: Serialize + ?Sized>(v: &T) -> Result<Vec<u8>, CodecError> {
    use std::io::Write;
    let json = serde_json::to_vec(v)?;
    if json.len() < COMPRESS_FROM {
        return Ok(json);
    }
    let mut z = flate2::write::DeflateEncoder::new(vec![DEFLATED], flate2::Compression::fast());
    z.write_all(&json)?;
    let packed = z.finish()?;
    Ok(if packed.len() < json.len() {
        packed
    } else {
        json
    })
}

/// Decodes what [`encode`] wrote.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    match bytes.first() {
        Some(&DEFLATED) => Ok(serde_json::from_reader(flate2::read::DeflateDecoder::new(
            &bytes[1..],
        ))?),
        Some(b'{' | b'[' | b'"') => Ok(serde_json::from_slice(bytes)?),
        other => Err(CodecError::Unknown(other.copied().unwrap_or_default())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn small_values_stay_plain_json_and_large_ones_are_deflated() {
        let small = json!({"seq": 1, "type": "user", "text": "hi"});
        let bytes = encode(&small).expect("encodes");
        assert_eq!(bytes[0], b'{');
        assert_eq!(decode::<Value>(&bytes).expect("decodes"), small);

        let big = json!({"seq": 9, "type": "user", "text": "word ".repeat(200)});
        let packed = encode(&big).expect("encodes");
        assert_eq!(packed[0], 0, "large entries are deflated");
        assert!(packed.len() < 200, "{} bytes", packed.len());
        assert_eq!(decode::<Value>(&packed).expect("decodes"), big);
    }

    #[test]
    fn incompressible_values_are_kept_plain_and_garbage_is_refused() {
        // 300 bytes of digits that deflate cannot shrink below their JSON.
        let noise: String = (0..300u64)
            .map(|i| char::from(b'0' + ((i * 7919 + i * i * 104_729) % 10) as u8))
            .collect();
        let v = json!(noise);
        let bytes = encode(&v).expect("encodes");
        assert_eq!(decode::<Value>(&bytes).expect("decodes"), v);
        assert!(matches!(
            decode::<Value>(b"x"),
            Err(CodecError::Unknown(b'x'))
        ));
        assert!(decode::<Value>(&[]).is_err());
        assert!(
            decode::<Value>(&[0, 1, 2, 3]).is_err(),
            "a broken deflate stream"
        );
    }
}
