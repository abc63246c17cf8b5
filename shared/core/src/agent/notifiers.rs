//! The agents file's `notifiers`, checked at start-up: each channel's settings (an `http(s)`
//! URL, a webhook's secret, an e-mail channel's sender and address book), and each agent's
//! channels against them.

use std::collections::BTreeMap;

use super::{AgentDef, CatalogError};
use crate::agents_file::{NotifierKind, NotifierSpec, expand};

/// The file's `notifiers`, `${VAR}` expanded from the environment and checked.
pub(super) fn checked(
    specs: &BTreeMap<String, NotifierSpec>,
) -> Result<BTreeMap<String, NotifierSpec>, CatalogError> {
    let env = |k: &str| std::env::var(k).ok();
    let mut out = BTreeMap::new();
    for (name, spec) in specs {
        let bad = |message: String| CatalogError::Notifier {
            notifier: name.clone(),
            message,
        };
        let expanded = |v: &Option<String>| {
            v.as_deref()
                .map(|s| expand(s, &env))
                .transpose()
                .map_err(bad)
        };
        let (url, secret, from) = (
            expanded(&spec.url)?,
            expanded(&spec.secret)?,
            expanded(&spec.from)?,
        );
        match spec.kind {
            NotifierKind::Webhook | NotifierKind::Slack => {
                let Some(url) = &url else {
                    return Err(bad("needs a `url`".into()));
                };
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(bad(format!("`url` must be http(s): `{url}`")));
                }
                if from.is_some() || !spec.to.is_empty() {
                    return Err(bad("`from` and `to` are an e-mail channel's".into()));
                }
            }
            NotifierKind::Email => {
                if url.is_some() || secret.is_some() {
                    return Err(bad(
                        "an e-mail channel takes `from` and `to`, no `url` or `secret`".into(),
                    ));
                }
                let Some(from) = &from else {
                    return Err(bad("an e-mail channel needs a `from` address".into()));
                };
                check_address(from).map_err(|m| bad(format!("`from`: {m}")))?;
                if spec.to.is_empty() {
                    return Err(bad(
                        "an e-mail channel needs `to`: each recipient's address".into(),
                    ));
                }
                for (who, address) in &spec.to {
                    baton_engine::cta::check_principal(who)
                        .and_then(|()| check_address(address))
                        .map_err(|m| bad(format!("`to`: {m}")))?;
                }
            }
        }
        match (spec.kind, &secret) {
            (NotifierKind::Webhook, None) => {
                return Err(bad(
                    "a webhook needs a `secret` to sign its deliveries with".into(),
                ));
            }
            (NotifierKind::Webhook, Some(s)) if s.len() < 16 => {
                return Err(bad("`secret` must be at least 16 characters".into()));
            }
            (NotifierKind::Slack, Some(_)) => {
                return Err(bad(
                    "a Slack incoming webhook takes no `secret` (its URL is one)".into(),
                ));
            }
            _ => {}
        }
        let spec = NotifierSpec {
            kind: spec.kind,
            url,
            secret,
            from,
            to: spec.to.clone(),
        };
        out.insert(name.clone(), spec);
    }
    Ok(out)
}

/// A bare address, `local@domain`: no display name, no list, nothing a header could be
/// split on.
fn check_address(address: &str) -> Result<(), String> {
    let ok = match address.split_once('@') {
        Some((local, domain)) => {
            !local.is_empty()
                && domain.contains('.')
                && !domain.starts_with('.')
                && !domain.ends_with('.')
                && !domain.contains('@')
                && address.len() <= 254
                && !address
                    .chars()
                    .any(|c| c.is_whitespace() || c.is_control() || "<>,;:\"()[]\\".contains(c))
        }
        None => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("`{address}` is not an e-mail address"))
    }
}

/// Each agent's channels (its questions' and its tools' approvals') are among `notifiers`,
/// and an e-mail channel has an address for everyone it may be asked to tell: each assignee
/// and each escalation's.
pub(super) fn check_agent(
    a: &AgentDef,
    notifiers: &BTreeMap<String, NotifierSpec>,
) -> Result<(), CatalogError> {
    let invalid = |message: String| CatalogError::Invalid {
        agent: a.name.clone(),
        message,
    };
    let policies = a
        .approval
        .values()
        .filter_map(|p| p.assignment.as_ref())
        .chain([&a.questions]);
    for q in policies {
        for channel in &q.notify {
            let Some(spec) = notifiers.get(channel) else {
                return Err(invalid(format!(
                    "`questions.notify` names `{channel}`, which is not one of the file's \
                     `notifiers` ({})",
                    notifiers.keys().cloned().collect::<Vec<_>>().join(", ")
                )));
            };
            if spec.kind != NotifierKind::Email {
                continue;
            }
            let missing: Vec<&str> = q
                .assignees
                .iter()
                .chain(&q.escalate_to)
                .filter(|who| !spec.to.contains_key(*who))
                .map(String::as_str)
                .collect();
            if q.assignees.is_empty() {
                return Err(invalid(format!(
                    "e-mail channel `{channel}` tells assignees, and these questions have \
                     none (their run's owner has no address in `to`)"
                )));
            }
            if !missing.is_empty() {
                return Err(invalid(format!(
                    "e-mail channel `{channel}` has no address in `to` for {}",
                    missing.join(", ")
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_address;

    #[test]
    fn an_address_is_bare_and_cannot_split_a_header() {
        for good in ["ops@example.com", "a.b+c@mail.example.org"] {
            assert_eq!(check_address(good), Ok(()), "{good}");
        }
        for bad in [
            "ops",
            "@example.com",
            "ops@localhost",
            "Ops <ops@example.com>",
            "a@example.com, b@example.com",
            "ops@example.com\r\nBcc: x@example.com",
            "ops@@example.com",
            "ops@example.com.",
        ] {
            assert!(check_address(bad).is_err(), "{bad:?}");
        }
    }
}
