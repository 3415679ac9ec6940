#!/usr/bin/env python3
"""A reference webhook endpoint for siwa-worker's Standard Webhooks deliveries.

    SIWA_WEBHOOK_SECRET=whsec_… APP_DATABASE_URL=postgresql://app@/app \\
        python3 webhook_endpoint.py --port 3000

Each POST is verified by the `standardwebhooks` package (the signature over the raw body, and a
`webhook-timestamp` within 5 minutes: a stale or replayed message is refused), then applied once:
the `webhook-id` is inserted into the app's table `processed_webhooks` in the same transaction of the
app's database as the effect (app.apply_change). Delivery is at least once — a retry after a timeout,
a `siwactl webhooks replay` — and a second copy of a message finds its id there and changes nothing.
The answer is 2xx only after that transaction committed; on any failure it is 5xx, and siwa-worker
tries again later with the same `webhook-id`.

Needs `pip install standardwebhooks psycopg[binary]`. Serve it behind your HTTPS reverse proxy.
"""
import argparse
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

import app

# The table of messages already applied. A row per webhook-id; prune rows older than the longest a
# message can still arrive (26 h of retries, plus any replay you might run) if it grows too large.
DEDUPE_SCHEMA = """
CREATE TABLE IF NOT EXISTS processed_webhooks (
    webhook_id   text PRIMARY KEY,
    processed_at timestamptz NOT NULL DEFAULT now()
)
"""

MAX_BODY = 1 << 20  # siwa's bodies are well under 1 KiB


class Handler(BaseHTTPRequestHandler):
    hook: Webhook           # set in main(): the endpoint's secret
    database_url: str

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            return self.answer(413, "too large")
        body = self.rfile.read(length)  # the raw bytes: the signature is over them, not over parsed JSON
        try:
            # Checks webhook-id, webhook-timestamp (±5 min) and the v1 signature; raises otherwise.
            event = self.hook.verify(body, dict(self.headers.items()))
        except WebhookVerificationError as error:
            return self.answer(400, f"refused: {error}")
        message_id = self.headers["webhook-id"]
        try:
            # A connection per request keeps the example short; use a pool (psycopg_pool) in production.
            with psycopg.connect(self.database_url) as conn:
                with conn.transaction():
                    # The dedupe row and the effect commit together. A concurrent copy of the same
                    # message waits here on the primary key until this transaction ends, then skips.
                    inserted = conn.execute(
                        "INSERT INTO processed_webhooks (webhook_id) VALUES (%s) ON CONFLICT DO NOTHING",
                        (message_id,)).rowcount
                    if inserted:
                        app.apply_change(conn, event["type"], event["data"])
                # Committed (the `with` block ended without an exception): only now answer 2xx.
        except Exception as error:  # the app's database is down, a bug, …: siwa-worker retries
            return self.answer(500, f"not applied: {type(error).__name__}")
        self.answer(204, f"{'applied' if inserted else 'duplicate'} {event['type']}", message_id)

    def answer(self, status: int, what: str, message_id: str = "") -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()
        # One line per request; message_id is verified here, never an attacker's text.
        print(json.dumps({"status": status, "webhook_id": message_id, "what": what}), flush=True)

    def log_message(self, *args):  # the line above is the log
        pass


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=3000)
    arguments = parser.parse_args()
    # Secrets from the environment (or a file), never the command line.
    Handler.hook = Webhook(os.environ["SIWA_WEBHOOK_SECRET"])
    Handler.database_url = os.environ["APP_DATABASE_URL"]
    with psycopg.connect(Handler.database_url) as conn:
        app.create_schema(conn)
        with conn.transaction():
            conn.execute(DEDUPE_SCHEMA)
    server = ThreadingHTTPServer((arguments.host, arguments.port), Handler)
    print(f"listening on http://{arguments.host}:{server.server_port}/", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
