#!/usr/bin/env python3
"""Checks the event bus's resource policy in template.yaml by IAM's documented evaluation
rules, for the requests that matter: who may put `cta.response`, `cta.expired` and
`timer.fired` events, alone or mixed with others in one PutEvents.

An emulator does not enforce resource policies, so this evaluates the policy itself: the
template's intrinsics are resolved for a sample stack, then each request is decided as IAM
does for a same-account principal: an explicit Deny in any matching statement wins; a
matching Allow allows. `events:detail-type` is multivalued (one value per entry of the
PutEvents call): a single-valued operator such as StringEquals is only sure to match a
request of one entry, which is why the policy needs `ForAnyValue:StringEquals` (any entry's
type among the values). Conditions use those and ArnNotLike (`*` and `?` wildcards); an
operator this does not know fails the check loudly.

    python3 tests/policy/bus_policy.py [template.yaml]
"""

import fnmatch
import sys

from samtranslator.yaml_helper import yaml_parse

ACCOUNT, REGION, STACK = "123456789012", "us-east-1", "baton"
SCHEDULER_ROLE = f"arn:aws:iam::{ACCOUNT}:role/{STACK}-SchedulerRole-ABC123"
BUS = f"arn:aws:events:{REGION}:{ACCOUNT}:event-bus/{STACK}-bus"


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
            assert target == ["SchedulerRole", "Arn"], f"unexpected GetAtt {target}"
            return SCHEDULER_ROLE
        if k == "Fn::If":
            name, yes, no = a
            return resolve(yes if conditions[name] else no, params, conditions)
        if k == "Fn::Join":
            sep, items = a
            return sep.join(resolve(items, params, conditions))
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
        allowed = listify(principal["AWS"])
        if not any(p == request["principal"] or p == f"arn:aws:iam::{ACCOUNT}:root"
                   for p in allowed):
            return False
    for op, tests in statement.get("Condition", {}).items():
        for key, values in tests.items():
            have = request[key]
            values = listify(values)
            if op == "StringEquals":
                # On a multivalued key, matched only when the request has that one value.
                have = listify(have)
                ok = len(have) == 1 and have[0] in values
            elif op == "ForAnyValue:StringEquals":
                ok = any(h in values for h in listify(have))
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


def policy(template, responders):
    params = {"CtaResponders": responders}
    conditions = {name: resolve(expr, params, {})
                  for name, expr in template["Conditions"].items()
                  if name == "HasCtaResponders"}
    bus = template["Resources"]["Bus"]["Properties"]["Policy"]
    return resolve(bus, params, conditions)["Statement"]


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
        ([""], someone, "run.state", "allow"),             # other events: the account's
        ([app], app, "cta.response", "allow"),             # a listed responder
        ([app], someone, "cta.response", "deny"),          # anyone else
        ([app], SCHEDULER_ROLE, "cta.response", "deny"),   # the scheduler only expires
        ([f"arn:aws:iam::{ACCOUNT}:role/ops-approver-*"], ops, "cta.response", "allow"),
        ([f"arn:aws:iam::{ACCOUNT}:role/ops-approver-*"], app, "cta.response", "deny"),
        # One PutEvents may mix types: a forged answer or expiry among others is refused.
        ([""], someone, ["run.state", "cta.response"], "deny"),
        ([""], someone, ["run.state", "cta.expired"], "deny"),
        ([""], someone, ["timer.fired", "run.state"], "deny"),
        ([app], app, ["run.state", "cta.response"], "allow"),
        ([""], someone, ["run.state", "run.completed"], "allow"),
    ]
    failed = 0
    for responders, principal, detail_type, want in cases:
        got = decide(policy(template, responders), req(principal, detail_type))
        ok = got == want
        failed += not ok
        types = "+".join(listify(detail_type))
        print(f"{'ok  ' if ok else 'FAIL'} {types:25} by {principal.split(':')[-1]:28} "
              f"(responders {','.join(r.split(':')[-1] for r in responders) or '-'}): {got}")
    print(f"{len(cases) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
