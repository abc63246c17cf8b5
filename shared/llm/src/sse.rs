//! Server-Sent Events as model providers stream them (the OpenAI-compatible API, Anthropic's
//! Messages API) and Baton's own API does (`GET /runs/{id}/stream`, which `baton watch`
//! reads): bytes in as they arrive, whole events out.

/// One event: its `event:` name, if any, and its `data:` lines joined by newlines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub event: Option<String>,
    pub data: String,
}

/// Splits a byte stream into events (the WHATWG event-stream format: `field: value` lines,
/// an event ending at a blank line, `:` comments, `\n`, `\r\n` or `\r` line ends).
#[derive(Debug, Default)]
pub struct SseReader {
    line: Vec<u8>,
    /// The previous byte was a `\r` (a `\n` right after it ends nothing more).
    after_cr: bool,
    event: Option<String>,
    data: Option<String>,
}

impl SseReader {
    /// The events `bytes` complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        let mut out = Vec::new();
        for &b in bytes {
            if b == b'\n' && self.after_cr {
                self.after_cr = false;
                continue;
            }
            self.after_cr = b == b'\r';
            if b == b'\n' || b == b'\r' {
                let line = std::mem::take(&mut self.line);
                if let Some(e) = self.line_done(&line) {
                    out.push(e);
                }
            } else {
                self.line.push(b);
            }
        }
        out
    }

    /// The event the stream's end completes, if its last blank line never came.
    pub fn finish(&mut self) -> Option<SseEvent> {
        let line = std::mem::take(&mut self.line);
        let last = if line.is_empty() {
            None
        } else {
            self.line_done(&line)
        };
        last.or_else(|| self.line_done(b""))
    }

    fn line_done(&mut self, line: &[u8]) -> Option<SseEvent> {
        if line.is_empty() {
            let event = self.event.take();
            return self.data.take().map(|data| SseEvent { event, data });
        }
        let line = String::from_utf8_lossy(line);
        let (field, value) = match line.split_once(':') {
            Some(("", _)) => return None, // a comment
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line.as_ref(), ""),
        };
        match field {
            "data" => match &mut self.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            },
            "event" => self.event = Some(value.to_owned()),
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut r = SseReader::default();
        let mut out: Vec<SseEvent> = chunks.iter().flat_map(|c| r.push(c)).collect();
        out.extend(r.finish());
        out
    }

    fn ev(event: Option<&str>, data: &str) -> SseEvent {
        SseEvent {
            event: event.map(str::to_owned),
            data: data.to_owned(),
        }
    }

    #[test]
    fn events_split_anywhere_come_out_whole() {
        let stream = b"data: {\"a\":1}\n\n: keep-alive\n\nevent: message_delta\ndata: x\ndata:y\n\ndata: [DONE]\n\n";
        let whole = all(&[stream]);
        assert_eq!(
            whole,
            vec![
                ev(None, "{\"a\":1}"),
                ev(Some("message_delta"), "x\ny"),
                ev(None, "[DONE]")
            ]
        );
        // Byte by byte, the same events.
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(all(&bytes), whole);
    }

    #[test]
    fn crlf_and_cr_line_ends_and_an_unterminated_last_event() {
        assert_eq!(
            all(&[b"data: a\r\n\r", b"\ndata: b\r\rdata: c"]),
            vec![ev(None, "a"), ev(None, "b"), ev(None, "c")]
        );
        assert_eq!(all(&[b"event: ping\n\n"]), vec![]);
    }
}
