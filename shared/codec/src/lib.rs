//! How Baton's stores keep timeline entries as bytes: their JSON, deflated when that is
//! smaller. The embedded SQLite store and the DynamoDB store both use it; the core never
//! sees stored bytes.
//!
//! Timelines are read whole on a cold start, and most of a large entry is text that
//! compresses well, so bodies of [`COMPRESS_FROM`] bytes or more are packed, each store
//! choosing how ([`Packing`]). The first byte tells the encodings apart: deflated data
//! starts with 0 and LZ4 with 1, which plain JSON never does. Every store reads all three.

use std::cell::RefCell;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Bodies of this size or more are packed when that makes them smaller.
pub const COMPRESS_FROM: usize = 256;
const DEFLATED: u8 = 0;
const LZ4: u8 = 1;

/// How a store packs large bodies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packing {
    /// Deflate: the smallest, for a store that bills by the kilobyte written (DynamoDB).
    Deflate,
    /// LZ4: a few times cheaper to pack and unpack, about a third larger, for a store
    /// whose steps are bound by the CPU (the embedded one). Deflate resets about 300 KB
    /// of tables for each body, however small; LZ4 a 16 KB one.
    Lz4,
}

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
    encode_with(v, Packing::Deflate)
}

/// Encodes a value for storage: its JSON, packed by `packing` when that is smaller.
pub fn encode_with<T: Serialize + ?Sized>(v: &T, packing: Packing) -> Result<Vec<u8>, CodecError> {
    let json = serde_json::to_vec(v)?;
    if json.len() < COMPRESS_FROM {
        return Ok(json);
    }
    let packed = match packing {
        Packing::Deflate => deflate(&json)?,
        Packing::Lz4 => lz4(&json)?,
    };
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
        Some(&LZ4) => Ok(serde_json::from_slice(&unlz4(&bytes[1..])?)?),
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

/// `LZ4` followed by `json` as an LZ4 block, its size first (4 bytes, little-endian).
fn lz4(json: &[u8]) -> Result<Vec<u8>, CodecError> {
    const HEAD: usize = 5;
    let mut out = vec![0; HEAD + lz4_flex::block::get_maximum_output_size(json.len())];
    out[0] = LZ4;
    out[1..HEAD].copy_from_slice(&(json.len() as u32).to_le_bytes());
    let n = lz4_flex::block::compress_into(json, &mut out[HEAD..]).map_err(zerror)?;
    out.truncate(HEAD + n);
    Ok(out)
}

/// An LZ4 block with its size first back to the bytes it holds.
fn unlz4(packed: &[u8]) -> Result<Vec<u8>, CodecError> {
    let (size, block) = lz4_flex::block::uncompressed_size(packed).map_err(zerror)?;
    // LZ4 expands at most 255-fold: a larger size is corruption, not worth allocating for.
    if size > block.len().saturating_mul(255) {
        return Err(zerror(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "LZ4 body claims {size} bytes from a {}-byte block",
                block.len()
            ),
        )));
    }
    let json = lz4_flex::block::decompress(block, size).map_err(zerror)?;
    if json.len() != size {
        return Err(zerror(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!(
                "LZ4 body holds {} bytes, not the {size} it claims",
                json.len()
            ),
        )));
    }
    Ok(json)
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

    #[test]
    fn lz4_bodies_round_trip_and_either_packing_reads_the_other() {
        let big = json!({"seq": 3, "type": "tool", "output": "echo me ".repeat(150)});
        let fast = encode_with(&big, Packing::Lz4).expect("encodes");
        assert_eq!(fast[0], 1, "packed with LZ4");
        assert!(fast.len() < 200, "{} bytes", fast.len());
        let small = encode(&big).expect("encodes");
        assert_eq!(small[0], 0, "deflated");
        // A store reads whatever was written before it changed its packing.
        assert_eq!(decode::<Value>(&fast).expect("decodes"), big);
        assert_eq!(decode::<Value>(&small).expect("decodes"), big);
        // Small values stay plain JSON whatever the packing.
        let tiny = json!({"seq": 1});
        assert_eq!(encode_with(&tiny, Packing::Lz4).expect("encodes")[0], b'{');
    }

    #[test]
    fn truncated_corrupt_or_oversized_lz4_bodies_are_errors() {
        let big = json!({"text": "word ".repeat(500)});
        let packed = encode_with(&big, Packing::Lz4).expect("encodes");
        for cut in [1, 3, 5, packed.len() / 2, packed.len() - 1] {
            assert!(decode::<Value>(&packed[..cut]).is_err(), "cut at {cut}");
        }
        // A size larger than the block could ever expand to is refused before allocating.
        let mut huge = packed.clone();
        huge[1..5].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode::<Value>(&huge).is_err());
        // A size that disagrees with the block.
        let mut short = packed.clone();
        let size = u32::from_le_bytes([packed[1], packed[2], packed[3], packed[4]]);
        short[1..5].copy_from_slice(&(size - 1).to_le_bytes());
        assert!(decode::<Value>(&short).is_err());
        assert_eq!(decode::<Value>(&packed).expect("decodes"), big);
    }
}
