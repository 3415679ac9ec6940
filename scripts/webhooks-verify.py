#!/usr/bin/env python3
"""Verifies Standard Webhooks deliveries with implementations independent of ours, for the tests
(Tests/WebhookTests and Tests/ProcessTests): `v1` (HMAC) with the reference `standardwebhooks` package
(PyPI), `v1a` (ed25519) with pyca `cryptography`'s Ed25519, following the specification's text.

Reads one JSON object per line on stdin: {"secret": "whsec_…", "headers": {…}, "body_base64": "…"}, or
{"public_key": "whpk_…", …} for v1a, and prints one line per object: `ok` or `fail: <reason>`. Run it
with the venv's python (scripts/webhooks-venv makes .build/webhooks-venv).
"""
import base64
import binascii
import json
import sys
import time

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

TOLERANCE = 5 * 60  # seconds either way, as the reference libraries


def verify_v1a(public_key: str, headers: dict, body: bytes) -> None:
    """The specification's asymmetric check: the public key is whpk_ and the base64 of the 32-byte
    ed25519 key; the signed content is `{webhook-id}.{webhook-timestamp}.{body}`; webhook-signature is a
    space-delimited list of `<identifier>,<base64 signature>`, and one `v1a` signature must verify."""
    if not public_key.startswith("whpk_"):
        raise ValueError("not a whpk_ public key")
    key = Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key[len("whpk_"):], validate=True))
    msg_id, timestamp, signatures = (headers.get(h) for h in ("webhook-id", "webhook-timestamp", "webhook-signature"))
    if not msg_id or not timestamp or not signatures:
        raise ValueError("missing required headers")
    if abs(time.time() - int(timestamp)) > TOLERANCE:
        raise ValueError("timestamp out of tolerance")
    content = f"{msg_id}.{timestamp}.".encode() + body
    for candidate in signatures.split(" "):
        identifier, _, encoded = candidate.partition(",")
        if identifier != "v1a":
            continue
        try:
            key.verify(base64.b64decode(encoded, validate=True), content)
            return
        except (InvalidSignature, binascii.Error):
            continue
    raise ValueError("no matching v1a signature")


for line in sys.stdin:
    if not line.strip():
        continue
    item = json.loads(line)
    body = base64.b64decode(item["body_base64"])
    try:
        if "public_key" in item:
            verify_v1a(item["public_key"], item["headers"], body)
        else:
            Webhook(item["secret"]).verify(body, item["headers"])
        print("ok", flush=True)
    except (WebhookVerificationError, ValueError) as error:
        print(f"fail: {error}", flush=True)
