//! [`SmtpMailer`]: how `baton dev` sends questions' e-mail, through the SMTP server at
//! `BATON_SMTP_URL` (lettre's transport: `smtp://` with STARTTLS when the server offers it,
//! `smtps://` for TLS from the start, credentials in the URL's user and password).

use std::time::Duration;

use lettre::message::header::{ContentType, Header, HeaderName, HeaderValue};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use baton_core::ports::{Mail, Mailer};

/// The longest one message may take, connecting included.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends each message through one SMTP server.
pub struct SmtpMailer {
    transport: AsyncSmtpTransport<Tokio1Executor>,
}

impl SmtpMailer {
    /// A mailer for the server at `url`; an error names what is wrong with the URL (never
    /// the URL, which may hold a password).
    pub fn new(url: &str) -> Result<Self, String> {
        let transport = AsyncSmtpTransport::<Tokio1Executor>::from_url(url)
            .map_err(|e| format!("BATON_SMTP_URL: {e}"))?
            .timeout(Some(SEND_TIMEOUT))
            .build();
        Ok(Self { transport })
    }
}

/// `X-Baton-Delivery`: the delivery a message is (a recipient's filter can deduplicate on it).
#[derive(Clone)]
struct DeliveryHeader(String);

impl Header for DeliveryHeader {
    fn name() -> HeaderName {
        HeaderName::new_from_ascii_str("X-Baton-Delivery")
    }

    fn parse(s: &str) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        Ok(Self(s.to_owned()))
    }

    fn display(&self) -> HeaderValue {
        HeaderValue::new(Self::name(), self.0.clone())
    }
}

#[async_trait::async_trait]
impl Mailer for SmtpMailer {
    async fn send(&self, mail: &Mail) -> Result<String, String> {
        let address = |a: &str| {
            a.parse::<lettre::message::Mailbox>()
                .map_err(|e| format!("`{a}`: {e}"))
        };
        let message = Message::builder()
            .from(address(&mail.from)?)
            .to(address(&mail.to)?)
            .subject(&mail.subject)
            .header(ContentType::TEXT_PLAIN)
            .header(DeliveryHeader(mail.delivery_id.clone()))
            .body(mail.text.clone())
            .map_err(|e| e.to_string())?;
        let reply = self
            .transport
            .send(message)
            .await
            .map_err(|e| format!("the SMTP server: {e}"))?;
        Ok(format!(
            "{} {}",
            reply.code(),
            reply.first_line().unwrap_or_default()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mail() -> Mail {
        Mail {
            from: "baton@example.com".into(),
            to: "ops@example.com".into(),
            subject: "Ship it?".into(),
            text: "Ship it?".into(),
            delivery_id: "asked:mail:group:ops".into(),
        }
    }

    /// A server that speaks no TLS where TLS is asked for is a failed delivery, said in a
    /// line (the TLS stack is set up, and nothing panics).
    #[tokio::test]
    async fn a_server_without_tls_is_a_failed_delivery_over_smtps() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            while let Ok((mut s, _)) = listener.accept().await {
                let _ = s.write_all(b"220 plain text, no TLS here\r\n").await;
            }
        });
        let mailer = SmtpMailer::new(&format!("smtps://127.0.0.1:{port}")).unwrap();
        let e = mailer.send(&mail()).await.unwrap_err();
        assert!(e.starts_with("the SMTP server: "), "{e}");
    }

    #[test]
    fn a_url_that_is_not_smtp_is_refused_without_saying_it() {
        let e = SmtpMailer::new("smtp://user:s3cret@[bad").err().unwrap();
        assert!(
            e.starts_with("BATON_SMTP_URL: ") && !e.contains("s3cret"),
            "{e}"
        );
    }
}
