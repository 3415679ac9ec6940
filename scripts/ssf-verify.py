#!/usr/bin/env python3
"""Verifies Shared Signals SETs with PyJWT and pyca `cryptography`, independent of our JOSE code, for
the tests (Tests/SharedSignalsTests). Reads one JSON object per line on stdin:
{"token": "<compact JWS>", "jwks": {...}, "issuer": "...", "audience": "..."} and prints one line per
object: {"header": {...}, "claims": {...}} once the signature (RS256 only, the key chosen by kid from the
JWKS), iss and aud verify, or {"fail": "<reason>"}. Run it with .build/ssf-venv's python.
"""
import json
import sys

import jwt


def verify(request: dict) -> dict:
    header = jwt.get_unverified_header(request["token"])
    keys = jwt.PyJWKSet.from_dict(request["jwks"])
    key = next((k for k in keys.keys if k.key_id == header.get("kid")), None)
    if key is None:
        raise ValueError("no key with the header's kid in the JWKS")
    claims = jwt.decode(
        request["token"], key.key, algorithms=["RS256"], audience=request["audience"],
        issuer=request["issuer"], options={"require": ["iss", "aud", "iat", "jti"]})
    return {"header": header, "claims": claims}


for line in sys.stdin:
    if not line.strip():
        continue
    try:
        result = verify(json.loads(line))
    except Exception as error:  # every failure is the answer for that token
        result = {"fail": f"{type(error).__name__}: {error}"}
    print(json.dumps(result, sort_keys=True), flush=True)
