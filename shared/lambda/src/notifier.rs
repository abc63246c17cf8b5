//! [`HttpNotifier`]: how every host sends a question's notifications (a webhook's JSON,
//! Slack's incoming-webhook messages): one `POST` with `reqwest`, bounded in time, no
//! redirect followed (a receiver that moved is a failed delivery, tried again, not a hop to
//! wherever it points).

use std::time::Duration;

use baton_core::ports::Notifier;

/// The longest one delivery may take, connecting included.
pub const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends notifications over HTTP(S).
#[derive(Debug, Clone)]
pub struct HttpNotifier {
    http: reqwest::Client,
}

impl HttpNotifier {
    pub fn new() -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .timeout(DELIVERY_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(Self { http })
    }
}

#[async_trait::async_trait]
impl Notifier for HttpNotifier {
    async fn post(
        &self,
        url: &str,
        headers: &[(String, String)],
        body: Vec<u8>,
    ) -> Result<u16, String> {
        let mut request = self.http.post(url).body(body);
        for (k, v) in headers {
            request = request.header(k, v);
        }
        let response = request.send().await.map_err(|e| {
            // The URL may hold a secret (a Slack webhook's does): never said.
            let e = e.without_url();
            format!("no answer: {e}")
        })?;
        let status = response.status();
        if status.is_success() {
            Ok(status.as_u16())
        } else {
            Err(format!("the receiver answered {status}"))
        }
    }
}
