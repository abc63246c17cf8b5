#!/usr/bin/env python3
"""A test receiver of OTLP/HTTP traces: POST /v1/traces (binary protobuf, plain or gzip),
decoded with the official protobuf definitions (PyPI `opentelemetry-proto`); each span is
appended to OUT as one JSON line. Prints its URL once it listens.

    receiver.py --port 0 --out spans.jsonl
"""
import argparse
import gzip
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status


def value(v):
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return attributes(v.kvlist_value.values)
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind)


def attributes(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


def record(resource, scope, s):
    return {
        "trace_id": s.trace_id.hex(),
        "span_id": s.span_id.hex(),
        "parent_span_id": s.parent_span_id.hex() or None,
        "name": s.name,
        "kind": Span.SpanKind.Name(s.kind),
        "start_ns": s.start_time_unix_nano,
        "end_ns": s.end_time_unix_nano,
        "attributes": attributes(s.attributes),
        "status": Status.StatusCode.Name(s.status.code),
        "links": [
            {"trace_id": l.trace_id.hex(), "span_id": l.span_id.hex(),
             "attributes": attributes(l.attributes)}
            for l in s.links
        ],
        "resource": resource,
        "scope": scope,
    }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    out = "spans.jsonl"
    lock = threading.Lock()

    def log_message(self, *args):
        pass

    def reply(self, code, body=b"", ctype="application/x-protobuf"):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.rstrip("/") != "/v1/traces":
            return self.reply(404, b"not found", "text/plain")
        if (self.headers.get("Content-Type") or "").split(";")[0].strip() != "application/x-protobuf":
            return self.reply(415, b"only application/x-protobuf", "text/plain")
        try:
            if (self.headers.get("Content-Encoding") or "").lower() == "gzip":
                body = gzip.decompress(body)
            req = ExportTraceServiceRequest()
            req.ParseFromString(body)
        except Exception as e:  # a malformed body: 400, which the SDK does not retry
            return self.reply(400, str(e).encode(), "text/plain")
        lines = []
        for rs in req.resource_spans:
            resource = attributes(rs.resource.attributes)
            for ss in rs.scope_spans:
                scope = {"name": ss.scope.name, "version": ss.scope.version}
                lines.extend(json.dumps(record(resource, scope, s)) for s in ss.spans)
        with self.lock, open(self.out, "a") as f:
            f.writelines(line + "\n" for line in lines)
        self.reply(200, ExportTraceServiceResponse().SerializeToString())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    Handler.out = a.out
    server = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
