#!/usr/bin/env python3
"""Signs requests with botocore's SigV4Auth, AWS's own implementation, for the SES tests.

Reads one JSON object a line: method, url, headers ([name, value] pairs, X-Amz-Date among them),
body_base64, access_key, secret_key, session_token (or null), region, service. Writes for each the
Authorization header botocore computes for the same request at the same X-Amz-Date.
"""
import base64
import json
import sys

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials


def sign(item):
    headers = dict(item["headers"])
    request = AWSRequest(method=item["method"], url=item["url"], data=base64.b64decode(item["body_base64"]),
                         headers=headers)
    auth = SigV4Auth(Credentials(item["access_key"], item["secret_key"], item["session_token"]),
                     item["service"], item["region"])
    # add_auth would stamp the current time; the signing steps below take the request's own X-Amz-Date.
    request.context["timestamp"] = headers["X-Amz-Date"]
    canonical = auth.canonical_request(request)
    string_to_sign = auth.string_to_sign(request, canonical)
    signature = auth.signature(string_to_sign, request)
    return "AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s" % (
        item["access_key"], auth.credential_scope(request), auth.signed_headers(auth.headers_to_sign(request)),
        signature)


for line in sys.stdin:
    if line.strip():
        print(sign(json.loads(line)))
