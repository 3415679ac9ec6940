#!/usr/bin/env python3
"""Verifies Standard Webhooks deliveries with the reference `standardwebhooks` package (PyPI): an
implementation independent of ours, for the tests (Tests/WebhookTests and Tests/ProcessTests).

Reads one JSON object per line on stdin: {"secret": "whsec_…", "headers": {…}, "body_base64": "…"} and
prints one line per object: `ok` or `fail: <reason>`. Run it with the venv's python
(scripts/webhooks-venv makes .build/webhooks-venv).
"""
import base64
import json
import sys

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

for line in sys.stdin:
    if not line.strip():
        continue
    item = json.loads(line)
    body = base64.b64decode(item["body_base64"])
    try:
        Webhook(item["secret"]).verify(body, item["headers"])
        print("ok", flush=True)
    except WebhookVerificationError as error:
        print(f"fail: {error}", flush=True)
