//! How Baton's stores keep timeline entries as bytes: their JSON, deflated when that is
//! smaller. The embedded SQLite store and the DynamoDB store both use it; the core never
//! sees stored bytes.
//!
//! Timelines are read whole on a cold start, and most of a large entry is text that
//! compresses well, so bodies of [`COMPRESS_FROM`] bytes or more are deflated. The first
//! byte tells the two apart: deflated data starts with 0, which plain JSON never does.

use std::cell::RefCell;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
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
    let json = serde_json::to_vec(v)?;
    if json.len() < COMPRESS_FROM {
        return Ok(json);
    }
    let packed = deflate(&json)?;
    Ok(if packed.len() < json.len() {
        packed
    } else {
        json
    })
}

/// Decodes what [`encode`] wrote.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    match bytes.first() {
        // Inflated whole first: serde_json would read a `Read` one byte at a time.
        Some(&DEFLATED) => Ok(serde_json::from_slice(&inflate(&bytes[1..])?)?),
        Some(b'{' | b'[' | b'"') => Ok(serde_json::from_slice(bytes)?),
        other => Err(CodecError::Unknown(other.copied().unwrap_or_default())),
    }
}

thread_local! {
    // A deflate state is a few hundred KB to set up: each thread keeps one and resets it.
    static DEFLATE: RefCell<Compress> = RefCell::new(Compress::new(Compression::fast(), false));
    static INFLATE: RefCell<Decompress> = RefCell::new(Decompress::new(false));
}

fn zerror(e: impl std::error::Error + Send + Sync + 'static) -> CodecError {
    CodecError::Io(std::io::Error::other(e))
}

/// `DEFLATED` followed by `json` as raw deflate.
fn deflate(json: &[u8]) -> Result<Vec<u8>, CodecError> {
    DEFLATE.with_borrow_mut(|z| {
        z.reset();
        let mut out = Vec::with_capacity(json.len() / 2 + 64);
        out.push(DEFLATED);
        loop {
            let done = z.total_in() as usize;
            match z
                .compress_vec(&json[done..], &mut out, FlushCompress::Finish)
                .map_err(zerror)?
            {
                Status::StreamEnd => return Ok(out),
                Status::Ok | Status::BufError => out.reserve(out.capacity()),
            }
        }
    })
}

/// Raw deflate back to the bytes it holds.
fn inflate(packed: &[u8]) -> Result<Vec<u8>, CodecError> {
    INFLATE.with_borrow_mut(|z| {
        z.reset(false);
        let mut out = Vec::with_capacity(packed.len() * 4 + 64);
        loop {
            let done = z.total_in() as usize;
            let before = z.total_out();
            match z
                .decompress_vec(&packed[done..], &mut out, FlushDecompress::None)
                .map_err(zerror)?
            {
                Status::StreamEnd => return Ok(out),
                // Out of input with the stream unfinished: truncated data.
                _ if done == packed.len() && z.total_out() == before => {
                    return Err(zerror(std::io::Error::from(
                        std::io::ErrorKind::UnexpectedEof,
                    )));
                }
                Status::Ok | Status::BufError => out.reserve(out.capacity()),
            }
        }
    })
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

    #[test]
    fn truncated_or_corrupt_deflated_bodies_are_errors() {
        let big = json!({"text": "word ".repeat(500)});
        let packed = encode(&big).expect("encodes");
        assert_eq!(packed[0], 0);
        for cut in [1, 2, packed.len() / 2, packed.len() - 1] {
            assert!(decode::<Value>(&packed[..cut]).is_err(), "cut at {cut}");
        }
        let mut corrupt = packed.clone();
        corrupt[1] ^= 0xff;
        assert!(decode::<Value>(&corrupt).is_err());
        // The thread's inflate state is reset: a good body decodes after a bad one.
        assert_eq!(decode::<Value>(&packed).expect("decodes"), big);
    }
}
