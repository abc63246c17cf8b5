#!/usr/bin/env python3
"""A webhook receiver for Baton's question notifications, with nothing but the standard
library: it checks each delivery's `Baton-Signature` (t=<unix seconds>,v1=<hex of
HMAC-SHA256(secret, "<t>.<body>")>), refuses one that does not verify or is over five
minutes old, and prints each verified delivery as one JSON line.

    HOOK_SECRET=... python3 examples/webhook-receiver.py PORT
"""
import hashlib
import hmac
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

SECRET = os.environ["HOOK_SECRET"].encode()
seen = set()


def verified(header: str, body: bytes) -> bool:
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    t, v1 = parts.get("t", ""), parts.get("v1", "")
    if not t.isdigit() or abs(time.time() - int(t)) > 300:
        return False
    want = hmac.new(SECRET, t.encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(want, v1)


class Hook(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if not verified(self.headers.get("Baton-Signature", ""), body):
            self.send_response(401)
            self.end_headers()
            return
        # A delivery tried again (its answer was lost) carries the same id: once is enough.
        delivery = (self.headers.get("Baton-Delivery"), json.loads(body).get("attempt"))
        if delivery not in seen:
            seen.add(delivery)
            print(body.decode(), flush=True)
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


HTTPServer(("127.0.0.1", int(sys.argv[1])), Hook).serve_forever()
