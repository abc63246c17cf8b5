#!/usr/bin/env python3
"""Checks that every function in a chain of Baton's own queues may loop.

A step sends its run's next message to the queue that invoked it. Lambda's recursive loop
detection counts the hops of one trace through Lambda and SQS and, by default
(`Terminate`), stops invoking a function after about 16: every run past 16 steps would
stop on AWS. So each function an SQS queue invokes whose role may send to a queue that
invokes a function (its own chain) must say `RecursiveLoop: Allow`.

    python3 tests/policy/loops.py [template.yaml]
"""

import sys

from samtranslator.yaml_helper import yaml_parse


def queue_of(ref):
    """The logical id a `!GetAtt Q.Arn`, `!Ref Q` or `!GetAtt Q.QueueName` names."""
    if isinstance(ref, dict):
        if "Fn::GetAtt" in ref:
            att = ref["Fn::GetAtt"]
            return att[0] if isinstance(att, list) else att.split(".")[0]
        if "Ref" in ref:
            return ref["Ref"]
    return None


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "template.yaml"
    with open(path) as f:
        res = yaml_parse(f.read())["Resources"]
    functions = {n: r["Properties"] for n, r in res.items() if r["Type"] == "AWS::Serverless::Function"}
    # The queues that invoke a function.
    invoking = {}
    for name, p in functions.items():
        for event in p.get("Events", {}).values():
            if event.get("Type") == "SQS":
                invoking.setdefault(queue_of(event["Properties"]["Queue"]), []).append(name)
    problems = []
    for name, p in functions.items():
        invoked_by_queue = any(name in fs for fs in invoking.values())
        # The queues its policies let it send to (SAM's SQSSendMessagePolicy, or a statement).
        sends = set()
        for policy in p.get("Policies", []):
            if isinstance(policy, dict) and "SQSSendMessagePolicy" in policy:
                sends.add(policy["SQSSendMessagePolicy"].get("QueueName") and
                          queue_of(policy["SQSSendMessagePolicy"]["QueueName"]))
            if isinstance(policy, dict) and "Statement" in policy:
                for s in policy["Statement"]:
                    actions = s.get("Action", [])
                    actions = [actions] if isinstance(actions, str) else actions
                    if any(a in ("sqs:SendMessage", "sqs:*") for a in actions):
                        resources = s.get("Resource", [])
                        resources = resources if isinstance(resources, list) else [resources]
                        sends.update(queue_of(r) for r in resources)
        feeds = sorted(q for q in sends if q in invoking)
        if invoked_by_queue and feeds and p.get("RecursiveLoop") != "Allow":
            problems.append(f"{name}: invoked by a queue and sends to {', '.join(feeds)}, "
                            "which invoke functions: set RecursiveLoop: Allow")
    for pr in problems:
        print(f"MISSING {pr}")
    looping = [n for n, p in functions.items() if p.get("RecursiveLoop") == "Allow"]
    print(f"functions that may loop: {', '.join(looping) or 'none'}; "
          f"{'all covered' if not problems else f'{len(problems)} problems'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
