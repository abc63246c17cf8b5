//! What Lambda gives each function, read from `template.yaml` as `sam` resolves it (a
//! function's own `Timeout` and `MemorySize` over the template's `Globals`, a `!Ref` to a
//! parameter taken at its default), with its SQS event source mappings (`BatchSize`,
//! `ScalingConfig.MaximumConcurrency`): the contract the in-process event source mappings
//! hold the functions to ([`crate::event_source`]).
//!
//! The template is built into the binary, so `baton dev --aws` and the tests run each
//! function as the stack it was built with deploys it.

use std::collections::HashMap;
use std::time::Duration;

use yaml_rust2::{Yaml, YamlLoader};

/// The stack's template, as this build deploys it.
pub const TEMPLATE: &str = include_str!("../../../template.yaml");

/// One function as Lambda runs it, for one of its queues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Function {
    /// Its logical id in the template (`OrchestratorFunction`).
    pub name: String,
    /// `Timeout`: an invocation still running then is ended.
    pub timeout: Duration,
    /// `MemorySize`, MB.
    pub memory_mb: u64,
    /// The mapping's `BatchSize`: the most records one invocation is given.
    pub batch_size: u32,
    /// The mapping's `ScalingConfig.MaximumConcurrency`: the most invocations of it at once.
    pub max_concurrency: usize,
    /// `RecursiveLoop: Allow`: Lambda goes on invoking it however long its chain of
    /// invocations through SQS ([`crate::loops`]); otherwise it stops past about 16 hops.
    pub loops_allowed: bool,
}

/// Lambda's defaults where the template says nothing.
const DEFAULT_TIMEOUT_S: u64 = 3;
const DEFAULT_MEMORY_MB: u64 = 128;
const DEFAULT_BATCH: u32 = 10;
/// A mapping without `MaximumConcurrency` scales to the account's concurrency; the stand-in
/// bounds it here.
const UNBOUNDED: usize = 1000;

/// Every SQS-fed function of the template, by the logical id of the queue that feeds it.
#[derive(Debug, Clone)]
pub struct Functions {
    by_queue: HashMap<String, Function>,
}

/// The template cannot be read as a stack's.
#[derive(Debug, thiserror::Error)]
#[error("template.yaml: {0}")]
pub struct TemplateError(String);

impl Functions {
    /// The functions of the template this build deploys.
    pub fn deployed() -> Result<Self, TemplateError> {
        Self::parse(TEMPLATE)
    }

    /// The value parameter `name` of the template `yaml` takes: its override, else its
    /// default (none when it has neither, or the template does not read).
    pub fn parameter(
        yaml: &str,
        overrides: &HashMap<String, String>,
        name: &str,
    ) -> Option<String> {
        if let Some(v) = overrides.get(name) {
            return Some(v.clone());
        }
        let docs = YamlLoader::load_from_str(yaml).ok()?;
        match &docs.first()?["Parameters"][name]["Default"] {
            Yaml::String(s) => Some(s.clone()),
            Yaml::Integer(n) => Some(n.to_string()),
            _ => None,
        }
    }

    pub fn parse(yaml: &str) -> Result<Self, TemplateError> {
        Self::parse_with(yaml, &HashMap::new())
    }

    /// [`Functions::parse`], with parameters given values (as `--parameter-overrides` does).
    pub fn parse_with(
        yaml: &str,
        overrides: &HashMap<String, String>,
    ) -> Result<Self, TemplateError> {
        let docs = YamlLoader::load_from_str(yaml).map_err(|e| TemplateError(e.to_string()))?;
        let t = docs.first().ok_or_else(|| TemplateError("empty".into()))?;
        let params = &t["Parameters"];
        for name in overrides.keys() {
            if params[name.as_str()].is_badvalue() {
                return Err(TemplateError(format!(
                    "{name} is no parameter of the template"
                )));
            }
        }
        // A number, or a `!Ref` to a parameter (the tag is dropped: its name is left), at
        // its override or its default.
        let number = |v: &Yaml, what: &str| -> Result<Option<u64>, TemplateError> {
            let parsed = |name: &str, s: &str| {
                s.parse().map(Some).map_err(|_| {
                    TemplateError(format!("{what}: parameter {name}={s:?} is no number"))
                })
            };
            match v {
                Yaml::BadValue => Ok(None),
                Yaml::Integer(n) => u64::try_from(*n)
                    .map(Some)
                    .map_err(|_| TemplateError(format!("{what}: {n} is negative"))),
                Yaml::String(name) => {
                    match (overrides.get(name), &params[name.as_str()]["Default"]) {
                        (Some(s), _) => parsed(name, s),
                        (None, Yaml::Integer(n)) => Ok(u64::try_from(*n).ok()),
                        (None, Yaml::String(s)) => parsed(name, s),
                        _ => Err(TemplateError(format!(
                            "{what}: {name} is no parameter with a number default"
                        ))),
                    }
                }
                other => Err(TemplateError(format!("{what}: {other:?} is no number"))),
            }
        };
        let globals = &t["Globals"]["Function"];
        let resources = t["Resources"]
            .as_hash()
            .ok_or_else(|| TemplateError("no Resources".into()))?;
        let mut by_queue = HashMap::new();
        for (id, res) in resources {
            if res["Type"].as_str() != Some("AWS::Serverless::Function") {
                continue;
            }
            let name = id.as_str().unwrap_or_default().to_owned();
            let props = &res["Properties"];
            let own_or_global = |key: &str| -> Result<Option<u64>, TemplateError> {
                let what = format!("{name}.{key}");
                Ok(number(&props[key], &what)?.or(number(&globals[key], &what)?))
            };
            let timeout = own_or_global("Timeout")?.unwrap_or(DEFAULT_TIMEOUT_S);
            let memory_mb = own_or_global("MemorySize")?.unwrap_or(DEFAULT_MEMORY_MB);
            let loops_allowed = props["RecursiveLoop"]
                .as_str()
                .or(globals["RecursiveLoop"].as_str())
                == Some("Allow");
            let Some(events) = props["Events"].as_hash() else {
                continue;
            };
            for (event, e) in events {
                if e["Type"].as_str() != Some("SQS") {
                    continue;
                }
                let what = format!("{name}.Events.{}", event.as_str().unwrap_or_default());
                let p = &e["Properties"];
                // `!GetAtt StepsQueue.Arn` leaves `StepsQueue.Arn`.
                let queue = p["Queue"]
                    .as_str()
                    .and_then(|q| q.strip_suffix(".Arn"))
                    .ok_or_else(|| {
                        TemplateError(format!("{what}: Queue is no !GetAtt <queue>.Arn"))
                    })?;
                let batch = number(&p["BatchSize"], &what)?.unwrap_or(DEFAULT_BATCH.into());
                let concurrency = number(&p["ScalingConfig"]["MaximumConcurrency"], &what)?;
                by_queue.insert(
                    queue.to_owned(),
                    Function {
                        name: name.clone(),
                        timeout: Duration::from_secs(timeout),
                        memory_mb,
                        batch_size: u32::try_from(batch).unwrap_or(DEFAULT_BATCH),
                        max_concurrency: concurrency
                            .and_then(|c| usize::try_from(c).ok())
                            .unwrap_or(UNBOUNDED),
                        loops_allowed,
                    },
                );
            }
        }
        Ok(Self { by_queue })
    }

    /// The function the queue of this logical id feeds.
    pub fn fed_by(&self, queue: &str) -> Result<Function, TemplateError> {
        self.by_queue
            .get(queue)
            .cloned()
            .ok_or_else(|| TemplateError(format!("no function is fed by the queue {queue}")))
    }

    /// Each SQS-fed function with the most invocations its mappings may start at once (the
    /// sum of their `MaximumConcurrency`), by name.
    pub fn mapped_concurrency(&self) -> std::collections::BTreeMap<String, usize> {
        let mut out = std::collections::BTreeMap::new();
        for f in self.by_queue.values() {
            *out.entry(f.name.clone()).or_default() += f.max_concurrency;
        }
        out
    }

    /// Every function's timeout shortened to at most `timeout` (`BATON_DEV_FUNCTION_TIMEOUT_S`:
    /// to see, in tests or by hand, what Lambda does when an invocation runs out of time).
    pub fn timeouts_at_most(mut self, timeout: Duration) -> Self {
        for f in self.by_queue.values_mut() {
            f.timeout = f.timeout.min(timeout);
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deployed_template_gives_each_queue_its_functions_settings() {
        let f = Functions::deployed().expect("template.yaml reads");
        let steps = f.fed_by("StepsQueue").unwrap();
        assert_eq!(steps.name, "OrchestratorFunction");
        assert_eq!(steps.timeout, Duration::from_secs(900));
        // From Globals, since the function names none.
        assert_eq!(steps.memory_mb, 256);
        assert_eq!(steps.batch_size, 10);
        assert!(
            steps.loops_allowed,
            "a run's steps are a loop through its queue"
        );
        // `!Ref StepsMaxConcurrency`, at its default.
        assert_eq!(steps.max_concurrency, 50);
        let dead = f.fed_by("StepsDeadLetterQueue").unwrap();
        assert_eq!(
            (dead.name.as_str(), dead.max_concurrency),
            ("OrchestratorFunction", 2)
        );
        assert_eq!(
            f.fed_by("SubagentStepsQueue").unwrap().name,
            "SubagentFunction"
        );
        let events = f.fed_by("CtaInboxQueue").unwrap();
        assert_eq!(
            (events.name.as_str(), events.timeout),
            ("EventsFunction", Duration::from_secs(30))
        );
        assert!(f.fed_by("NoSuchQueue").is_err());
        // The steps mapping and the dead letters' for each step function; the inbox and
        // the sweep for `events`.
        let asked = f.mapped_concurrency();
        assert_eq!(asked.get("OrchestratorFunction"), Some(&52));
        assert_eq!(asked.get("EventsFunction"), Some(&52));
    }

    #[test]
    fn a_function_without_settings_gets_lambdas_defaults_and_a_bad_ref_is_an_error() {
        let t = "Parameters:\n  N: {Type: Number, Default: 7}\nResources:\n  Q: {Type: AWS::SQS::Queue}\n  F:\n    Type: AWS::Serverless::Function\n    Properties:\n      Events:\n        E:\n          Type: SQS\n          Properties: {Queue: !GetAtt Q.Arn, ScalingConfig: {MaximumConcurrency: !Ref N}}\n";
        let f = Functions::parse(t).unwrap().fed_by("Q").unwrap();
        assert_eq!(f.timeout, Duration::from_secs(3));
        assert_eq!((f.memory_mb, f.batch_size, f.max_concurrency), (128, 10, 7));
        let bad = t.replace("!Ref N", "!Ref Missing");
        let err = Functions::parse(&bad).unwrap_err().to_string();
        assert!(err.contains("Missing"), "{err}");
        let short = Functions::parse(t)
            .unwrap()
            .timeouts_at_most(Duration::from_secs(1));
        assert_eq!(short.fed_by("Q").unwrap().timeout, Duration::from_secs(1));
        let set = |k: &str, v: &str| HashMap::from([(k.to_owned(), v.to_owned())]);
        let f = Functions::parse_with(t, &set("N", "9")).unwrap();
        assert_eq!(f.fed_by("Q").unwrap().max_concurrency, 9);
        assert_eq!(f.mapped_concurrency().get("F"), Some(&9));
        assert!(Functions::parse_with(t, &set("Nope", "1")).is_err());
        assert!(Functions::parse_with(t, &set("N", "many")).is_err());
    }
}
