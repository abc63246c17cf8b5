//! What the agents file's `${VAR}`s become in the tools it configures: the environment's (or
//! the model secret's) at start-up, a run's (`${run.…}`) at each call, and headers built from
//! them. The HTTP tools and the MCP servers both expand their configuration here.

use std::collections::BTreeMap;

use baton_core::agents_file::expand;
use baton_core::scope::{RUN_VARS, Scope};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

/// `${VAR}` from `lookup`, leaving `${run.…}` for each run to fill.
pub fn expand_env(text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    expand(text, &|k| {
        if RUN_VARS.contains(&k) {
            Some(format!("${{{k}}}"))
        } else {
            lookup(k)
        }
    })
}

/// `${run.…}` from `scope` (what the environment filled in is left as it is).
pub fn expand_run(text: &str, scope: &Scope) -> Result<String, String> {
    expand(text, &|k| match RUN_VARS.contains(&k) {
        true => scope.var(k).map(str::to_owned),
        false => Some(format!("${{{k}}}")),
    })
    .map_err(|e| format!("{e} for this run"))
}

/// Header names and values, `${VAR}` expanded; a bad one is named.
pub fn headers(
    spec: &BTreeMap<String, String>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<HeaderMap, String> {
    let mut map = HeaderMap::new();
    for (k, v) in spec {
        let name = HeaderName::from_bytes(k.as_bytes())
            .map_err(|_| format!("`{k}` is not a valid header name"))?;
        let value = expand(v, lookup).map_err(|e| format!("header `{k}`: {e}"))?;
        let value = HeaderValue::from_str(&value)
            .map_err(|_| format!("header `{k}` has characters a header cannot carry"))?;
        map.insert(name, value);
    }
    Ok(map)
}
