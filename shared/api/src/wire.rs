//! JSON bodies for the errors hyper answers itself.
//!
//! A request hyper cannot parse (a malformed request line or header, a URI or headers too
//! long) never reaches a handler: hyper answers it with a bare status and an empty body,
//! then closes the connection. [`JsonListener`] gives those answers the API's JSON error
//! body, so that every error a client gets, however malformed its request, says what was
//! wrong. It recognises them by their form: a 4xx/5xx head with `content-length: 0` and
//! nothing after it, which no handler of this API sends (each error of theirs has a body).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use axum::serve::Listener;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// A TCP listener whose connections rewrite hyper's bare error answers into JSON ones.
pub struct JsonListener(pub TcpListener);

impl Listener for JsonListener {
    type Io = JsonErrors<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (io, addr) = Listener::accept(&mut self.0).await;
        (JsonErrors::new(io), addr)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

/// A connection that writes a JSON error in place of hyper's bare one.
pub struct JsonErrors<S> {
    inner: S,
    /// The replacement being written, how much of it is written, and how many bytes of
    /// the caller's buffer it stands for.
    replacing: Option<(Vec<u8>, usize, usize)>,
}

impl<S> JsonErrors<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            replacing: None,
        }
    }
}

/// The JSON answer for `head` when it is one of hyper's own bare error answers.
fn replacement(head: &[u8]) -> Option<Vec<u8>> {
    let rest = head.strip_prefix(b"HTTP/1.1 ")?;
    let status = std::str::from_utf8(rest.get(..3)?).ok()?;
    let (code, message) = match status {
        "400" => ("malformed_request", "The request is not valid HTTP/1.1."),
        "414" => ("uri_too_long", "The request's URI is too long."),
        "431" => ("headers_too_large", "The request's headers are too large."),
        "505" => (
            "http_version_not_supported",
            "Only HTTP/1.1 (and HTTP/1.0) are served.",
        ),
        _ => return None,
    };
    let end = head.windows(4).position(|w| w == b"\r\n\r\n")?;
    let empty = head[..end + 2]
        .to_ascii_lowercase()
        .windows(20)
        .any(|w| w == b"\r\ncontent-length: 0\r");
    if end + 4 != head.len() || !empty {
        return None;
    }
    let reason = std::str::from_utf8(&rest[3..rest.iter().position(|b| *b == b'\r')?])
        .ok()?
        .trim();
    let body = crate::error::ErrorBody::new(code, message).to_json();
    Some(
        format!(
            "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )
}

impl<S: AsyncRead + Unpin> AsyncRead for JsonErrors<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for JsonErrors<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.replacing.is_none() {
            match replacement(buf) {
                Some(answer) => this.replacing = Some((answer, 0, buf.len())),
                None => return Pin::new(&mut this.inner).poll_write(cx, buf),
            }
        }
        // Hyper calls again with the same bytes until they are reported written.
        while let Some((answer, written, _)) = this.replacing.as_mut()
            && *written < answer.len()
        {
            let n = ready!(Pin::new(&mut this.inner).poll_write(cx, &answer[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
        let stands_for = this.replacing.take().map_or(0, |(_, _, len)| len);
        Poll::Ready(Ok(stands_for))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_hypers_bare_error_answers_are_replaced() {
        let bare = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: Sun, 22 Nov 2026 12:00:00 GMT\r\n\r\n";
        let json = String::from_utf8(replacement(bare).expect("replaced")).expect("utf8");
        assert!(json.starts_with("HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"));
        assert!(json.ends_with(
            r#"{"error":{"code":"malformed_request","message":"The request is not valid HTTP/1.1."}}"#
        ));
        let too_long = b"HTTP/1.1 414 URI Too Long\r\ncontent-length: 0\r\n\r\n";
        assert!(replacement(too_long).is_some());
        // A handler's answers have bodies, or are not errors: left alone.
        for kept in [
            &b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 52\r\n\r\n"[..],
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n{}",
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0",
            b"not http at all",
        ] {
            assert!(replacement(kept).is_none(), "{}", String::from_utf8_lossy(kept));
        }
    }
}
