#!/usr/bin/env python3
"""Measures a Lambda function's init time: from exec of its `bootstrap` binary until it asks
the Runtime API for its first invocation, as Lambda's own INIT phase ends.

A tiny Runtime API on loopback records when `GET .../invocation/next` arrives, then the
process is stopped. The function gets a complete configuration (dummy resource names, static
credentials, and an AWS endpoint on loopback that answers the one call a cold start makes:
DynamoDB's `UpdateItem` that claims the table's store format, answered as a table this
release already claimed), so the figure is the binary's own start-up: loading, config, SDK
config, clients, catalog, and that one round trip on loopback.

    scripts/lambda_init.py BOOTSTRAP [--runs 20]

Prints one JSON line: {"binary", "bytes", "zip_bytes", "init_ms_median", "init_ms_p90",
"init_peak_rss_mb"} (the most resident memory a start took, read when it asked for work).
"""

import argparse
import http.server
import io
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import zipfile


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RuntimeApi(http.server.BaseHTTPRequestHandler):
    arrived = None  # set per run

    def do_GET(self):
        if self.path.endswith("/runtime/invocation/next") and RuntimeApi.arrived is not None:
            RuntimeApi.arrived.set()
        # Never hand out an invocation: the process is stopped once init is measured.
        time.sleep(2)
        self.send_response(503)
        self.end_headers()

    def log_message(self, *args):
        pass


class Aws(http.server.BaseHTTPRequestHandler):
    """DynamoDB's JSON protocol, for the store-format claim alone: any other call fails the
    start, and the measurement says so."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.headers.get("x-amz-target") == "DynamoDB_20120810.UpdateItem":
            body = json.dumps({"Attributes": {"fmt": {"N": "3"}, "shards": {"N": "4"}}})
            self.send_response(200)
            self.send_header("content-type", "application/x-amz-json-1.0")
        else:
            body = json.dumps({"__type": "UnknownOperationException",
                               "message": f"init measurement: {self.headers.get('x-amz-target')}"})
            self.send_response(400)
            self.send_header("content-type", "application/x-amz-json-1.0")
        data = body.encode()
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def zipped(path):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.write(path, "bootstrap")
    return len(buf.getvalue())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()

    port = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), RuntimeApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    aws_port = free_port()
    aws = http.server.ThreadingHTTPServer(("127.0.0.1", aws_port), Aws)
    threading.Thread(target=aws.serve_forever, daemon=True).start()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "AWS_LAMBDA_RUNTIME_API": f"127.0.0.1:{port}",
        "AWS_LAMBDA_FUNCTION_NAME": "init-bench",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "256",
        "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
        "AWS_LAMBDA_LOG_STREAM_NAME": "bench",
        "AWS_LAMBDA_LOG_GROUP_NAME": "bench",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{aws_port}",
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_EC2_METADATA_DISABLED": "true",
        "BATON_TABLE": "t",
        "BATON_STEPS_QUEUE_URL": "http://127.0.0.1/q/steps.fifo",
        "BATON_SUBAGENT_QUEUE_URL": "http://127.0.0.1/q/sub.fifo",
        "BATON_BUS_NAME": "b",
        "BATON_BUS_ARN": "arn:aws:events:us-east-1:000000000000:event-bus/b",
        "BATON_SCHEDULE_GROUP": "g",
        "BATON_SCHEDULER_ROLE_ARN": "arn:aws:iam::000000000000:role/s",
        "BATON_BUCKET": "files",
        "BATON_DEAD_LETTER_QUEUE_ARN": "arn:aws:sqs:us-east-1:000000000000:dlq.fifo",
        # The live function's authorizer checks watch tokens with the link key (on AWS, read
        # from Secrets Manager at start: here given, so that no secret read is timed).
        "BATON_LINK_KEY": "init-measurement-link-key-0123456789abcdef",
        "RUST_LOG": "error",
    }
    times, rss = [], []
    for _ in range(args.runs):
        RuntimeApi.arrived = threading.Event()
        start = time.perf_counter()
        proc = subprocess.Popen([args.binary], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        ok = RuntimeApi.arrived.wait(10)
        elapsed = (time.perf_counter() - start) * 1000
        rss.append(peak_rss_mb(proc.pid))
        proc.kill()
        _, err = proc.communicate()
        if not ok:
            sys.exit(f"{args.binary} never asked for an invocation: {err.decode()[-2000:]}")
        times.append(elapsed)
    server.shutdown()
    aws.shutdown()
    times.sort()
    print(json.dumps({
        "binary": args.binary,
        "bytes": os.path.getsize(args.binary),
        "zip_bytes": zipped(args.binary),
        "init_ms_median": round(statistics.median(times), 2),
        "init_ms_p90": round(times[int(len(times) * 0.9) - 1], 2),
        "init_peak_rss_mb": max(rss),
    }))


def peak_rss_mb(pid):
    """The process's peak resident memory so far (VmHWM), in MB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    return 0.0


if __name__ == "__main__":
    main()
