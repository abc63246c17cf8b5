#!/usr/bin/env python3
"""Lints the template as CloudFormation will see it at deploy time.

cfn-lint and `sam validate --lint` no longer expand `AWS::Serverless::*` resources, so errors
that only exist after the SAM transform (an event source mapping on a queue whose visibility
timeout is shorter than its function's timeout, say) pass them silently and fail `sam
deploy`. This expands the template with samtranslator (the SAM CLI's own library, the same
transform CloudFormation runs), writes the result to a temporary file and runs cfn-lint on
it. Exit code: cfn-lint's (non-zero on any error).

    scripts/lint-template.py [template.yaml]
"""

import json
import os
import subprocess
import sys
import tempfile

from samtranslator.model.exceptions import InvalidDocumentException
from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse


class NoManagedPolicies:
    """The template names no AWS managed policies by name, so nothing needs looking up."""

    def load(self):
        return {}


def main():
    # The transform fills pseudo parameters (AWS::Region) from the environment; no call is made.
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    path = sys.argv[1] if len(sys.argv) > 1 else "template.yaml"
    with open(path) as f:
        template = yaml_parse(f.read())
    # `sam package` uploads each function's code and puts its S3 location in CodeUri.
    for name, res in template.get("Resources", {}).items():
        props = res.get("Properties", {})
        if res.get("Type") == "AWS::Serverless::Function" and "CodeUri" in props:
            props["CodeUri"] = f"s3://packaged-code/{name}.zip"
    # Parameters without defaults get placeholder values of the right shape.
    params = {"JwtIssuer": "https://issuer.example.com", "JwtAudience": "client",
              "LlmSecretArn": "arn:aws:secretsmanager:us-east-1:123456789012:secret:baton-abc"}
    try:
        translated = transform(template, params, NoManagedPolicies())
    except InvalidDocumentException as e:
        for cause in e.causes:
            print(f"{path}: SAM transform: {cause.message}", file=sys.stderr)
        return 1
    # Every trigger invokes a function's alias (AutoPublishAlias), so that a deploy is rolled
    # back by moving the aliases: a queue's mapping or a permission on the unqualified
    # function would keep invoking the new code.
    aliases = {n for n, r in translated["Resources"].items() if r["Type"] == "AWS::Lambda::Alias"}
    unaliased = []
    for name, r in translated["Resources"].items():
        if r["Type"] in ("AWS::Lambda::EventSourceMapping", "AWS::Lambda::Permission"):
            target = r["Properties"]["FunctionName"]
            if not (isinstance(target, dict) and target.get("Ref") in aliases):
                unaliased.append(f"{name} ({r['Type']}) invokes {target}, not an alias")
    functions = [n for n, r in template["Resources"].items() if r["Type"] == "AWS::Serverless::Function"]
    if len(aliases) != len(functions) or unaliased:
        for u in unaliased:
            print(f"{path}: {u}", file=sys.stderr)
        print(f"{path}: {len(aliases)} aliases for {len(functions)} functions", file=sys.stderr)
        return 1
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as out:
        json.dump(translated, out, indent=1)
    print(f"translated {path} -> {out.name} ({len(translated['Resources'])} resources)")
    return subprocess.call(["cfn-lint", "--regions", "us-east-1", "--", out.name])


if __name__ == "__main__":
    sys.exit(main())
