#!/usr/bin/env python3
"""Checks the resource policies in template.yaml by IAM's documented evaluation rules, for
the requests that matter: who may put `cta.response`, `cta.expired` and `timer.fired`
events on the bus, and Baton's own notifications (`run.*`, `plan.*`, `cta.request`, ...),
alone or mixed with others in one PutEvents; and who may send straight
into the CTA inbox, its dead letters and the step queues (only the rules, and the
functions, and any `QueueOperators`); and that every bus rule's target has a dead-letter
queue, alarmed.

An emulator does not enforce resource policies, so this evaluates the policy itself: the
template's intrinsics are resolved for a sample stack, then each request is decided as IAM
does for a same-account principal: an explicit Deny in any matching statement wins; a
matching Allow allows. `events:detail-type` is multivalued (one value per entry of the
PutEvents call): a single-valued operator such as StringEquals is only sure to match a
request of one entry, which is why the policy needs `ForAnyValue:StringEquals` (any entry's
type among the values). Conditions use those, ArnEquals, ArnNotEquals and ArnNotLike (`*`
and `?` wildcards). A key absent from the request (a user has no `aws:SourceArn`; a service
principal no `aws:PrincipalArn`) matches no positive operator and every negated one, as
IAM documents. An operator this does not know fails the check loudly.

    python3 tests/policy/resource_policies.py [template.yaml]
"""

import fnmatch
import sys

from samtranslator.yaml_helper import yaml_parse

ACCOUNT, REGION, STACK = "123456789012", "us-east-1", "baton"
SCHEDULER_ROLE = f"arn:aws:iam::{ACCOUNT}:role/{STACK}-SchedulerRole-ABC123"
BUS = f"arn:aws:events:{REGION}:{ACCOUNT}:event-bus/{STACK}-bus"
# What the intrinsics of the sample stack resolve to (`GetAtt X.Arn` → ARNS["X"]).
ARNS = {
    "SchedulerRole": SCHEDULER_ROLE,
    **{f"{f}Role": f"arn:aws:iam::{ACCOUNT}:role/{STACK}-{f}Role-ABC123"
       for f in ["ApiFunction", "OrchestratorFunction", "SubagentFunction", "EventsFunction"]},
    **{r: f"arn:aws:events:{REGION}:{ACCOUNT}:rule/{STACK}-bus/{STACK}-{r}-ABC123"
       for r in ["CtaResponseRule", "CtaExpiredRule", "CtaUndeliveredRule"]},
    "SweepSchedule": f"arn:aws:events:{REGION}:{ACCOUNT}:rule/{STACK}-SweepSchedule-ABC123",
    **{q: f"arn:aws:sqs:{REGION}:{ACCOUNT}:{STACK}-{q}"
       for q in ["CtaInboxQueue", "StepsQueue", "SubagentStepsQueue", "SweepQueue",
                 "CtaInboxDeadLetterQueue", "NotificationsDeadLetterQueue"]},
}


def resolve(v, params, conditions):
    """Resolves the intrinsics the bus policy uses, for the sample stack."""
    if isinstance(v, list):
        return [resolve(x, params, conditions) for x in v]
    if not isinstance(v, dict):
        return v
    if len(v) == 1:
        (k, a), = v.items()
        if k == "Fn::Sub":
            s = a
            for name, value in {"AWS::Partition": "aws", "AWS::AccountId": ACCOUNT,
                                "AWS::Region": REGION, "AWS::StackName": STACK}.items():
                s = s.replace("${" + name + "}", value)
            assert "${" not in s, f"unresolved Sub: {s}"
            return s
        if k == "Ref":
            return params[a]
        if k == "Fn::GetAtt":
            target = a if isinstance(a, list) else a.split(".")
            assert target[1] == "Arn" and target[0] in ARNS, f"unexpected GetAtt {target}"
            return ARNS[target[0]]
        if k == "Fn::Split":
            sep, text = a
            return resolve(text, params, conditions).split(sep)
        if k == "Fn::If":
            name, yes, no = a
            return resolve(yes if conditions[name] else no, params, conditions)
        if k == "Fn::Join":
            sep, items = a
            flat = []
            for x in resolve(items, params, conditions):
                flat.extend(x if isinstance(x, list) else [x])
            return sep.join(flat)
        if k == "Fn::Equals":
            x, y = resolve(a, params, conditions)
            return x == y
        if k == "Fn::Not":
            return not resolve(a[0], params, conditions)
    return {k: resolve(x, params, conditions) for k, x in v.items()}


def listify(x):
    return x if isinstance(x, list) else [x]


def matches(statement, request):
    if request["action"] not in listify(statement["Action"]):
        return False
    if request["resource"] not in listify(statement["Resource"]):
        return False
    principal = statement["Principal"]
    if principal != "*":
        if "Service" in principal:
            if request.get("service") not in listify(principal["Service"]):
                return False
        else:
            allowed = listify(principal["AWS"])
            if not any(p == request.get("principal") or p == f"arn:aws:iam::{ACCOUNT}:root"
                       for p in allowed):
                return False
    for op, tests in statement.get("Condition", {}).items():
        for key, values in tests.items():
            values = listify(values)
            if key not in request:
                # Absent: no positive operator matches, every negated one does.
                ok = "Not" in op
            else:
                have = request[key]
                if op == "StringEquals":
                    # On a multivalued key, matched only when the request has that one value.
                    have = listify(have)
                    ok = len(have) == 1 and have[0] in values
                elif op == "ForAnyValue:StringEquals":
                    ok = any(h in values for h in listify(have))
                elif op == "ForAnyValue:StringLike":
                    ok = any(fnmatch.fnmatchcase(h, v) for h in listify(have) for v in values)
                elif op == "ArnEquals":
                    ok = have in values
                elif op == "ArnNotEquals":
                    ok = have not in values
                elif op == "ArnNotLike":
                    ok = not any(fnmatch.fnmatchcase(have, pattern) for pattern in values)
                else:
                    raise SystemExit(f"unknown condition operator {op}: teach this check its semantics")
            if not ok:
                return False
    return True


def decide(statements, request):
    hits = [s for s in statements if matches(s, request)]
    if any(s["Effect"] == "Deny" for s in hits):
        return "deny"
    return "allow" if any(s["Effect"] == "Allow" for s in hits) else "implicit-deny"


def resolved(template, resource, params):
    params = {"CtaResponders": [""], "QueueOperators": [""], **params}
    conditions = {name: resolve(expr, params, {})
                  for name, expr in template["Conditions"].items()
                  if name in ("HasCtaResponders", "HasQueueOperators")}
    if resource not in template["Resources"]:
        return []  # no such policy: nothing denies
    props = template["Resources"][resource]["Properties"]
    doc = props.get("Policy") or props["PolicyDocument"]
    return resolve(doc, params, conditions)["Statement"]


def policy(template, responders):
    return resolved(template, "Bus", {"CtaResponders": responders})


def queue_cases(template):
    """Who may send into the inbox and the step queues, decided by their queue policies
    (same-account principals are allowed by their own policies: the queue's Deny decides)."""
    mallory = f"arn:aws:iam::{ACCOUNT}:user/mallory"
    ops = f"arn:aws:iam::{ACCOUNT}:role/ops-replay"
    inbox, steps, sub = ARNS["CtaInboxQueue"], ARNS["StepsQueue"], ARNS["SubagentStepsQueue"]
    sweep, dead = ARNS["SweepQueue"], ARNS["CtaInboxDeadLetterQueue"]
    undelivered = ARNS["NotificationsDeadLetterQueue"]

    def user(principal, queue):
        return {"principal": principal, "aws:PrincipalArn": principal,
                "action": "sqs:SendMessage", "resource": queue}

    def rule(name, queue):
        return {"service": "events.amazonaws.com", "aws:SourceArn": ARNS[name],
                "action": "sqs:SendMessage", "resource": queue}

    same_account = "allow"  # what an identity policy grants, unless a Deny says otherwise
    cases = [
        # (QueueOperators, resource, request, decision)
        ([""], "CtaInboxQueuePolicy", rule("CtaResponseRule", inbox), "allow"),
        ([""], "CtaInboxQueuePolicy", rule("CtaExpiredRule", inbox), "allow"),
        ([""], "CtaInboxQueuePolicy", rule("SweepSchedule", inbox), "deny"),
        ([""], "SweepQueuePolicy", rule("SweepSchedule", sweep), "allow"),
        ([""], "SweepQueuePolicy", rule("CtaResponseRule", sweep), "deny"),
        ([""], "SweepQueuePolicy", user(mallory, sweep), "deny"),
        ([""], "SweepQueuePolicy", user(ARNS["EventsFunctionRole"], sweep), "deny"),
        ([ops], "SweepQueuePolicy", user(ops, sweep), same_account),
        ([""], "CtaInboxQueuePolicy", user(mallory, inbox), "deny"),
        ([""], "CtaInboxQueuePolicy", user(ARNS["ApiFunctionRole"], inbox), "deny"),
        ([""], "CtaInboxQueuePolicy", {**rule("CtaResponseRule", inbox),
                                       "aws:SourceArn": f"arn:aws:events:{REGION}:{ACCOUNT}:rule/other"}, "deny"),
        ([ops], "CtaInboxQueuePolicy", user(ops, inbox), same_account),
        ([ops], "CtaInboxQueuePolicy", user(mallory, inbox), "deny"),
        ([""], "StepQueuesPolicy", user(ARNS["ApiFunctionRole"], steps), same_account),
        ([""], "StepQueuesPolicy", user(ARNS["EventsFunctionRole"], steps), same_account),
        ([""], "StepQueuesPolicy", user(ARNS["OrchestratorFunctionRole"], sub), same_account),
        ([""], "StepQueuesPolicy", user(ARNS["SubagentFunctionRole"], steps), same_account),
        ([""], "StepQueuesPolicy", user(mallory, steps), "deny"),
        ([""], "StepQueuesPolicy", user(mallory, sub), "deny"),
        ([""], "StepQueuesPolicy", user(SCHEDULER_ROLE, steps), "deny"),
        ([ops], "StepQueuesPolicy", user(ops, steps), same_account),
        # The inbox's dead letters are replayed into it: only what a rule could not deliver.
        ([""], "CtaInboxDeadLetterQueuePolicy", rule("CtaResponseRule", dead), "allow"),
        ([""], "CtaInboxDeadLetterQueuePolicy", rule("CtaExpiredRule", dead), "allow"),
        ([""], "CtaInboxDeadLetterQueuePolicy", rule("SweepSchedule", dead), "allow"),
        ([""], "CtaInboxDeadLetterQueuePolicy", {**rule("CtaResponseRule", dead),
                                                 "aws:SourceArn": f"arn:aws:events:{REGION}:{ACCOUNT}:rule/other"}, "deny"),
        ([""], "CtaInboxDeadLetterQueuePolicy", user(mallory, dead), "deny"),
        ([""], "CtaInboxDeadLetterQueuePolicy", user(ARNS["EventsFunctionRole"], dead), "deny"),
        ([ops], "CtaInboxDeadLetterQueuePolicy", user(ops, dead), same_account),
        ([""], "CtaInboxDeadLetterQueuePolicy", rule("CtaUndeliveredRule", dead), "allow"),
        # Notifications given up on: from their rule only (a forged one would page people).
        ([""], "NotificationsDeadLetterQueuePolicy", rule("CtaUndeliveredRule", undelivered), "allow"),
        ([""], "NotificationsDeadLetterQueuePolicy", rule("CtaResponseRule", undelivered), "deny"),
        ([""], "NotificationsDeadLetterQueuePolicy", user(mallory, undelivered), "deny"),
        ([""], "NotificationsDeadLetterQueuePolicy", user(ARNS["EventsFunctionRole"], undelivered), "deny"),
        ([ops], "NotificationsDeadLetterQueuePolicy", user(ops, undelivered), same_account),
    ]
    failed = 0
    for operators, resource, request, want in cases:
        statements = resolved(template, resource, {"QueueOperators": operators})
        got = decide(statements, request)
        # No statement applies: the account's own identity policies decide (allowed here).
        if got == "implicit-deny":
            # Nothing applies: a principal's own identity policy decides (allowed here); a
            # service principal no statement allows is refused.
            got = same_account if "principal" in request else "deny"
        ok = got == want
        failed += not ok
        who = request.get("principal") or request["aws:SourceArn"]
        print(f"{'ok  ' if ok else 'FAIL'} SendMessage {request['resource'].split(':')[-1]:24} by "
              f"{who.split(':')[-1]:40} (operators {','.join(o.split(':')[-1] for o in operators) or '-'}): {got}")
    return len(cases), failed


def rule_targets(template):
    """Every bus rule's target has a dead-letter queue its rule may send to (by that queue's
    policy) and an alarm watches: nothing the bus cannot deliver is dropped unseen."""
    resources = template["Resources"]
    alarmed = {a["Properties"]["Dimensions"][0]["Value"]["Fn::GetAtt"][0]
               for a in resources.values()
               if a["Type"] == "AWS::CloudWatch::Alarm"
               and a["Properties"].get("MetricName") == "ApproximateNumberOfMessagesVisible"}
    policies = {r["Properties"]["Queues"][0]["Ref"]: name for name, r in resources.items()
                if r["Type"] == "AWS::SQS::QueuePolicy"}
    n = failed = 0
    for name, r in resources.items():
        if r["Type"] != "AWS::Events::Rule":
            continue
        for target in r["Properties"]["Targets"]:
            n += 1
            dlq = target.get("DeadLetterConfig", {}).get("Arn", {}).get("Fn::GetAtt", [None])[0]
            problems = []
            if dlq is None:
                problems.append("no dead-letter queue")
            else:
                if dlq not in alarmed:
                    problems.append(f"no alarm on {dlq}")
                request = {"service": "events.amazonaws.com", "aws:SourceArn": ARNS[name],
                           "action": "sqs:SendMessage", "resource": ARNS[dlq]}
                statements = resolved(template, policies.get(dlq, ""), {})
                if decide(statements, request) != "allow":
                    problems.append(f"{dlq}'s policy does not let the rule send")
            if not target.get("RetryPolicy"):
                problems.append("no retry policy")
            failed += bool(problems)
            print(f"{'FAIL' if problems else 'ok  '} {name} -> {target['Id']}: "
                  f"{'; '.join(problems) or 'dead letters to ' + dlq + ', alarmed'}")
    return n, failed


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "template.yaml"
    with open(path) as f:
        template = yaml_parse(f.read())
    app = f"arn:aws:iam::{ACCOUNT}:role/my-app"
    someone = f"arn:aws:iam::{ACCOUNT}:user/mallory"
    ops = f"arn:aws:iam::{ACCOUNT}:role/ops-approver-7"

    def req(principal, detail_type):
        return {"principal": principal, "action": "events:PutEvents", "resource": BUS,
                "aws:PrincipalArn": principal, "events:detail-type": detail_type}

    cases = [
        # (CtaResponders, principal, detail-type, decision)
        ([""], app, "cta.response", "deny"),              # nobody by default
        ([""], someone, "cta.expired", "deny"),            # a forged expiry
        ([""], SCHEDULER_ROLE, "cta.expired", "allow"),    # the real one
        ([""], someone, "timer.fired", "deny"),            # a forged plan step timeout
        ([""], SCHEDULER_ROLE, "timer.fired", "allow"),    # the real one
        ([""], someone, "my.event", "allow"),              # other events: the account's
        ([app], app, "cta.response", "allow"),             # a listed responder
        ([app], someone, "cta.response", "deny"),          # anyone else
        ([app], SCHEDULER_ROLE, "cta.response", "deny"),   # the scheduler only expires
        ([f"arn:aws:iam::{ACCOUNT}:role/ops-approver-*"], ops, "cta.response", "allow"),
        ([f"arn:aws:iam::{ACCOUNT}:role/ops-approver-*"], app, "cta.response", "deny"),
        # One PutEvents may mix types: a forged answer or expiry among others is refused.
        ([""], someone, ["run.state", "cta.response"], "deny"),
        ([""], someone, ["run.state", "cta.expired"], "deny"),
        ([""], someone, ["timer.fired", "run.state"], "deny"),
        ([app], app, ["my.event", "cta.response"], "allow"),
        # Baton's own notifications: only the functions that step runs put them.
        ([""], someone, "run.completed", "deny"),
        ([""], app, "cta.request", "deny"),
        ([""], app, "plan.step.completed", "deny"),
        ([""], someone, ["my.event", "run.state"], "deny"),
        ([app], app, "cta.defaulted", "deny"),
        ([""], ARNS["OrchestratorFunctionRole"], "run.completed", "allow"),
        ([""], ARNS["SubagentFunctionRole"], ["run.state", "cta.request"], "allow"),
        ([""], ARNS["EventsFunctionRole"], "cta.rejected", "allow"),
        # A question's reminders, escalations and given-up deliveries: the events function's.
        ([""], ARNS["EventsFunctionRole"], ["cta.reminded", "cta.escalated"], "allow"),
        ([""], ARNS["EventsFunctionRole"], "cta.undelivered", "allow"),
        ([app], app, "cta.escalated", "deny"),
        ([""], someone, ["my.event", "cta.reminded"], "deny"),
        ([""], ARNS["ApiFunctionRole"], "run.state", "deny"),
        ([""], ARNS["OrchestratorFunctionRole"], "cta.response", "deny"),
        # Anything else is the account's.
        ([""], app, "my.event", "allow"),
    ]
    failed = 0
    for responders, principal, detail_type, want in cases:
        got = decide(policy(template, responders), req(principal, detail_type))
        ok = got == want
        failed += not ok
        types = "+".join(listify(detail_type))
        print(f"{'ok  ' if ok else 'FAIL'} {types:25} by {principal.split(':')[-1]:28} "
              f"(responders {','.join(r.split(':')[-1] for r in responders) or '-'}): {got}")
    n, queue_failed = queue_cases(template)
    failed += queue_failed
    n_rules, rules_failed = rule_targets(template)
    failed += rules_failed
    total = len(cases) + n + n_rules
    print(f"{total - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
