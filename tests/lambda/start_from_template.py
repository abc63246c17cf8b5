#!/usr/bin/env python3
"""Starts each Lambda function's real binary with the environment template.yaml gives it,
against the emulator, and hands it one event through a stand-in of Lambda's Runtime API.

What Lambda would start is exactly this: the Globals' variables and the function's own,
with the template's references resolved to this emulator's resources, and nothing else (no
variable of the shell leaks in but the emulator's endpoint and credentials). So a variable
or a secret a function needs and the template does not give it fails here, as its cold
start would fail on AWS. Each function is started for each parameter set below
(`PublicUrl` set and unset, a Bedrock model, an agents file). The live function is
asked as AppSync Events asks its authorizer.

A reference this does not know (a new resource a variable names) fails loudly: teach it
the resource rather than let a variable go untested.

Run by tests/lambda/invoke.sh after `baton bootstrap` (its variables in the environment):

    python3 tests/lambda/start_from_template.py <dir of the function binaries> [template.yaml]
"""

import base64
import hashlib
import hmac
import http.server
import json
import os
import subprocess
import sys
import threading
import time

import boto3
from samtranslator.yaml_helper import yaml_parse

FUNCTIONS = {
    # logical id: (binary, the event it is handed, a check of its answer)
    "ApiFunction": ("api", "tests/events/api-health.json",
                    lambda r: r.get("statusCode") == 200),
    "OrchestratorFunction": ("orchestrator", "tests/events/subagent-steps-batch.json",
                             lambda r: r.get("batchItemFailures") == []),
    "SubagentFunction": ("subagent", "tests/events/subagent-steps-batch.json",
                         lambda r: r.get("batchItemFailures") == []),
    "EventsFunction": ("events", "tests/events/cta-inbox-batch.json",
                      lambda r: r.get("batchItemFailures") == []),
    # AppSync asking the live channel's authorizer: a watch token of run_live, signed with
    # the link key below, for its own channel (allowed, not cached).
    "LiveFunction": ("live", None, lambda r: r == {"isAuthorized": True, "ttlOverride": 0}),
}

LINK_KEY = "k" * 48


def b64(raw):
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def live_event():
    """AppSync Events' request to its Lambda authorizer, for a subscription with a watch
    token as the api function grants it (core's live::grant)."""
    payload = f"run_live.{int(time.time()) + 300}".encode()
    tag = hmac.new(LINK_KEY.encode(), b"baton-live\n" + payload, hashlib.sha256).digest()
    return {"authorizationToken": f"{b64(payload)}.{b64(tag)}",
            "requestContext": {"apiId": "live", "accountId": "123456789012", "requestId": "r-1",
                               "operation": "EVENT_SUBSCRIBE", "channelNamespaceName": "runs",
                               "channel": "/runs/run-live"},
            "requestHeaders": {}}

# Its agent lists a built-in tool: a function whose catalog lacks it fails its start-up here.
AGENTS = json.dumps({"agents": {"ops": {"tools": ["request_human_feedback"], "model": "bedrock:us.anthropic.claude-haiku-4-5-20251001-v1:0"}}})
# An agents file past Lambda's 4 KB environment: only S3 can hand it to the functions.
LARGE_AGENTS = json.dumps({"agents": {"ops": {"tools": [], "system": "You are careful. " * 400,
                                              "model": "bedrock:us.anthropic.claude-haiku-4-5-20251001-v1:0"}}})
AGENTS_KEY = "config/agents.json"

PARAMETER_SETS = [
    {"PublicUrl": "https://baton.example.com"},
    {"PublicUrl": ""},
    {"PublicUrl": "https://baton.example.com", "Model": "bedrock:us.anthropic.claude-haiku-4-5-20251001-v1:0",
     "AgentsJson": AGENTS},
    # Its bucket is filled in below (the emulator's files bucket).
    {"PublicUrl": "", "AgentsS3Uri": AGENTS_KEY},
]


class Resolver:
    """The template's intrinsics, for this emulator's resources and a parameter set."""

    def __init__(self, template, params, resources, attributes):
        self.params = {name: str(p.get("Default", "")) for name, p in template["Parameters"].items()}
        self.params.update(params)
        self.resources = resources
        self.attributes = attributes

    def __call__(self, v):
        if isinstance(v, (str, int, float)):
            return str(v)
        if isinstance(v, list):
            return [self(x) for x in v]
        (k, a), = v.items()
        if k == "Ref":
            if a in self.params:
                return self.params[a]
            if a in self.resources:
                return self.resources[a]
            raise SystemExit(f"Ref {a}: not a parameter, nor a resource this check knows")
        if k == "Fn::GetAtt":
            target = ".".join(a) if isinstance(a, list) else a
            if target in self.attributes:
                return self.attributes[target]
            raise SystemExit(f"GetAtt {target}: unknown to this check")
        if k == "Fn::Sub":
            s = a
            for name, value in {"AWS::Partition": "aws", "AWS::AccountId": "123456789012",
                                "AWS::Region": "us-east-1", "AWS::StackName": "baton"}.items():
                s = s.replace("${" + name + "}", value)
            if "${" in s:
                raise SystemExit(f"Sub {a}: unresolved")
            return s
        raise SystemExit(f"{k}: an intrinsic this check does not know")


def environment(template, logical_id, resolve):
    variables = dict(template["Globals"]["Function"]["Environment"]["Variables"])
    own = template["Resources"][logical_id]["Properties"].get("Environment", {})
    variables.update(own.get("Variables", {}))
    return {k: resolve(v) for k, v in variables.items()}


class RuntimeApi(http.server.ThreadingHTTPServer):
    """Lambda's Runtime API, for one invocation: `next` hands out the event once (and then
    holds the caller, as Lambda does between invocations); the answer or error is kept."""

    def __init__(self, event):
        self.event = event
        self.handed = False
        self.answer = None
        self.done = threading.Event()
        super().__init__(("127.0.0.1", 0), Handler)


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *_):
        pass

    def do_GET(self):
        api = self.server
        if not self.path.endswith("/runtime/invocation/next"):
            return self.send_error(404)
        if api.handed:
            api.done.wait(60)
            return self.send_error(500)
        api.handed = True
        body = json.dumps(api.event).encode()
        self.send_response(200)
        deadline = int((time.time() + 30) * 1000)
        for k, v in [("Lambda-Runtime-Aws-Request-Id", "req-1"),
                     ("Lambda-Runtime-Deadline-Ms", str(deadline)),
                     ("Lambda-Runtime-Invoked-Function-Arn", "arn:aws:lambda:us-east-1:123456789012:function:baton"),
                     ("Lambda-Runtime-Trace-Id", "Root=1-00000000-000000000000000000000000"),
                     ("Content-Type", "application/json"), ("Content-Length", str(len(body)))]:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        api = self.server
        length = int(self.headers.get("Content-Length", 0))
        body = self.rfile.read(length).decode()
        kind = "response" if self.path.endswith("/response") else "error"
        api.answer = (kind, body)
        self.send_response(202)
        self.send_header("Content-Length", "0")
        self.end_headers()
        api.done.set()


def start(binary, env, event):
    api = RuntimeApi(event)
    threading.Thread(target=api.serve_forever, daemon=True).start()
    env = dict(env, AWS_LAMBDA_RUNTIME_API=f"127.0.0.1:{api.server_address[1]}",
               AWS_LAMBDA_FUNCTION_NAME="baton", AWS_LAMBDA_FUNCTION_MEMORY_SIZE="256",
               AWS_LAMBDA_FUNCTION_VERSION="$LATEST", AWS_LAMBDA_LOG_GROUP_NAME="/baton",
               AWS_LAMBDA_LOG_STREAM_NAME="test")
    proc = subprocess.Popen([binary], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 30
        while time.time() < deadline and not api.done.is_set() and proc.poll() is None:
            time.sleep(0.05)
        return api.answer, proc.poll(), proc
    finally:
        api.done.set()
        api.shutdown()
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def main():
    bins = sys.argv[1]
    path = sys.argv[2] if len(sys.argv) > 2 else "template.yaml"
    with open(path) as f:
        template = yaml_parse(f.read())
    e = os.environ
    client = lambda service: boto3.client(service, region_name=e.get("AWS_REGION", "us-east-1"),
                                          endpoint_url=e["AWS_ENDPOINT_URL"])
    sqs = client("sqs")
    secrets = client("secretsmanager")
    model_secret = secrets.create_secret(
        Name=f"baton-keys-{os.getpid()}",
        SecretString=json.dumps({"OPENAI_API_KEY": "sk-test", "ANTHROPIC_API_KEY": "sk-ant-test"}))["ARN"]
    link_secret = secrets.create_secret(Name=f"baton-link-key-{os.getpid()}",
                                        SecretString=LINK_KEY)["ARN"]

    assert len(LARGE_AGENTS) > 4096
    client("s3").put_object(Bucket=e["BATON_BUCKET"], Key=AGENTS_KEY, Body=LARGE_AGENTS.encode())

    def arn(url):
        return sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]

    step_dlqs = [q for q in sqs.list_queues(QueueNamePrefix="baton")["QueueUrls"] if "dlq" in q and q.endswith(".fifo")]
    sub_dlq = next(q for q in step_dlqs if "subagent" in q)
    steps_dlq = next(q for q in step_dlqs if "subagent" not in q)
    resources = {
        "Table": e["BATON_TABLE"], "StepsQueue": e["BATON_STEPS_QUEUE_URL"],
        "SubagentStepsQueue": e["BATON_SUBAGENT_QUEUE_URL"], "Bus": e["BATON_BUS_NAME"],
        "CtaScheduleGroup": e["BATON_SCHEDULE_GROUP"], "FilesBucket": e["BATON_BUCKET"],
        "LinkKeySecret": link_secret, "CtaInboxQueue": e["BATON_CTA_INBOX_URL"],
    }
    attributes = {
        "Bus.Arn": e["BATON_BUS_ARN"], "SchedulerRole.Arn": e["BATON_SCHEDULER_ROLE_ARN"],
        "StepsDeadLetterQueue.Arn": arn(steps_dlq), "SubagentStepsDeadLetterQueue.Arn": arn(sub_dlq),
        "TimersDeadLetterQueue.Arn": e["BATON_TIMERS_DLQ_ARN"],
        # The live channel: published to only while a run is watched (none is here).
        "LiveApi.Dns.Http": "live.appsync-api.us-east-1.amazonaws.com",
        "LiveApi.Dns.Realtime": "live.appsync-realtime-api.us-east-1.amazonaws.com",
    }
    # Only what Lambda would give besides the template: the emulator's endpoint and keys.
    base = {k: e[k] for k in ["AWS_ENDPOINT_URL", "AWS_REGION", "AWS_ACCESS_KEY_ID",
                              "AWS_SECRET_ACCESS_KEY", "AWS_EC2_METADATA_DISABLED"] if k in e}
    base["RUST_LOG"] = "warn"
    failed = 0
    for params in PARAMETER_SETS:
        params = dict(params, LlmSecretArn=model_secret)
        if params.get("AgentsS3Uri"):
            params["AgentsS3Uri"] = f"s3://{e['BATON_BUCKET']}/{params['AgentsS3Uri']}"
        resolve = Resolver(template, params, resources, attributes)
        for logical_id, (binary, event_file, ok) in FUNCTIONS.items():
            env = dict(base, **environment(template, logical_id, resolve))
            if event_file is None:
                event = live_event()
            else:
                with open(event_file) as f:
                    event = json.load(f)
            answer, code, proc = start(os.path.join(bins, binary), env, event)
            output = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            good = answer is not None and answer[0] == "response" and ok(json.loads(answer[1]))
            failed += not good
            shown = {k: v for k, v in params.items() if k != "LlmSecretArn" and v}
            print(f"{'ok  ' if good else 'FAIL'} {binary:12} {json.dumps(shown)[:90]}")
            if not good:
                print(f"     answer {answer}, exit {code}\n     {output.strip()[-1500:]}")
    print(f"started from the template: {'all passed' if not failed else f'{failed} failed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
