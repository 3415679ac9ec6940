#!/usr/bin/env python3
"""Regenerates the seed corpus in Fuzz/corpus/<target>/ (small files, committed).

Tokens are signed with RS256 by the openssl CLI with the TEST-ONLY fixture key
(Tests/Fixtures/TEST-ONLY-rsa-2048-private-key.pem), kid "fixture", the key the `body` target trusts.
Claims follow the captured-traffic shape (events as a JSON string, event_time in milliseconds) and
Apple's documented example (events as an object, seconds, `account-deleted`, no exp). Times sit just
before the fixed "now" the harnesses use (1630085500).
"""
import base64
import json
import pathlib
import shutil
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "Fuzz" / "corpus"
KEY = ROOT / "Tests" / "Fixtures" / "TEST-ONLY-rsa-2048-private-key.pem"
PUBLIC_KEY = ROOT / "Tests" / "Fixtures" / "TEST-ONLY-rsa-2048-public-key.pem"
IAT = 1630085403


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def compact(value) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def sign(header: bytes, claims: bytes) -> str:
    signing_input = f"{b64url(header)}.{b64url(claims)}".encode()
    signature = subprocess.run(
        ["openssl", "dgst", "-sha256", "-sign", str(KEY), "-binary"],
        input=signing_input, capture_output=True, check=True).stdout
    return f"{signing_input.decode()}.{b64url(signature)}"


def modulus() -> bytes:
    text = subprocess.run(
        ["openssl", "rsa", "-pubin", "-in", str(PUBLIC_KEY), "-noout", "-modulus"],
        capture_output=True, check=True, text=True).stdout
    return bytes.fromhex(text.strip().split("=", 1)[1])


def write(target: str, name: str, data) -> None:
    directory = CORPUS / target
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_bytes(data if isinstance(data, bytes) else data.encode())


captured_event = {
    "type": "email-disabled", "sub": "001026.16112b36378440a8bd9d3a0b5ff1f1fb.1744",
    "event_time": IAT * 1000 + 648, "email": "abc123@privaterelay.appleid.com",
    "is_private_email": "true",
}
captured_claims = compact({
    "iss": "https://appleid.apple.com", "aud": "com.example.app", "iat": IAT, "exp": IAT + 86400,
    "jti": "Ybi2uRBBNTw8GxJYNvKq8Q", "events": json.dumps(captured_event, separators=(",", ":")),
})
documented_claims = compact({
    "iss": "https://appleid.apple.com", "aud": "com.example.app", "iat": IAT,
    "jti": "c1b6a4ad-5dbb-4d4e-a5f9-0a0bfe1f0f8d",
    "events": {"type": "account-deleted", "sub": "001026.16112b36378440a8bd9d3a0b5ff1f1fb.1744",
               "event_time": IAT},
})
edge_claims = {
    "aud-array": compact({
        "iss": "https://appleid.apple.com", "aud": ["com.other", "com.example.web"], "iat": IAT + 0.5,
        "exp": 1e10, "jti": "\u00e9\u2603\ud83d\ude00",
        "events": {"type": "future-type", "sub": "s", "event_time": 0, "email": None,
                   "is_private_email": False}}, ),
    "escapes": (b'{"iss":"https:\\/\\/appleid.apple.com","aud":"com.example.app","iat":1630085403,'
                b'"jti":"\\u0041\\ud83d\\ude00","events":"{\\"type\\":\\"consent-revoked\\",'
                b'\\"sub\\":\\"x\\",\\"event_time\\":1.630085403e12}"}'),
    "wrong-types": compact({"iss": 1, "aud": {}, "iat": "now", "jti": [], "events": 3}),
}
header = compact({"kid": "fixture", "alg": "RS256"})
tokens = {
    "captured": sign(header, captured_claims),
    "documented": sign(header, documented_claims),
    "aud-array": sign(header, edge_claims["aud-array"]),
}
fixture_jwk = {"kty": "RSA", "kid": "fixture", "use": "sig", "alg": "RS256", "n": b64url(modulus()),
               "e": "AQAB"}

shutil.rmtree(CORPUS, ignore_errors=True)

# base64url
for name, text in {"empty": "", "one": "QQ", "two": "QUI", "three": "QUJD", "all-sextets":
                   b64url(bytes(range(48))), "bad-length": "QUJDR", "padded": "QQ==",
                   "non-canonical": "QR", "plus-slash": "+/+/"}.items():
    write("base64url", name, text)

# jws
for name, token in tokens.items():
    write("jws", name, token)
write("jws", "alg-none", f"{b64url(compact({'alg': 'none', 'kid': 'fixture'}))}.{b64url(b'{}')}.")
write("jws", "crit", f"{b64url(compact({'alg': 'RS256', 'crit': ['exp'], 'kid': 'k'}))}.e30.AA")
write("jws", "dots", "..")

# json
write("json", "captured-claims", captured_claims)
write("json", "documented-claims", documented_claims)
for name, data in edge_claims.items():
    write("json", name, data)
write("json", "events-string", json.dumps(captured_event, separators=(",", ":")))
write("json", "numbers", b'[0,-0,1.5e308,-1E-300,123456789012345678901234567890,0.1e+2]')
write("json", "literals", b' [true , false,null,"",{},[]] ')
write("json", "deep", b"[" * 32 + b"]" * 32)
write("json", "too-deep", b"[" * 33 + b"]" * 33)
write("json", "duplicate", b'{"a":1,"a":2}')
write("json", "surrogates", b'["\\ud83d\\ude00","\\u00e9","\\ud800","\\udc00x"]')

# jwks
write("jwks", "one-key", compact({"keys": [fixture_jwk]}))
write("jwks", "apple-shape", compact({"keys": [
    dict(fixture_jwk, kid="YuyXoY"), dict(fixture_jwk, kid="fh6Bs8C"),
    {"kty": "EC", "kid": "ec", "crv": "P-256", "x": "AA", "y": "AA"},
    dict(fixture_jwk, kid="short", n=b64url(modulus()[:100])),
    dict(fixture_jwk, kid="enc", use="enc"), dict(fixture_jwk, kid="even", e="AQAA"), 7]}))
write("jwks", "duplicate-kid", compact({"keys": [fixture_jwk, fixture_jwk]}))
write("jwks", "no-keys", b'{"keys":{}}')

# rsa: length of e (mod 10), e, n, 0xFF 0x00, signature
write("rsa", "fixture", bytes([3, 1, 0, 1]) + modulus() + bytes([0xFF, 0x00]) + bytes(256))
write("rsa", "tiny", bytes([1, 3, 0xC5, 0xFF, 0x00, 0x01]))

# claims
write("claims", "captured", captured_claims)
write("claims", "documented", documented_claims)
for name, data in edge_claims.items():
    write("claims", name, data)

# body: what Apple POSTs
for name, token in tokens.items():
    write("body", name, compact({"payload": token}))
write("body", "escaped", '{ "payload" : "' + tokens["captured"].replace(".", "\\u002e") + '", "x": [1] }')
write("body", "not-a-string", b'{"payload":1}')
write("body", "empty", b"")
