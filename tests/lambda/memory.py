#!/usr/bin/env python3
"""Each Lambda function's most resident memory at its worst case, on its real binary, checked
against the `MemorySize` template.yaml gives it.

Each function's `bootstrap` runs once, warm across invocations as on Lambda, behind a
stand-in of Lambda's Runtime API, against the emulator at `AWS_ENDPOINT_URL` (resources of
its own, made with `baton bootstrap`), with `AWS_LAMBDA_FUNCTION_MEMORY_SIZE` set as the template sets it. This script
is the event source mappings: it receives the steps queue's messages in batches of 10 and
hands them over, deleting what succeeded. The work is the heaviest a deployment allows:

- RUNS runs of an agent at the largest context budget (`contextBytes` 4,000,000), each with
  a 4 KB `metadata`, a 16 KB `context` and a prompt that fills the rest of the 256 KB body;
- every turn, 8 calls (the most a reply may make) of an HTTP tool answering 1 MB (kept as
  64 KB each) with a 64 KB text beside them, until each run's history passes its context
  budget and all of them together pass the step functions' timeline cache; then each run
  asks for an approval, is answered through the `events` function, and ends with a 256 KB answer;
- the `api` function pages every run's timeline (4 MB pages), the runs and the CTAs.

Then it reads each process's peak resident memory (VmHWM) and fails if one passes 90% of its
function's `MemorySize`. Run by tests/lambda/invoke.sh on moto (debug binaries, which only
overstate); on release binaries: `python3 tests/lambda/memory.py <dir of the binaries>` with
the emulator's endpoint and keys in the environment (`baton` in the same directory).
"""

import http.server
import json
import os
import queue
import shlex
import subprocess
import sys
import threading
import time
import uuid

import boto3
from samtranslator.yaml_helper import yaml_parse

RUNS = int(os.environ.get("MEMORY_RUNS", "20"))  # × 4 MB windows: past the 64 MB cache
TURNS = 8  # of 8 × 64 KB results and 64 KB of text: 4.6 MB a run, past its 4 MB budget
CALLS = 8
HEADROOM = 0.9
LAMBDA_REPLY_BYTES = 6 * 1024 * 1024  # a synchronous invocation's response payload


class Runtime(http.server.ThreadingHTTPServer):
    """Lambda's Runtime API for a warm function: `next` waits for the next event handed in."""

    def __init__(self):
        self.events, self.answers = queue.Queue(), queue.Queue()
        super().__init__(("127.0.0.1", 0), RuntimeHandler)


class RuntimeHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *_):
        pass

    def do_GET(self):
        event = self.server.events.get()
        body = json.dumps(event).encode()
        self.send_response(200)
        for k, v in [("Lambda-Runtime-Aws-Request-Id", str(uuid.uuid4())),
                     ("Lambda-Runtime-Deadline-Ms", str(int((time.time() + 900) * 1000))),
                     ("Lambda-Runtime-Invoked-Function-Arn", "arn:aws:lambda:us-east-1:123456789012:function:baton"),
                     ("Content-Type", "application/json"), ("Content-Length", str(len(body)))]:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(202)
        self.send_header("Content-Length", "0")
        self.end_headers()
        kind = "response" if self.path.endswith("/response") else "error"
        self.server.answers.put((kind, body))


class Function:
    def __init__(self, name, binary, env, memory_mb):
        self.name, self.memory_mb, self.largest_answer = name, memory_mb, 0
        self.runtime = Runtime()
        threading.Thread(target=self.runtime.serve_forever, daemon=True).start()
        self.log = open(f"{os.environ.get('MEMORY_LOG_DIR', '/tmp')}/memory-{name}.log", "wb")
        env = dict(env, AWS_LAMBDA_RUNTIME_API=f"127.0.0.1:{self.runtime.server_address[1]}",
                   AWS_LAMBDA_FUNCTION_NAME=name, AWS_LAMBDA_FUNCTION_MEMORY_SIZE=str(memory_mb),
                   AWS_LAMBDA_FUNCTION_VERSION="$LATEST", AWS_LAMBDA_LOG_GROUP_NAME=f"/{name}",
                   AWS_LAMBDA_LOG_STREAM_NAME="memory")
        self.proc = subprocess.Popen([binary], env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def invoke(self, event):
        self.runtime.events.put(event)
        try:
            kind, body = self.runtime.answers.get(timeout=600)
        except queue.Empty:
            sys.exit(f"{self.name}: no answer in 10 minutes (see {self.log.name})")
        if kind != "response":
            sys.exit(f"{self.name} failed: {body.decode()[:2000]}")
        self.largest_answer = max(self.largest_answer, len(body))
        return json.loads(body)

    def peak_mb(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            line = next(l for l in f if l.startswith("VmHWM:"))
        return int(line.split()[1]) / 1024

    def cpu_seconds(self):
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        self.runtime.shutdown()


def serve(handler):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


# 1 MB of text that does not compress, as a tool's and a model's bytes mostly do not.
NOISE = os.urandom(512 * 1024).hex()


class Tool(http.server.BaseHTTPRequestHandler):
    """The HTTP tool: 1 MB whatever it is asked (Baton keeps 64 KB of it)."""

    def log_message(self, *_):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps({"data": NOISE[:1024 * 1024 - 20]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Model(http.server.BaseHTTPRequestHandler):
    """An OpenAI-compatible model: TURNS turns of CALLS tool calls, then an approval, then a
    256 KB answer, counted per run (its prompt starts with the run's tag)."""

    turns, lock, largest = {}, threading.Lock(), 0

    def log_message(self, *_):
        pass

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        request = json.loads(raw)
        tag = next(m["content"] for m in request["messages"] if m["role"] == "user")[:12]
        with Model.lock:
            turn = Model.turns[tag] = Model.turns.get(tag, 0) + 1
            Model.largest = max(Model.largest, len(raw))
        calls, content = [], NOISE[:64 * 1024]
        if turn <= TURNS:
            calls = [("blob", {"i": i}) for i in range(CALLS)]
        elif turn == TURNS + 1:
            calls = [("request_human_feedback", {"kind": "approval", "message": "ship it?"})]
        else:
            content = NOISE[:256 * 1024]
        message = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = [
                {"id": f"call_{turn}_{i}", "type": "function",
                 "function": {"name": name, "arguments": json.dumps(args)}}
                for i, (name, args) in enumerate(calls)]
        body = json.dumps({"id": "c", "object": "chat.completion", "model": request["model"],
                           "choices": [{"index": 0, "message": message,
                                        "finish_reason": "tool_calls" if calls else "stop"}],
                           "usage": {"prompt_tokens": len(raw) // 4, "completion_tokens": 1000}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def http_event(method, path, body=None, query=""):
    return {"version": "2.0", "routeKey": "ANY /{proxy+}", "rawPath": path, "rawQueryString": query,
            "headers": {"content-type": "application/json", "host": "api.example.com"},
            "requestContext": {"accountId": "123456789012", "apiId": "api1",
                               "domainName": "api.example.com", "domainPrefix": "api",
                               "http": {"method": method, "path": path, "protocol": "HTTP/1.1",
                                        "sourceIp": "127.0.0.1", "userAgent": "memory"},
                               "requestId": str(uuid.uuid4()), "routeKey": "ANY /{proxy+}",
                               "stage": "$default", "time": "26/Nov/2026:03:00:00 +0000",
                               "timeEpoch": int(time.time() * 1000),
                               "authorizer": {"jwt": {"claims": {"sub": "user-1",
                                                                 "iss": "https://issuer.example.com"},
                                                      "scopes": None}}},
            "isBase64Encoded": False, "body": json.dumps(body) if body is not None else None}


def call(api, method, path, body=None, query="", want=(200, 202)):
    r = api.invoke(http_event(method, path, body, query))
    if r["statusCode"] not in want:
        sys.exit(f"api {method} {path}: {r['statusCode']} {r.get('body', '')[:500]}")
    return json.loads(r["body"]), len(r["body"])


def records(messages, arn):
    return {"Records": [{
        "messageId": m["MessageId"], "receiptHandle": m["ReceiptHandle"], "body": m["Body"],
        "attributes": m.get("Attributes", {}), "messageAttributes": {}, "md5OfBody": m["MD5OfBody"],
        "eventSource": "aws:sqs", "eventSourceARN": arn, "awsRegion": "us-east-1"} for m in messages]}


def pending(sqs, url):
    """Messages in the queue that a receive cannot see now: delayed (a step a function sent
    back to wait, as a held or deferred one is) or in flight."""
    a = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
        "ApproximateNumberOfMessagesDelayed", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
    return int(a.get("ApproximateNumberOfMessagesDelayed", 0)) + \
        int(a.get("ApproximateNumberOfMessagesNotVisible", 0))


def drain(sqs, url, fn):
    """The event source mapping: batches of up to 10 until the queue stays empty 3 s with
    nothing delayed in it (on a loaded machine a step may be sent back to wait: the mapping
    keeps polling, and so does this)."""
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    batches, idle = 0, 0
    deadline = time.time() + 600
    while idle < 3 and time.time() < deadline:
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1,
                                  VisibilityTimeout=900, AttributeNames=["All"]).get("Messages", [])
        if not got:
            idle = idle + 1 if pending(sqs, url) == 0 else 0
            continue
        idle, batches = 0, batches + 1
        failed = {f["itemIdentifier"] for f in fn.invoke(records(got, arn))["batchItemFailures"]}
        for m in got:
            if m["MessageId"] in failed:
                sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"],
                                              VisibilityTimeout=0)
            else:
                sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    return batches


def memory_sizes(path="template.yaml"):
    with open(path) as f:
        template = yaml_parse(f.read())
    default = template["Globals"]["Function"]["MemorySize"]
    return {os.path.basename(r["Properties"]["CodeUri"].rstrip("/")):
            int(r["Properties"].get("MemorySize", default))
            for r in template["Resources"].values() if r["Type"] == "AWS::Serverless::Function"}


def main():
    bins = sys.argv[1]
    # Resources of its own, so that no message another test left in a queue comes in.
    boot = subprocess.run([os.path.join(bins, "baton"), "bootstrap", "--prefix", f"memory-{os.getpid()}"],
                          capture_output=True, text=True)
    if boot.returncode != 0:
        sys.exit(f"baton bootstrap failed: {boot.stderr[-2000:]}")
    e = dict(os.environ)
    e.update(dict(shlex.split(line.removeprefix("export "))[0].split("=", 1)
                  for line in boot.stdout.splitlines() if line.startswith("export ")))
    sqs = boto3.client("sqs", region_name=e.get("AWS_REGION", "us-east-1"),
                       endpoint_url=e["AWS_ENDPOINT_URL"])
    sizes = memory_sizes()
    agents = {"tools": {"blob": {"url": serve(Tool) + "/blob", "description": "a megabyte",
                                 "schema": {"type": "object", "properties": {"i": {"type": "integer"}}}}},
              "agents": {"bulk": {"tools": ["blob", "request_human_feedback"],
                                  "contextBytes": 4_000_000, "maxIterations": TURNS + 5,
                                  "maxToolCallsPerTurn": TURNS * CALLS + 5}}}
    env = {k: v for k, v in e.items() if k.startswith(("AWS_", "BATON_")) or k in ("PATH", "HOME")}
    env.update(OPENAI_BASE_URL=serve(Model) + "/v1", OPENAI_API_KEY="sk-test", RUST_LOG="warn",
               BATON_AGENTS_JSON=json.dumps(agents), BATON_MODEL="openai:gpt-4o-mini")
    env.pop("BATON_AGENTS_FILE", None)
    fns = {name: Function(name, os.path.join(bins, name), env, sizes[name])
           for name in ("api", "orchestrator", "events")}
    try:
        started = time.time()
        pad = 256 * 1024 - 4096 - 16 * 1024 - 2048
        runs = [call(fns["api"], "POST", "/runs", {
            "prompt": f"run-{i:08d}: " + NOISE[:pad], "agent": "bulk",
            "metadata": {"note": "m" * 4000}, "context": {"type": "ticket", "body": "c" * 16000},
        })[0]["runId"] for i in range(RUNS)]
        batches = drain(sqs, e["BATON_STEPS_QUEUE_URL"], fns["orchestrator"])
        ctas, _ = call(fns["api"], "GET", "/ctas", query="status=pending&limit=100")
        if len(ctas["ctas"]) != RUNS:
            sys.exit(f"{len(ctas['ctas'])} CTAs pending, not {RUNS}: {[call(fns['api'], 'GET', '/runs/' + r)[0]['status'] for r in runs]}")
        for at in range(0, RUNS, 10):
            answers = [{"messageId": c["ctaId"], "receiptHandle": c["ctaId"], "attributes": {},
                        "messageAttributes": {}, "md5OfBody": "", "eventSource": "aws:sqs",
                        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:baton-cta-inbox",
                        "awsRegion": "us-east-1",
                        "body": json.dumps({"version": "0", "id": str(uuid.uuid4()),
                                            "detail-type": "cta.response", "source": "memory",
                                            "time": "2026-11-26T03:00:00Z", "region": "us-east-1",
                                            "resources": [], "detail": {"ctaId": c["ctaId"],
                                                                        "kind": "approval", "approved": True}})}
                       for c in ctas["ctas"][at:at + 10]]
            if fns["events"].invoke({"Records": answers})["batchItemFailures"]:
                sys.exit("the events function failed an answer")
        batches += drain(sqs, e["BATON_STEPS_QUEUE_URL"], fns["orchestrator"])
        for run_id in runs:
            run, _ = call(fns["api"], "GET", f"/runs/{run_id}")
            if run["status"] != "completed":
                sys.exit(f"run {run_id} is {run['status']}: {run.get('error') or run.get('lastError')}")
        call(fns["api"], "GET", "/runs", query="limit=100")
        call(fns["api"], "GET", "/ctas", query="status=answered&limit=100")
        figures = {name: round(fn.peak_mb(), 1) for name, fn in fns.items()}
        cpu = {name: round(fn.cpu_seconds(), 1) for name, fn in fns.items()}
    finally:
        for fn in fns.values():
            fn.stop()
    print(json.dumps({"runs": RUNS, "step_batches": batches, "seconds": round(time.time() - started),
                      "largest_model_request_bytes": Model.largest,
                      "largest_api_answer_bytes": fns["api"].largest_answer, "peak_rss_mb": figures, "cpu_seconds": cpu,
                      "memory_size_mb": {n: sizes[n] for n in figures}}))
    over = [n for n, mb in figures.items() if mb > HEADROOM * sizes[n]]
    if over:
        sys.exit(f"over {HEADROOM:.0%} of MemorySize: {over}")
    if fns["api"].largest_answer > LAMBDA_REPLY_BYTES:
        sys.exit(f"an api answer of {fns['api'].largest_answer} bytes passes Lambda's 6 MB")
    for name, mb in figures.items():
        print(f"ok   {name}: peak {mb} MB of {sizes[name]} MB")


if __name__ == "__main__":
    main()
