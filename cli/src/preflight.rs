//! `baton preflight`: before a deploy, whether the account can run the stack as the template
//! and its parameters ask. A new account's Lambda concurrency is far below the 1,000 of an
//! established one; the event source mappings may each start up to their
//! `MaximumConcurrency` invocations, and an invocation Lambda throttles leaves its SQS batch
//! in flight for the queue's 90-minute visibility timeout, spending receives. So: the sum the
//! mappings may run at once, against the account's `GetAccountSettings`; the reserved
//! concurrency asked, against what Lambda lets an account reserve; and the stack's name,
//! against the longest resource name it makes; and when an agent thinks with Bedrock, the
//! model's per-minute quotas (`preflight_bedrock.rs`).

use std::collections::HashMap;

use anyhow::Context;

use baton_dev::functions::Functions;

/// What Lambda keeps unreserved in every account, whatever is reserved.
const MIN_UNRESERVED: i64 = 100;
/// The longest name the stack derives from its own: `<stack>-subagent-steps-dlq.fifo`, of at
/// most 80 characters (SQS's limit).
const LONGEST_SUFFIX: &str = "-subagent-steps-dlq.fifo";
const MAX_QUEUE_NAME: usize = 80;
/// The functions `ReservedConcurrency` reserves for.
const STEP_FUNCTIONS: [&str; 2] = ["OrchestratorFunction", "SubagentFunction"];

/// What preflight found: its report, and whether the stack fits.
pub struct Report {
    pub lines: Vec<String>,
    pub fits: bool,
}

/// Parses `K=V` parameter overrides.
pub fn overrides(pairs: &[String]) -> Result<HashMap<String, String>, String> {
    pairs
        .iter()
        .map(|p| match p.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
            _ => Err(format!("{p:?}: a parameter override is Name=Value")),
        })
        .collect()
}

/// Checks `template` (with `params`) for a stack named `stack` against the account that
/// `sdk` reaches.
pub async fn check(
    sdk: &aws_config::SdkConfig,
    template: &str,
    params: &HashMap<String, String>,
    stack: &str,
) -> anyhow::Result<Report> {
    let functions = Functions::parse_with(template, params)?;
    let mut lines = Vec::new();
    let mut fits = true;
    let longest = stack.len() + LONGEST_SUFFIX.len();
    if longest > MAX_QUEUE_NAME {
        fits = false;
        lines.push(format!(
            "NO   stack name `{stack}` is {} characters: its queue `{stack}{LONGEST_SUFFIX}` \
             would be {longest}, past SQS's {MAX_QUEUE_NAME}; use a name of at most {}",
            stack.len(),
            MAX_QUEUE_NAME - LONGEST_SUFFIX.len()
        ));
    } else {
        lines.push(format!(
            "ok   stack name `{stack}`: its longest queue name is {longest} characters"
        ));
    }

    let settings = aws_sdk_lambda::Client::new(sdk)
        .get_account_settings()
        .send()
        .await
        .map_err(|e| baton_aws::sdk::map_sdk_err("GetAccountSettings", e))
        .context("reading the account's Lambda settings")?;
    let limit = settings.account_limit();
    let total = limit.map_or(0, |l| i64::from(l.concurrent_executions()));
    let unreserved = limit
        .and_then(|l| l.unreserved_concurrent_executions())
        .map_or(total, i64::from);
    let region = sdk.region().map_or("?".to_owned(), |r| r.to_string());
    lines.push(format!(
        "     the account ({region}): {total} concurrent executions, {unreserved} not reserved"
    ));

    let asked = functions.mapped_concurrency();
    let mapped: usize = asked.values().sum();
    for (name, n) in &asked {
        lines.push(format!("     {name:22} its mappings may run {n:4} at once"));
    }
    let reserved: i64 = params
        .get("ReservedConcurrency")
        .map(|v| v.parse::<i64>())
        .transpose()
        .map_err(|_| anyhow::anyhow!("ReservedConcurrency is no number"))?
        .unwrap_or(0);
    let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    // What runs in the account's unreserved pool: every mapping, unless the step functions
    // have their own reservation.
    let (mut shared, mut pool) = (count(mapped), unreserved);
    if reserved > 0 {
        for f in STEP_FUNCTIONS {
            let want = count(asked.get(f).copied().unwrap_or(0));
            shared -= want;
            if want > reserved {
                fits = false;
                lines.push(format!(
                    "NO   {f}'s mappings may run {want} at once, and ReservedConcurrency={reserved}                      caps it below that: give it at least {want}"
                ));
            }
        }
        pool -= STEP_FUNCTIONS.len() as i64 * reserved;
        if pool < MIN_UNRESERVED {
            fits = false;
            lines.push(format!(
                "NO   ReservedConcurrency={reserved} reserves {} for the step functions, and                  Lambda keeps {MIN_UNRESERVED} of the account's {unreserved} unreserved: lower it                  to at most {}, or ask for a higher quota (Service Quotas, Lambda, Concurrent                  executions)",
                STEP_FUNCTIONS.len() as i64 * reserved,
                ((unreserved - MIN_UNRESERVED) / STEP_FUNCTIONS.len() as i64).max(0)
            ));
        }
    }
    if shared > pool {
        fits = false;
        let s = params.get("StepsMaxConcurrency").map_or_else(
            || "StepsMaxConcurrency at its default".to_owned(),
            |v| format!("StepsMaxConcurrency={v}"),
        );
        lines.push(format!(
            "NO   the mappings may run {shared} invocations at once ({s}) in \
             the account's {pool} unreserved, beside the api and live functions' own: past \
             that Lambda throttles them, and a throttled batch waits out its queue's 90-minute \
             visibility timeout. Ask for a higher quota (Service Quotas, Lambda, Concurrent \
             executions), or lower StepsMaxConcurrency"
        ));
    } else {
        lines.push(format!(
            "ok   the mappings may run {shared} invocations at once in the account's {pool} \
             unreserved ({} left for the api and live functions)",
            pool - shared
        ));
    }
    let param = |name: &str| Functions::parameter(template, params, name).unwrap_or_default();
    if param("Model").starts_with("bedrock:") || param("AgentsJson").contains("bedrock:") {
        let id = param("BedrockModelId");
        let thinking = STEP_FUNCTIONS
            .iter()
            .map(|f| asked.get(*f).copied().unwrap_or(0))
            .sum();
        let client = aws_sdk_servicequotas::Client::new(sdk);
        match crate::preflight_bedrock::quotas(&client).await {
            Ok(quotas) => {
                let (ok, found) = crate::preflight_bedrock::judge(&quotas, &id, thinking);
                fits &= ok;
                lines.extend(found);
            }
            Err(e) => lines.push(format!(
                "?    Bedrock's quotas could not be read ({e}): look `{id}`'s per-minute \
                 quotas up in Service Quotas"
            )),
        }
    } else {
        lines.push(
            "     Bedrock: no agent thinks with it (Model, AgentsJson): its quotas not read".into(),
        );
    }
    Ok(Report { lines, fits })
}
