#!/usr/bin/env python3
"""Checks that every AWS call each function made in the scenario tests is granted by the
IAM policies template.yaml gives that function's role.

Neither emulator enforces IAM, so a call a role lacks passes every test and fails on AWS
with AccessDenied. The tests' fault layer records, for each request a function makes
(`baton dev --aws` runs each function's handlers with its own clients, whose user agent
names it), the IAM actions it needs and their resources (`BATON_TEST_RECORD_CALLS`; see
tests/tests/common/fault.rs). This expands the template with samtranslator (the transform
CloudFormation runs), resolves each role's statements for a sample stack named `baton`,
maps each recorded resource to that stack's (by the suffix of its name: the tests name
resources as the template does, under another prefix), and decides each call by IAM's
rules for identity policies: allowed if a statement of the role allows the action on the
resource (`*` and `?` wildcards), unless one denies it. An event a function puts on the bus
is also decided by the bus's resource policy, for the entry's detail-type, as
tests/policy/resource_policies.py decides it (the bus keeps `cta.expired`, `timer.fired` and
`cta.response` to the principals it names: an event of those a function puts is refused on
AWS, and accepted by both emulators).

    python3 tests/policy/calls_granted.py <recorded calls (JSON lines)> [template.yaml]

Exit code 1 if any call is not granted, or if the record is missing or covers too little
(a check that saw nothing proves nothing).
"""

import fnmatch
import json
import os
import sys

from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import resource_policies  # noqa: E402  (beside this file)

ACCOUNT, REGION, STACK = "123456789012", "us-east-1", "baton"
FUNCTIONS = ["ApiFunction", "OrchestratorFunction", "SubagentFunction", "EventsFunction"]

# The sample stack's resources: what `Ref` and `GetAtt` give, as CloudFormation would.
QUEUES = {
    "StepsQueue": "steps.fifo", "StepsDeadLetterQueue": "steps-dlq.fifo",
    "SubagentStepsQueue": "subagent-steps.fifo",
    "SubagentStepsDeadLetterQueue": "subagent-steps-dlq.fifo",
    "CtaInboxQueue": "cta-inbox", "CtaInboxDeadLetterQueue": "cta-inbox-dlq",
    "SweepQueue": "sweep", "TimersDeadLetterQueue": "timers-dlq",
}
REFS = {
    "Table": f"{STACK}-table", "Bus": f"{STACK}-bus", "CtaScheduleGroup": f"{STACK}-ctas",
    "FilesBucket": f"{STACK}-files",
    "LinkKeySecret": f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:{STACK}-link-key-AbCdEf",
    "LlmSecretArn": f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:{STACK}-keys-AbCdEf",
    **{q: f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/{STACK}-{n}" for q, n in QUEUES.items()},
}
ATTS = {
    "SchedulerRole.Arn": f"arn:aws:iam::{ACCOUNT}:role/{STACK}-scheduler",
    "Table.Arn": f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{STACK}-table",
    "Bus.Arn": f"arn:aws:events:{REGION}:{ACCOUNT}:event-bus/{STACK}-bus",
    "FilesBucket.Arn": f"arn:aws:s3:::{STACK}-files",
    "LiveApi.ApiArn": f"arn:aws:appsync:{REGION}:{ACCOUNT}:apis/live1234",
    "LiveApi.ApiId": "live1234",
    "LiveApi.Dns.Http": f"live1234.appsync-api.{REGION}.amazonaws.com",
    "LiveApi.Dns.Realtime": f"live1234.appsync-realtime-api.{REGION}.amazonaws.com",
    "LiveRunsNamespace.ChannelNamespaceArn":
        f"arn:aws:appsync:{REGION}:{ACCOUNT}:apis/live1234/channelNamespace/runs",
    **{f"{q}.QueueName": f"{STACK}-{n}" for q, n in QUEUES.items()},
    **{f"{q}.Arn": f"arn:aws:sqs:{REGION}:{ACCOUNT}:{STACK}-{n}" for q, n in QUEUES.items()},
}

# What SAM attaches by ARN: AWS's managed policies, as AWS documents them (only the
# statements that bear on the calls recorded).
MANAGED = {
    "arn:aws:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole": [
        {"Effect": "Allow", "Action": ["logs:CreateLogGroup", "logs:CreateLogStream",
                                       "logs:PutLogEvents"], "Resource": "*"}],
    "arn:aws:iam::aws:policy/service-role/AWSLambdaSQSQueueExecutionRole": [
        {"Effect": "Allow", "Action": ["sqs:ReceiveMessage", "sqs:DeleteMessage",
                                       "sqs:GetQueueAttributes"], "Resource": "*"}],
}

# A recorded resource's name ends as the template's does; the longest suffix decides.
SUFFIXES = sorted([f"-{n}" for n in QUEUES.values()] + ["-table", "-bus", "-ctas", "-files",
                                                          "-scheduler"], key=len, reverse=True)


class NoManagedPolicies:
    def load(self):
        return {}


def resolve(v, params):
    if isinstance(v, list):
        return [resolve(x, params) for x in v]
    if not isinstance(v, dict):
        return v
    if len(v) != 1:
        return {k: resolve(x, params) for k, x in v.items()}
    (k, a), = v.items()
    if k != "Ref" and not k.startswith("Fn::"):
        return {k: resolve(a, params)}  # a plain mapping (a condition block), not an intrinsic
    if k == "Ref":
        if a in params:
            return params[a]
        if a in REFS:
            return REFS[a]
        raise SystemExit(f"Ref {a}: unknown to this check (teach it the resource)")
    if k == "Fn::GetAtt":
        key = ".".join(a) if isinstance(a, list) else a
        if key not in ATTS:
            raise SystemExit(f"GetAtt {key}: unknown to this check (teach it the resource)")
        return ATTS[key]
    if k == "Fn::Sub":
        text, names = (a, {}) if isinstance(a, str) else (a[0], a[1])
        values = {"AWS::Partition": "aws", "AWS::AccountId": ACCOUNT, "AWS::Region": REGION,
                  "AWS::StackName": STACK, **params,
                  **{n: resolve(x, params) for n, x in names.items()}}
        out = text
        for name, value in sorted(values.items(), key=lambda kv: -len(kv[0])):
            out = out.replace("${" + name + "}", str(value))
        while "${" in out:
            start = out.index("${")
            ref = out[start + 2:out.index("}", start)]
            value = ATTS.get(ref) if "." in ref else REFS.get(ref)
            if value is None:
                raise SystemExit(f"Sub {text}: ${{{ref}}} unresolved")
            out = out.replace("${" + ref + "}", value)
        return out
    if k == "Fn::Join":
        return a[0].join(str(resolve(x, params)) for x in a[1])
    if k == "Fn::Split":
        return str(resolve(a[1], params)).split(a[0])
    if k == "Fn::Select":
        return resolve(a[1], params)[int(a[0])]
    raise SystemExit(f"{k}: an intrinsic this check does not know")


def condition(translated, name, params):
    """A template condition, for the sample stack's parameters."""
    def ev(v):
        if isinstance(v, dict) and len(v) == 1:
            (k, a), = v.items()
            if k == "Fn::Not":
                return not ev(a[0])
            if k == "Fn::Equals":
                return ev(a[0]) == ev(a[1])
            if k == "Fn::And":
                return all(ev(x) for x in a)
            if k == "Fn::Or":
                return any(ev(x) for x in a)
            if k == "Condition":
                return condition(translated, a, params)
            if k == "Ref":
                return params.get(a, "")
            if k == "Fn::Join":
                return a[0].join(str(ev(x)) for x in listify(ev(a[1])))
        return v
    return ev(translated["Conditions"][name])


def chosen(translated, v, params):
    """`v` with its `Fn::If`s decided (a branch of `AWS::NoValue` is None)."""
    if isinstance(v, dict) and list(v) == ["Fn::If"]:
        name, yes, no = v["Fn::If"]
        pick = yes if condition(translated, name, params) else no
        return None if pick == {"Ref": "AWS::NoValue"} else chosen(translated, pick, params)
    return v


def statements(translated, function, params):
    """The statements of `function`'s role: its inline policies and the managed ones."""
    role_id = translated["Resources"][function]["Properties"]["Role"]["Fn::GetAtt"][0]
    role = translated["Resources"][role_id]["Properties"]
    out = []
    for p in role.get("Policies", []):
        p = chosen(translated, p, params)
        if p is None:
            continue
        out += resolve(p["PolicyDocument"]["Statement"], params)
    for arn in role.get("ManagedPolicyArns", []):
        if arn not in MANAGED:
            raise SystemExit(f"{function}: managed policy {arn} unknown to this check")
        out += MANAGED[arn]
    return out


def listify(x):
    return x if isinstance(x, list) else [x]


def arn_of(resource):
    """The sample stack's ARN for a recorded resource (`queue/flow-1a2b-steps.fifo`)."""
    kind, _, rest = resource.partition("/")
    name, _, tail = rest.partition("/")

    def ours(n):
        for suffix in SUFFIXES:
            if n.endswith(suffix):
                return STACK + suffix
        return n  # not one of the template's: no statement will name it

    if kind == "table":
        return f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{ours(name)}" + (f"/{tail}" if tail else "")
    if kind == "queue":
        return f"arn:aws:sqs:{REGION}:{ACCOUNT}:{ours(name)}"
    if kind == "event-bus":
        return f"arn:aws:events:{REGION}:{ACCOUNT}:event-bus/{ours(name)}"
    if kind == "schedule":
        return f"arn:aws:scheduler:{REGION}:{ACCOUNT}:schedule/{ours(name)}/{tail}"
    if kind == "role":
        return f"arn:aws:iam::{ACCOUNT}:role/{ours(name)}"
    if kind == "object":
        return f"arn:aws:s3:::{ours(name)}/{tail}"
    if kind == "bucket":
        return f"arn:aws:s3:::{ours(name)}"
    if kind == "secret":
        return rest
    if kind == "identity":
        return f"arn:aws:ses:{REGION}:{ACCOUNT}:identity/{rest}"
    raise SystemExit(f"recorded resource {resource}: a kind this check does not know")


def on_resource(s, arn):
    """Whether statement `s` applies to `arn`: one of its `Resource`, or none of its
    `NotResource`."""
    if "NotResource" in s:
        return not any(fnmatch.fnmatchcase(arn, r) for r in listify(s["NotResource"]))
    return any(fnmatch.fnmatchcase(arn, r) for r in listify(s.get("Resource", [])))


def allowed(stmts, action, arn):
    def hit(s):
        actions = listify(s.get("Action", []))
        return (any(fnmatch.fnmatchcase(action.lower(), a.lower()) for a in actions)
                and on_resource(s, arn))
    if any(s["Effect"] == "Deny" and hit(s) for s in stmts):
        return False
    return any(s["Effect"] == "Allow" and hit(s) for s in stmts)


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    record = sys.argv[1]
    path = sys.argv[2] if len(sys.argv) > 2 else "template.yaml"
    os.environ.setdefault("AWS_DEFAULT_REGION", REGION)
    with open(path) as f:
        text = f.read()
    template = yaml_parse(text)
    bus_policy = resource_policies.policy(yaml_parse(text), [""])
    for name, res in template["Resources"].items():
        if res.get("Type") == "AWS::Serverless::Function":
            res["Properties"]["CodeUri"] = f"s3://packaged-code/{name}.zip"
    params = {name: str(p.get("Default", "")) for name, p in template["Parameters"].items()}
    params.update({"JwtIssuer": "https://issuer.example.com", "JwtAudience": "client",
                   "LlmSecretArn": REFS["LlmSecretArn"]})
    translated = transform(template, params, NoManagedPolicies())
    roles = {f: statements(translated, f, params) for f in FUNCTIONS}

    try:
        with open(record) as f:
            calls = {(c["function"], c["action"], c["resource"])
                     for c in map(json.loads, filter(str.strip, f))}
    except FileNotFoundError:
        print(f"no record at {record}: run the scenario tests with BATON_TEST_RECORD_CALLS",
              file=sys.stderr)
        return 1
    seen = {}
    denied = []
    for function, action, resource in sorted(calls):
        if function not in roles:
            denied.append(f"{function}: not a function of the template ({action} {resource})")
            continue
        arn = arn_of(resource)
        # An event's detail-type counts too: the bus's policy may decide one and not another.
        key = (function, action, arn, resource if action == "events:PutEvents" else "")
        if key in seen:
            continue
        seen[key] = allowed(roles[function], action, arn)
        if not seen[key]:
            denied.append(f"{function}: {action} on {arn} is not granted")
        if action == "events:PutEvents":
            detail_type = resource.split("/", 2)[2] if resource.count("/") >= 2 else "?"
            role = resource_policies.ARNS[f"{function}Role"]
            request = {"principal": role, "aws:PrincipalArn": role, "action": action,
                       "resource": resource_policies.BUS, "events:detail-type": detail_type}
            if resource_policies.decide(bus_policy, request) == "deny":
                seen[key] = False
                denied.append(f"{function}: a `{detail_type}` event is refused by the bus's "
                              f"resource policy")
    for function in FUNCTIONS:
        actions = sorted({a for (f, a, _, _) in seen if f == function})
        print(f"{function:22} {len(actions):2} actions: {', '.join(actions)}")
    for line in denied:
        print(f"DENIED {line}")
    missing = [f for f in FUNCTIONS if not any(k[0] == f for k in seen)]
    if missing:
        print(f"no calls recorded for {', '.join(missing)}: the record covers too little")
        return 1
    print(f"{len(calls)} calls recorded, {len(seen)} distinct: "
          f"{'all granted' if not denied else f'{len(denied)} not granted'}")
    return 1 if denied else 0


if __name__ == "__main__":
    sys.exit(main())
