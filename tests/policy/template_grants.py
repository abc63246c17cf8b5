#!/usr/bin/env python3
"""Checks what the functions' roles grant for calls the scenario tests cannot record: Bedrock
as AWS ships its models now, and the agents file read from S3.

Current Claude models on Bedrock are invoked through a cross-Region inference profile
(`us.anthropic…`, `global.anthropic…`). IAM then checks the call twice: on the profile, in
the Region called, and on the foundation model in whichever Region the profile routes it to
(with `bedrock:InferenceProfileArn` naming the profile in the request's context). A role
granted only the profile, or a `foundation-model/<profile id>` that does not exist, gets
AccessDenied. This expands the template (samtranslator), resolves the orchestrator's and
the subagent function's statements for a stack whose `BedrockModelId` is each kind of id,
and decides each call by IAM's rules for identity policies, conditions included:

- a profile id: InvokeModel and InvokeModelWithResponseStream on the profile, and on its
  foundation model in three Regions through the profile, are allowed; the same foundation
  model called directly (no profile), and another model through another profile, are not;
- a global profile id (the stack's default): the profile, and its foundation model through
  it in any Region and in the Region-less ARN IAM checks a global profile's calls on, are
  allowed; the model called directly, and another profile, are not;
- a foundation model id: both actions on the model, in the stack's Region, are allowed.

And with `AgentsS3Uri` set, each function that reads the agents file may get that object and
no other; unset, none may. And though SAM gives every function fed by SQS a managed policy
that may receive from and delete in any queue, each may only in the queues that feed it.

    python3 tests/policy/template_grants.py [template.yaml]
"""

import fnmatch
import os
import sys

from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from calls_granted import (  # noqa: E402
    ACCOUNT, ATTS, REFS, REGION, NoManagedPolicies, listify, on_resource, statements,
)

ACTIONS = ["bedrock:InvokeModel", "bedrock:InvokeModelWithResponseStream"]
STEP_FUNCTIONS = ["OrchestratorFunction", "SubagentFunction"]
MODEL = "anthropic.claude-haiku-4-5-20251001-v1:0"


def condition_holds(condition, context):
    """IAM's condition block: every operator's every key must hold (a key absent from the
    request's context fails a String operator)."""
    for op, keys in (condition or {}).items():
        for key, wanted in keys.items():
            have = context.get(key)
            if have is None:
                return False
            if op == "StringEquals":
                ok = have in listify(wanted)
            elif op == "StringLike":
                ok = any(fnmatch.fnmatchcase(have, w) for w in listify(wanted))
            else:
                raise SystemExit(f"condition operator {op}: unknown to this check")
            if not ok:
                return False
    return True


def allowed(stmts, action, arn, context):
    def hit(s):
        return (any(fnmatch.fnmatchcase(action.lower(), a.lower())
                    for a in listify(s.get("Action", [])))
                and on_resource(s, arn)
                and condition_holds(s.get("Condition"), context))
    if any(s["Effect"] == "Deny" and hit(s) for s in stmts):
        return False
    return any(s["Effect"] == "Allow" and hit(s) for s in stmts)


def roles(template, functions=STEP_FUNCTIONS, **overrides):
    params = {name: str(p.get("Default", "")) for name, p in template["Parameters"].items()}
    params.update({"JwtIssuer": "https://issuer.example.com", "JwtAudience": "client",
                   "LlmSecretArn": REFS["LlmSecretArn"], **overrides})
    translated = transform(template, params, NoManagedPolicies())
    return {f: statements(translated, f, params) for f in functions}


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "template.yaml"
    os.environ.setdefault("AWS_DEFAULT_REGION", REGION)
    with open(path) as f:
        source = f.read()

    def template():
        t = yaml_parse(source)
        for name, res in t["Resources"].items():
            if res.get("Type") == "AWS::Serverless::Function":
                res["Properties"]["CodeUri"] = f"s3://packaged-code/{name}.zip"
        return t

    profile_id = f"us.{MODEL}"
    global_id = f"global.{MODEL}"
    global_profile = f"arn:aws:bedrock:{REGION}:{ACCOUNT}:inference-profile/{global_id}"
    profile = f"arn:aws:bedrock:{REGION}:{ACCOUNT}:inference-profile/{profile_id}"
    other = f"arn:aws:bedrock:{REGION}:{ACCOUNT}:inference-profile/us.anthropic.other-v1:0"
    model_in = lambda region, m=MODEL: f"arn:aws:bedrock:{region}::foundation-model/{m}"  # noqa: E731
    cases = [
        # (model id the stack names, call's resource, request context, expected)
        (profile_id, profile, {}, True),
        *[(profile_id, model_in(r), {"bedrock:InferenceProfileArn": profile}, True)
          for r in ["us-east-1", "us-east-2", "us-west-2"]],
        (profile_id, model_in("us-east-2"), {}, False),
        (profile_id, model_in("us-east-2", "anthropic.other-v1:0"),
         {"bedrock:InferenceProfileArn": other}, False),
        (profile_id, other, {}, False),
        (MODEL, model_in(REGION), {}, True),
        (MODEL, model_in(REGION, "anthropic.other-v1:0"), {}, False),
        # A global profile (the stack's default) routes to any commercial Region, and IAM
        # checks its foundation model with no Region in the ARN at all.
        (global_id, global_profile, {}, True),
        (global_id, model_in(""), {"bedrock:InferenceProfileArn": global_profile}, True),
        (global_id, model_in("eu-west-1"), {"bedrock:InferenceProfileArn": global_profile}, True),
        (global_id, model_in(""), {}, False),
        (global_id, profile, {}, False),
    ]
    failures = 0
    by_model = {}
    for model_id, arn, context, expected in cases:
        if model_id not in by_model:
            by_model[model_id] = roles(template(), BedrockModelId=model_id)
        for function, stmts in by_model[model_id].items():
            for action in ACTIONS:
                got = allowed(stmts, action, arn, context)
                mark = "ok " if got == expected else "BAD"
                failures += got != expected
                print(f"{mark} {function:20} BedrockModelId={model_id}: {action} on {arn}"
                      f"{' via profile' if context else ''}: "
                      f"{'allowed' if got else 'denied'}, expected {'allowed' if expected else 'denied'}")
    # The agents file in S3: its object alone, for the four functions that read it.
    readers = ["ApiFunction", "OrchestratorFunction", "SubagentFunction", "EventsFunction"]
    uri_object = "cfg-bucket/baton/agents.json"
    decisions = len(cases) * len(ACTIONS) * len(STEP_FUNCTIONS)
    for uri, arn, expected in [
        (f"s3://{uri_object}", f"arn:aws:s3:::{uri_object}", True),
        (f"s3://{uri_object}", "arn:aws:s3:::cfg-bucket/baton/other.json", False),
        ("", f"arn:aws:s3:::{uri_object}", False),
    ]:
        for function, stmts in roles(template(), readers, AgentsS3Uri=uri).items():
            got = allowed(stmts, "s3:GetObject", arn, {})
            failures += got != expected
            decisions += 1
            print(f"{'ok ' if got == expected else 'BAD'} {function:20} AgentsS3Uri={uri!r}: "
                  f"s3:GetObject on {arn}: {'allowed' if got else 'denied'}")
    # Each SQS-fed function, in its own queues alone (SAM's managed policy allows any).
    feeds = {"OrchestratorFunction": ["StepsQueue", "StepsDeadLetterQueue"],
             "SubagentFunction": ["SubagentStepsQueue", "SubagentStepsDeadLetterQueue"],
             "EventsFunction": ["CtaInboxQueue", "SweepQueue"]}
    queues = ["StepsQueue", "StepsDeadLetterQueue", "SubagentStepsQueue",
              "SubagentStepsDeadLetterQueue", "CtaInboxQueue", "SweepQueue"]
    with_managed = roles(template(), list(feeds))
    for function, own in feeds.items():
        for q in queues:
            for action in ["sqs:ReceiveMessage", "sqs:DeleteMessage"]:
                got = allowed(with_managed[function], action, ATTS[f"{q}.Arn"], {})
                expected = q in own
                failures += got != expected
                decisions += 1
                print(f"{'ok ' if got == expected else 'BAD'} {function:20} {action} on {q}: "
                      f"{'allowed' if got else 'denied'}")
    print(f"{failures} of {decisions} decisions wrong")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
