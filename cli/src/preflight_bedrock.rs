//! `baton preflight`'s Bedrock check: the model's per-minute quotas (Service Quotas, service
//! `bedrock`) against how many steps the stack may have thinking at once. A new account's
//! quotas can be a small share of the defaults; past them Bedrock throttles every run alike.

use aws_sdk_servicequotas::types::ServiceQuota;

/// The fewest tokens a minute one think may need: one call with a modest context.
pub const MIN_TOKENS_PER_THINK: f64 = 4_000.0;

/// How Service Quotas names a model's quotas: the scope (an inference profile's
/// `cross-region`, a foundation model's `on-demand`) and the model's words (`Claude Haiku
/// 4.5` for `…anthropic.claude-haiku-4-5-20251001-v1:0`), lowercased.
#[derive(Debug, PartialEq)]
pub struct QuotaKey {
    pub scope: &'static str,
    pub words: Vec<String>,
}

/// The key of `model_id` (a foundation model or an inference profile id).
pub fn quota_key(model_id: &str) -> Option<QuotaKey> {
    let parts: Vec<&str> = model_id.split(':').next()?.split('.').collect();
    let (scope, model) = match parts.as_slice() {
        [_profile, _vendor, model] => ("cross-region", *model),
        [_vendor, model] => ("on-demand", *model),
        _ => return None,
    };
    let mut words: Vec<String> = Vec::new();
    for w in model.split('-') {
        let digits = !w.is_empty() && w.bytes().all(|b| b.is_ascii_digit());
        let version =
            w.len() > 1 && w.starts_with('v') && w[1..].bytes().all(|b| b.is_ascii_digit());
        // A release date (20251001) and an API version (v1) name no quota.
        if (digits && w.len() == 8) || version {
            continue;
        }
        // `4-5` is the model's 4.5.
        match words.last_mut() {
            Some(last) if digits && last.bytes().all(|b| b.is_ascii_digit() || b == b'.') => {
                last.push('.');
                last.push_str(w);
            }
            _ => words.push(w.to_ascii_lowercase()),
        }
    }
    (!words.is_empty()).then_some(QuotaKey { scope, words })
}

/// The quota of `key` measured in `per` (`tokens per minute`, `requests per minute`)
/// among `quotas`: the shortest name that has the scope and each of the model's words.
pub fn find<'a>(quotas: &'a [ServiceQuota], key: &QuotaKey, per: &str) -> Option<&'a ServiceQuota> {
    quotas
        .iter()
        .filter(|q| {
            let name = q.quota_name().unwrap_or_default().to_ascii_lowercase();
            let words: Vec<&str> = name
                .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
                .collect();
            name.contains(per)
                && name.contains(key.scope)
                && key.words.iter().all(|w| words.contains(&w.as_str()))
        })
        .min_by_key(|q| q.quota_name().map_or(usize::MAX, str::len))
}

/// Bedrock's quotas, as applied to the account where it has its own, else the defaults.
pub async fn quotas(client: &aws_sdk_servicequotas::Client) -> Result<Vec<ServiceQuota>, String> {
    let applied: Vec<ServiceQuota> = client
        .list_service_quotas()
        .service_code("bedrock")
        .into_paginator()
        .items()
        .send()
        .collect::<Result<_, _>>()
        .await
        .map_err(|e| baton_aws::sdk::map_sdk_err("ListServiceQuotas", e).to_string())?;
    let defaults: Vec<ServiceQuota> = client
        .list_aws_default_service_quotas()
        .service_code("bedrock")
        .into_paginator()
        .items()
        .send()
        .collect::<Result<_, _>>()
        .await
        .map_err(|e| baton_aws::sdk::map_sdk_err("ListAWSDefaultServiceQuotas", e).to_string())?;
    let mut all = applied;
    for d in defaults {
        if !all.iter().any(|q| q.quota_code() == d.quota_code()) {
            all.push(d);
        }
    }
    Ok(all)
}

/// Report lines (and whether the stack fits) for `model_id`'s quotas among `quotas`, with
/// `thinking` invocations of the step functions at once at most (each thinks for one step
/// at a time or more).
pub fn judge(quotas: &[ServiceQuota], model_id: &str, thinking: usize) -> (bool, Vec<String>) {
    let Some(key) = quota_key(model_id) else {
        return (
            true,
            vec![format!(
                "?    Bedrock model `{model_id}`: no quota name derives from it; look its per-minute quotas up in Service Quotas"
            )],
        );
    };
    let n = thinking.max(1) as f64;
    let mut lines = Vec::new();
    let mut fits = true;
    for (per, least, what) in [
        ("tokens per minute", MIN_TOKENS_PER_THINK, "tokens"),
        ("requests per minute", 1.0, "calls"),
    ] {
        let Some(q) = find(quotas, &key, per) else {
            if per == "tokens per minute" {
                lines.push(format!(
                    "?    Bedrock: no {per} quota of `{model_id}` ({} {}) found: is the model offered in this Region?",
                    key.scope,
                    key.words.join(" ")
                ));
            }
            continue;
        };
        let value = q.value().unwrap_or(0.0);
        let name = q.quota_name().unwrap_or_default();
        let code = q.quota_code().unwrap_or_default();
        let each = value / n;
        if each < least {
            fits = false;
            lines.push(format!(
                "NO   Bedrock `{name}` ({code}) is {value:.0}: with the step functions' {thinking} invocations thinking at once, each gets {each:.0} {what} a minute, under the {least:.0} one think needs; past it Bedrock throttles every run. Ask for more (Service Quotas, Amazon Bedrock, {code}), or lower StepsMaxConcurrency"
            ));
        } else {
            lines.push(format!(
                "ok   Bedrock `{name}` ({code}) is {value:.0}: {each:.0} {what} a minute for each of {thinking} invocations thinking at once"
            ));
        }
    }
    (fits, lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(name: &str, code: &str, value: f64) -> ServiceQuota {
        ServiceQuota::builder()
            .quota_name(name)
            .quota_code(code)
            .value(value)
            .build()
    }

    #[test]
    fn a_model_id_names_its_quotas() {
        let k = quota_key("global.anthropic.claude-haiku-4-5-20251001-v1:0").unwrap();
        assert_eq!(k.scope, "cross-region");
        assert_eq!(k.words, ["claude", "haiku", "4.5"]);
        let k = quota_key("anthropic.claude-3-haiku-20240307-v1:0").unwrap();
        assert_eq!(k.scope, "on-demand");
        assert_eq!(k.words, ["claude", "3", "haiku"]);
        assert_eq!(quota_key("nonsense"), None);
    }

    #[test]
    fn the_quota_of_the_scope_and_model_is_judged_against_the_steps_at_once() {
        let quotas = [
            quota(
                "On-demand InvokeModel tokens per minute for Anthropic Claude Haiku 4.5",
                "L-1",
                4e6,
            ),
            quota(
                "Cross-Region InvokeModel tokens per minute for Anthropic Claude Haiku 4.5",
                "L-2",
                400_000.0,
            ),
            quota(
                "Cross-Region InvokeModel tokens per minute for Anthropic Claude Sonnet 4.5",
                "L-3",
                9e6,
            ),
            quota(
                "Cross-Region InvokeModel requests per minute for Anthropic Claude Haiku 4.5",
                "L-4",
                200.0,
            ),
        ];
        let id = "us.anthropic.claude-haiku-4-5-20251001-v1:0";
        let (fits, lines) = judge(&quotas, id, 52);
        assert!(fits, "{lines:?}");
        assert!(
            lines[0].starts_with("ok") && lines[0].contains("(L-2)"),
            "{lines:?}"
        );
        assert!(lines[1].contains("(L-4)"), "{lines:?}");
        let (fits, lines) = judge(&quotas, id, 156);
        assert!(!fits, "{lines:?}");
        assert!(
            lines[0].starts_with("NO") && lines[0].contains("2564 tokens"),
            "{lines:?}"
        );
        // A model with no quota listed: said, not refused.
        let (fits, lines) = judge(&quotas, "us.meta.llama3-3-70b-instruct-v1:0", 10);
        assert!(fits && lines[0].starts_with('?'), "{lines:?}");
    }
}
