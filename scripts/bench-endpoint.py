#!/usr/bin/env python3
"""The outbox bench's fast endpoint: HTTP/1.1 keep-alive on 127.0.0.1, port 0 (the port is printed on
stdout), answering each consumer as its peer would: a webhook 204, a Shared Signals push 202, SendGrid's
suppression add 201 and its lookup 200 {} (not listed). Every request is counted by path prefix; GET
/count answers the counts as JSON."""
import http.server
import json
import sys
import threading

counts = {}
lock = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # a kept-alive answer's body would otherwise wait for the delayed ACK

    def log_message(self, *args):
        pass

    def answer(self, status, body=b""):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        if body:
            self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def count(self):
        key = self.path.split("/")[1] if self.path.count("/") > 0 else ""
        with lock:
            counts[key] = counts.get(key, 0) + 1

    def do_GET(self):
        if self.path == "/count":
            with lock:
                self.answer(200, json.dumps(counts).encode())
            return
        self.count()
        self.answer(200, b"{}")

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.count()
        if self.path.startswith("/ssf"):
            self.answer(202)
        elif self.path.startswith("/v3/"):
            self.answer(201, b"{}")
        else:
            self.answer(204)


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
print(server.server_address[1], flush=True)
server.serve_forever()
