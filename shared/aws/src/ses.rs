//! `SesMailer`: a question's e-mail through SES (`SendEmail`), from the channel's `from`
//! (an identity verified in SES). The delivery it is closes its text (SES's simple
//! messages carry no header of the sender's own).

use aws_sdk_ses::Client;
use aws_sdk_ses::error::DisplayErrorContext;
use aws_sdk_ses::types::{Body, Content, Destination, Message};

use baton_core::ports::{Mail, Mailer};

pub struct SesMailer {
    client: Client,
}

impl SesMailer {
    pub fn new(sdk: &aws_config::SdkConfig) -> Self {
        Self {
            client: Client::new(sdk),
        }
    }
}

/// A part of a message, in UTF-8.
fn utf8(data: &str) -> Result<Content, String> {
    Content::builder()
        .data(data)
        .charset("UTF-8")
        .build()
        .map_err(|e| e.to_string())
}

#[async_trait::async_trait]
impl Mailer for SesMailer {
    async fn send(&self, mail: &Mail) -> Result<String, String> {
        let message = Message::builder()
            .subject(utf8(&mail.subject)?)
            .body(Body::builder().text(utf8(&mail.text)?).build())
            .build();
        let sent = self
            .client
            .send_email()
            .source(&mail.from)
            .destination(Destination::builder().to_addresses(&mail.to).build())
            .message(message)
            .send()
            .await
            .map_err(|e| format!("SES refused it: {}", DisplayErrorContext(&e)))?;
        Ok(format!("SES message {}", sent.message_id()))
    }
}
