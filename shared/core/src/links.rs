//! One-time answer links: a URL that opens one CTA's form without signing in, answers it
//! once, and never past its expiry.
//!
//! The token is `<payload>.<mac>`, both base64url: the payload is `<ctaId>.<nonce>.<expiry
//! in unix seconds>`, the MAC an HMAC-SHA256 of it under the deployment's link key. The nonce
//! is stored with the CTA, so a token names that CTA record and no other; the expiry is the
//! CTA's own. The service checks the CTA as it stands (pending, same nonce) on every use,
//! and the CTA's conditional write makes the first answer the only one.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use chrono::{DateTime, Utc};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The shortest link key accepted, in bytes.
pub const MIN_KEY_BYTES: usize = 32;

/// Signs and checks link tokens, and makes their URLs.
#[derive(Clone)]
pub struct Links {
    key: Vec<u8>,
    /// Where the console is reached, e.g. `https://api.example.com` (no trailing slash).
    pub base_url: String,
}

impl std::fmt::Debug for Links {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Links")
            .field("base_url", &self.base_url)
            .finish_non_exhaustive()
    }
}

/// What a valid token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    pub cta_id: String,
    pub nonce: String,
    pub expires_at: i64,
    /// Whom it was minted for (its answer is theirs); none on a link minted before links
    /// named one.
    pub recipient: Option<String>,
}

/// Why a token is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    #[error("this link is not valid")]
    Invalid,
    #[error("this link has expired")]
    Expired,
}

/// A link key too short to sign with: its length in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the link key must be at least {MIN_KEY_BYTES} bytes; it is {0}")]
pub struct ShortKey(pub usize);

impl Links {
    /// A signer with `key` (at least [`MIN_KEY_BYTES`]), for links under `base_url`.
    pub fn new(key: &[u8], base_url: &str) -> Result<Self, ShortKey> {
        if key.len() < MIN_KEY_BYTES {
            return Err(ShortKey(key.len()));
        }
        Ok(Self {
            key: key.to_vec(),
            base_url: base_url.trim_end_matches('/').to_owned(),
        })
    }

    fn mac(&self, payload: &[u8]) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        mac.update(payload);
        mac
    }

    pub fn token(&self, cta_id: &str, nonce: &str, expires_at: DateTime<Utc>) -> String {
        self.sign(format!("{cta_id}.{nonce}.{}", expires_at.timestamp()))
    }

    /// A token minted for `recipient`: its answer is recorded as theirs.
    pub fn token_for(
        &self,
        cta_id: &str,
        nonce: &str,
        expires_at: DateTime<Utc>,
        recipient: &str,
    ) -> String {
        self.sign(format!(
            "{cta_id}.{nonce}.{}.{}",
            expires_at.timestamp(),
            B64.encode(recipient)
        ))
    }

    fn sign(&self, payload: String) -> String {
        let tag = self.mac(payload.as_bytes()).finalize().into_bytes();
        format!("{}.{}", B64.encode(payload), B64.encode(tag))
    }

    /// The console page of a token.
    pub fn url(&self, token: &str) -> String {
        format!("{}/console#/link/{token}", self.base_url)
    }

    /// Checks a token's MAC (in constant time) and expiry at `now`.
    pub fn verify(&self, token: &str, now: DateTime<Utc>) -> Result<Claims, LinkError> {
        let (payload, tag) = token.split_once('.').ok_or(LinkError::Invalid)?;
        let payload = B64.decode(payload).map_err(|_| LinkError::Invalid)?;
        let tag = B64.decode(tag).map_err(|_| LinkError::Invalid)?;
        self.mac(&payload)
            .verify_slice(&tag)
            .map_err(|_| LinkError::Invalid)?;
        let text = String::from_utf8(payload).map_err(|_| LinkError::Invalid)?;
        let mut parts = text.splitn(4, '.');
        let (Some(cta_id), Some(nonce), Some(exp)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(LinkError::Invalid);
        };
        let recipient = parts
            .next()
            .map(|r| {
                B64.decode(r)
                    .ok()
                    .and_then(|r| String::from_utf8(r).ok())
                    .ok_or(LinkError::Invalid)
            })
            .transpose()?;
        let expires_at: i64 = exp.parse().map_err(|_| LinkError::Invalid)?;
        if now.timestamp() >= expires_at {
            return Err(LinkError::Expired);
        }
        Ok(Claims {
            cta_id: cta_id.into(),
            nonce: nonce.into(),
            expires_at,
            recipient,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_answers_for_its_cta_until_its_expiry_and_any_change_breaks_it() {
        let links = Links::new(&[7; 32], "http://127.0.0.1:8787/").expect("key");
        let now = DateTime::from_timestamp(1_700_000_000, 0).expect("time");
        let exp = now + chrono::Duration::hours(1);
        let t = links.token("cta_1", "lnk_a", exp);
        assert_eq!(
            links.verify(&t, now),
            Ok(Claims {
                cta_id: "cta_1".into(),
                nonce: "lnk_a".into(),
                expires_at: exp.timestamp(),
                recipient: None,
            })
        );
        // A link minted for someone says whom, under the same MAC.
        let theirs = links.token_for("cta_1", "lnk_a", exp, "user#alice");
        let claims = links.verify(&theirs, now).expect("valid");
        assert_eq!(claims.recipient.as_deref(), Some("user#alice"));
        let (payload, tag) = theirs.split_once('.').expect("two parts");
        let mut text = String::from_utf8(B64.decode(payload).expect("b64")).expect("utf-8");
        text.push('x');
        let forged = format!("{}.{tag}", B64.encode(text));
        assert_eq!(links.verify(&forged, now), Err(LinkError::Invalid));
        assert!(
            links
                .url(&t)
                .starts_with("http://127.0.0.1:8787/console#/link/")
        );
        assert_eq!(links.verify(&t, exp), Err(LinkError::Expired));
        // Another CTA's payload under this MAC, another key, a cut token: refused.
        let (_, tag) = t.split_once('.').expect("two parts");
        let forged = format!(
            "{}.{tag}",
            B64.encode(format!("cta_2.lnk_a.{}", exp.timestamp()))
        );
        assert_eq!(links.verify(&forged, now), Err(LinkError::Invalid));
        let other = Links::new(&[8; 32], "http://x").expect("key");
        assert_eq!(other.verify(&t, now), Err(LinkError::Invalid));
        assert_eq!(
            links.verify(&t[..t.len() - 2], now),
            Err(LinkError::Invalid)
        );
        assert_eq!(links.verify("nonsense", now), Err(LinkError::Invalid));
        assert!(Links::new(b"short", "http://x").is_err());
    }
}
