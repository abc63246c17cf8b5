//! Pages of a listing as the API serves them: cut to a count and to Lambda's reply size,
//! with an opaque cursor to the next.

use super::{ServiceError, enveloped_len};

/// Cuts a page, read with one more item than `limit` asks, to `limit` items and to
/// `max_bytes` of them as Lambda's reply counts them (but always one); returns the cursor
/// of the next page (the last item's position) when more follow.
pub(super) fn cut_page<T: serde::Serialize, P: serde::Serialize>(
    items: &mut Vec<T>,
    limit: usize,
    max_bytes: usize,
    position: impl Fn(&T) -> P,
) -> Option<String> {
    let mut more = items.len() > limit;
    items.truncate(limit);
    let mut bytes = 0;
    if let Some(fit) = items.iter().position(|item| {
        bytes += serde_json::to_vec(item).map_or(0, |b| enveloped_len(&b));
        bytes > max_bytes
    }) {
        more = true;
        items.truncate(fit.max(1));
    }
    match items.last() {
        Some(last) if more => Some(encode_cursor(&position(last))),
        _ => None,
    }
}

/// A page's cursor as the API shows it: opaque, URL-safe.
pub(super) fn encode_cursor(position: &impl serde::Serialize) -> String {
    use base64::Engine;
    let json = serde_json::to_vec(position).unwrap_or_default();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
}

/// A cursor no page gave names no page: 404, as an unknown id would.
pub(super) fn decode_cursor<T: serde::de::DeserializeOwned>(
    cursor: &str,
    what: &str,
) -> Result<T, ServiceError> {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(cursor)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| {
            ServiceError::NotFound(format!(
                "`cursor` names no page of {what}: pass a page's `nextCursor`"
            ))
        })
}
