#!/usr/bin/env python3
"""Checks that the template's alarms cover what fails quietly on a fresh account, and that
each can reach a person.

Every function has an `Errors` and a `Throttles` alarm (a throttled step function's records
wait out a 90-minute visibility timeout, spending receives); the table has read and write
throttle alarms; timers have `InvocationDroppedCount` and their dead-letter queue's depth;
failed steps (batch item failures, which no `Errors` alarm sees) have a rate alarm;
and every alarm notifies the `AlarmEmail` topic when that is set, else `AlarmTopicArn`.

    python3 tests/policy/alarms.py [template.yaml]
"""

import sys

from samtranslator.yaml_helper import yaml_parse


def rule_holds(v, params):
    """A CloudFormation rule's condition or assertion, for these parameters (the functions
    rules may use that the template does)."""
    (k, a), = v.items()
    if k == "Ref":
        return params[a]
    if k == "Fn::Equals":
        x, y = (rule_holds(e, params) if isinstance(e, dict) else e for e in a)
        return x == y
    if k == "Fn::Not":
        return not rule_holds(a[0], params)
    if k == "Fn::Or":
        return any(rule_holds(e, params) for e in a)
    if k == "Fn::And":
        return all(rule_holds(e, params) for e in a)
    raise SystemExit(f"{k}: a rule function this check does not know")


def refused_without_a_recipient(t):
    """A deploy whose alarms would reach nobody is refused by a rule (unless its owner says
    so with AlarmsNotifyNobody); one with an address or a topic is not."""
    problems = []
    cases = [
        ({"AlarmEmail": "", "AlarmTopicArn": "", "AlarmsNotifyNobody": "false"}, False),
        ({"AlarmEmail": "ops@example.com", "AlarmTopicArn": "", "AlarmsNotifyNobody": "false"}, True),
        ({"AlarmEmail": "", "AlarmTopicArn": "arn:aws:sns:us-east-1:1:t", "AlarmsNotifyNobody": "false"}, True),
        ({"AlarmEmail": "", "AlarmTopicArn": "", "AlarmsNotifyNobody": "true"}, True),
    ]
    defaults = {k: p.get("Default") for k, p in t["Parameters"].items()}
    if defaults.get("AlarmsNotifyNobody") != "false":
        problems.append("AlarmsNotifyNobody: a deploy should be refused by default")
    for params, deploys in cases:
        holds = True
        for name, rule in t.get("Rules", {}).items():
            if rule_holds(rule.get("RuleCondition", {"Fn::Equals": [1, 1]}), params):
                for a in rule["Assertions"]:
                    holds = holds and rule_holds(a["Assert"], params)
        if holds != deploys:
            problems.append(f"a deploy with {params} is {'refused' if deploys else 'not refused'}")
    return problems


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "template.yaml"
    with open(path) as f:
        t = yaml_parse(f.read())
    res = t["Resources"]
    alarms = {n: r["Properties"] for n, r in res.items() if r["Type"] == "AWS::CloudWatch::Alarm"}
    problems = []

    def watching(metric, ref):
        return [n for n, a in alarms.items() if a.get("MetricName") == metric
                and any(d.get("Value") == {"Ref": ref} or d.get("Value") == {"Fn::GetAtt": [ref, "QueueName"]}
                        for d in a.get("Dimensions", []))]

    for name, r in res.items():
        if r["Type"] == "AWS::Serverless::Function":
            for metric in ["Errors", "Throttles"]:
                if not watching(metric, name):
                    problems.append(f"{name}: no {metric} alarm")
    for metric in ["ReadThrottleEvents", "WriteThrottleEvents"]:
        if not watching(metric, "Table"):
            problems.append(f"Table: no {metric} alarm")
    if not watching("InvocationDroppedCount", "CtaScheduleGroup"):
        problems.append("CtaScheduleGroup: no InvocationDroppedCount alarm")
    if not watching("ApproximateNumberOfMessagesVisible", "TimersDeadLetterQueue"):
        problems.append("TimersDeadLetterQueue: no depth alarm")
    # Failed steps are batch item failures, not function errors: an alarm on their rate.
    rate = [n for n, a in alarms.items()
            if any(m.get("MetricStat", {}).get("Metric", {}).get("MetricName") == "StepFailures"
                   for m in a.get("Metrics", []))]
    if not rate:
        problems.append("StepFailures: no alarm on the rate of failed steps")
    want = {"Fn::If": ["HasAlarmEmail", [{"Ref": "AlarmEmailTopic"}],
                       {"Fn::If": ["HasAlarmTopic", [{"Ref": "AlarmTopicArn"}],
                                   {"Ref": "AWS::NoValue"}]}]}
    for name, a in alarms.items():
        if a.get("AlarmActions") != want:
            problems.append(f"{name}: does not notify the AlarmEmail topic or AlarmTopicArn")
    topic = res.get("AlarmEmailTopic", {}).get("Properties", {})
    if topic.get("Subscription") != [{"Protocol": "email", "Endpoint": {"Ref": "AlarmEmail"}}]:
        problems.append("AlarmEmailTopic: no e-mail subscription to AlarmEmail")
    problems += refused_without_a_recipient(t)
    for p in problems:
        print(f"MISSING {p}")
    print(f"{len(alarms)} alarms: {'all covered' if not problems else f'{len(problems)} problems'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
