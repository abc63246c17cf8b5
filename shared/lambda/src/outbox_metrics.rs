//! Effects that failed after their commit, and outboxes the sweep could not repair, as
//! CloudWatch Embedded Metric Format lines in the function's log: the metrics
//! `EffectFailures` and `OutboxRepairFailures` (the latter alarmed:
//! `OutboxRepairAlarm`). Every function reports them, the `api` and `events` functions
//! too, which link no metrics library: a line is written only when something failed.

use std::io::Write as _;

use baton_core::observe::{EffectsFailed, Observer};
use serde_json::json;

/// The outbox's failures, in `namespace` (`BATON_METRICS_NAMESPACE`).
pub struct OutboxMetrics {
    namespace: String,
}

impl OutboxMetrics {
    pub fn new(namespace: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
        }
    }

    /// One EMF line: `metric` counted `n` times at `at_ms` (ms since the epoch).
    pub fn line(&self, metric: &str, n: usize, at_ms: i64) -> String {
        json!({
            "_aws": {
                "Timestamp": at_ms,
                "CloudWatchMetrics": [{
                    "Namespace": self.namespace,
                    "Dimensions": [[]],
                    "Metrics": [{"Name": metric, "Unit": "Count"}],
                }],
            },
            metric: n,
        })
        .to_string()
    }

    fn write(&self, line: String) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}").and_then(|()| out.flush());
    }
}

impl Observer for OutboxMetrics {
    fn step(&self, _: &baton_core::observe::StepReport) {}

    fn effects_failed(&self, f: &EffectsFailed) {
        self.write(self.line("EffectFailures", f.kinds.len(), f.at.timestamp_millis()));
    }

    fn repair_failed(&self, _run_id: &str, _error: &str) {
        let now = chrono::Utc::now().timestamp_millis();
        self.write(self.line("OutboxRepairFailures", 1, now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_an_emf_record_of_its_metric() {
        let line =
            OutboxMetrics::new("Baton/prod").line("OutboxRepairFailures", 2, 1_700_000_000_000);
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        let m = &v["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(m["Namespace"], "Baton/prod");
        assert_eq!(m["Metrics"][0]["Name"], "OutboxRepairFailures");
        assert_eq!(m["Dimensions"], json!([[]]));
        assert_eq!(v["OutboxRepairFailures"], 2);
        assert_eq!(v["_aws"]["Timestamp"], 1_700_000_000_000i64);
        assert!(!line.contains('\n'));
    }

    #[test]
    fn the_repair_alarm_reads_the_metric_written_in_the_stack_namespace() {
        let template = include_str!("../../../template.yaml");
        let at = template.find("\n  OutboxRepairAlarm:").unwrap();
        // The resource: its lines up to the next one at its indentation.
        let alarm: String = template[at + 1..]
            .lines()
            .enumerate()
            .take_while(|(i, l)| *i == 0 || l.starts_with("    "))
            .map(|(_, l)| format!("{l}\n"))
            .collect();
        assert!(
            alarm.contains("MetricName: OutboxRepairFailures"),
            "{alarm}"
        );
        assert!(
            alarm.contains("Namespace: !Sub Baton/${AWS::StackName}"),
            "{alarm}"
        );
        assert!(template.contains("BATON_METRICS_NAMESPACE: !Sub Baton/${AWS::StackName}"));
    }
}
