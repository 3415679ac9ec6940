"""TEST ONLY. What every fake hosted auth platform shares: the server, the users, the faults, the control API.

A platform module (firebase.py, auth0.py, clerk.py, keycloak.py) subclasses `Platform`: it maps its
vendor's admin API (paths, bodies, errors, rate-limit headers, the token endpoint) onto `Store`, the
neutral model below. `serve.py PLATFORM` runs one on 127.0.0.1 port 0 and prints one JSON line:
{"url": ..., "credentials": {...}}; it stops on SIGTERM or when its parent exits, so a dead test leaves
no server behind.

The control API (under /_fake/, no credentials; never part of a vendor's API):
  POST /_fake/users   {"email", "apple_sub"?, "other_providers"?: [..], "password"?: bool, "sessions"?: n}
                      -> the user in the neutral shape (its "id" is the platform's user id)
  GET  /_fake/state   -> {"users": [neutral user, ...]} sorted by id
  POST /_fake/faults  {"rate_limit"?: n, "outage"?: n, "hang"?: seconds, "revoke_credentials"?: bool}
                      the next n admin calls answer 429 (with the platform's retry header) or 503; every
                      admin call hangs `hang` seconds (0 ends it); revoked credentials get the platform's
                      401 for tokens already issued and refuse new ones
  GET  /_fake/calls   -> {"calls": {"METHOD /path-template": n, ...}, "total": n}
  POST /_fake/reset   -> forgets users, faults, calls
A neutral user: {"id", "email", "disabled", "identities": [{"provider", "user_id"}], "sessions": n,
"password": bool, "tokens_valid_since": epoch seconds or null, "metadata": {...}}.
"""

import json
import os
import secrets
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import urllib.request
from urllib.parse import parse_qs, urlsplit


class Store:
    """The users of one fake platform, behind one lock (handlers run on threads)."""

    def __init__(self):
        self.lock = threading.RLock()
        self.users = {}
        self.serial = 0

    def new_id(self, prefix=""):
        with self.lock:
            self.serial += 1
            return f"{prefix}{self.serial:06d}{secrets.token_hex(4)}"

    def add(self, user_id, email, identities=(), password=False, sessions=0, metadata=None):
        with self.lock:
            user = {
                "id": user_id,
                "email": email,
                "disabled": False,
                "identities": [dict(i) for i in identities],
                "sessions": [self.new_id("sess_") for _ in range(sessions)],
                "password": password,
                "tokens_valid_since": None,
                "metadata": dict(metadata or {}),
                "created_at": int(time.time()),
            }
            self.users[user_id] = user
            return user

    def find_identity(self, provider, user_id):
        with self.lock:
            for user in self.users.values():
                for identity in user["identities"]:
                    if identity["provider"] == provider and identity["user_id"] == user_id:
                        return user
            return None

    def neutral(self, user):
        return {
            "id": user["id"],
            "email": user["email"],
            "disabled": user["disabled"],
            "identities": sorted(user["identities"], key=lambda i: (i["provider"], i["user_id"])),
            "sessions": len(user["sessions"]),
            "password": user["password"],
            "tokens_valid_since": user["tokens_valid_since"],
            "metadata": user["metadata"],
        }


class Reply(Exception):
    """Raised by a handler to answer with a status, a JSON body and headers."""

    def __init__(self, status, body=None, headers=None):
        super().__init__(status)
        self.status, self.body, self.headers = status, body, headers or {}


class Request:
    def __init__(self, method, path, query, headers, body):
        self.method, self.path, self.query, self.headers, self.raw = method, path, query, headers, body

    def json(self):
        try:
            return json.loads(self.raw or b"{}")
        except ValueError:
            raise Reply(400, {"error": "body is not JSON"})

    def form(self):
        return {k: v[0] for k, v in parse_qs(self.raw.decode()).items()}

    def bearer(self):
        value = self.headers.get("Authorization", "")
        return value[7:] if value.startswith("Bearer ") else None


class Platform:
    """One vendor's API. Subclasses set `name`, `apple_provider` and implement the methods below."""

    name = "platform"
    apple_provider = "apple"

    def __init__(self):
        self.store = Store()
        self.revoked = False
        self.issued_tokens = set()

    # --- what a platform module implements ---
    def credentials(self, url):
        """The credentials (a dict) a client of this fake uses, printed by serve.py."""
        raise NotImplementedError

    def route(self, request):
        """Answers one vendor API request: returns (status, body[, headers]) or raises Reply.
        Returns None for a path it does not know (404). Token endpoints are vendor API too."""
        raise NotImplementedError

    def rate_limited(self):
        """The vendor's 429: (body, headers), e.g. a Retry-After header."""
        return {"error": "rate limited"}, {"Retry-After": "1"}

    def unauthorized(self):
        """The vendor's answer to an expired or revoked credential: (status, body)."""
        return 401, {"error": "unauthorized"}

    def control(self, request):
        """Platform-specific control paths under /_fake/ (e.g. POST /_fake/options); None if unknown."""
        return None

    def seed(self, spec):
        """Adds a user from the control API's neutral spec; returns the neutral user."""
        identities = [{"provider": self.apple_provider, "user_id": spec["apple_sub"]}] if spec.get("apple_sub") else []
        identities += [{"provider": p, "user_id": self.store.new_id()} for p in spec.get("other_providers", [])]
        user = self.store.add(self.store.new_id(), spec["email"], identities, spec.get("password", False),
                              spec.get("sessions", 0), spec.get("metadata"))
        return self.store.neutral(user)

    # --- shared helpers for platform modules ---
    def issue_token(self):
        token = secrets.token_urlsafe(24)
        self.issued_tokens.add(token)
        return token

    def require_token(self, request):
        """Checks a bearer token this fake issued and that is not revoked."""
        token = request.bearer()
        if token is None or token not in self.issued_tokens or self.revoked:
            status, body = self.unauthorized()
            raise Reply(status, body)


class Faults:
    def __init__(self):
        self.lock = threading.Lock()
        self.rate_limit = 0
        self.outage = 0
        self.hang = 0.0
        self.calls = {}

    def next(self):
        with self.lock:
            if self.rate_limit > 0:
                self.rate_limit -= 1
                return "rate_limit"
            if self.outage > 0:
                self.outage -= 1
                return "outage"
            return None


def control(url, path, body=None):
    """A call of a running fake's control API (GET without `body`, else POST of it as JSON): its JSON answer."""
    request = urllib.request.Request(f"{url}/_fake/{path}", data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"},
                                     method="GET" if body is None else "POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def make_server(platform):
    faults = Faults()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out in two writes: without this, Nagle's algorithm holds the body back until
        # the client's delayed ACK (40 ms per keep-alive answer).
        disable_nagle_algorithm = True

        def log_message(self, *args):
            pass

        def send(self, status, body=None, headers=None):
            data = b"" if body is None else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        def handle_any(self):
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            request = Request(self.command, parts.path, {k: v[0] for k, v in parse_qs(parts.query).items()},
                              self.headers, raw)
            request.query_all = parse_qs(parts.query)  # every value of a repeated parameter
            try:
                if parts.path.startswith("/_fake/"):
                    self.send(*control(request))
                    return
                if faults.hang:
                    time.sleep(faults.hang)
                fault = faults.next()
                if fault == "rate_limit":
                    body, headers = platform.rate_limited()
                    self.send(429, body, headers)
                    return
                if fault == "outage":
                    self.send(503, {"error": "service unavailable"})
                    return
                answer = platform.route(request)
                if answer is None:
                    raise Reply(404, {"error": f"no route {request.method} {request.path}"})
                key = getattr(request, "template", f"{request.method} {request.path}")
                with faults.lock:
                    faults.calls[key] = faults.calls.get(key, 0) + 1
                self.send(*answer)
            except Reply as reply:
                self.send(reply.status, reply.body, reply.headers)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = handle_any

    def control(request):
        if request.path == "/_fake/users" and request.method == "POST":
            return 200, platform.seed(request.json())
        if request.path == "/_fake/state":
            with platform.store.lock:
                users = [platform.store.neutral(u) for u in platform.store.users.values()]
            return 200, {"users": sorted(users, key=lambda u: u["id"])}
        if request.path == "/_fake/faults" and request.method == "POST":
            spec = request.json()
            with faults.lock:
                faults.rate_limit = int(spec.get("rate_limit", faults.rate_limit))
                faults.outage = int(spec.get("outage", faults.outage))
                faults.hang = float(spec.get("hang", faults.hang))
            if "revoke_credentials" in spec:
                platform.revoked = bool(spec["revoke_credentials"])
            return 200, {}
        if request.path == "/_fake/calls":
            with faults.lock:
                return 200, {"calls": dict(faults.calls), "total": sum(faults.calls.values())}
        if request.path == "/_fake/reset" and request.method == "POST":
            with platform.store.lock:
                platform.store.users.clear()
            with faults.lock:
                faults.rate_limit = faults.outage = 0
                faults.hang = 0.0
                faults.calls.clear()
            platform.revoked = False
            return 200, {}
        answer = platform.control(request)
        if answer is not None:
            return answer
        return 404, {"error": "no such control path"}

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    return server


def serve(platform):
    """Runs `platform` on 127.0.0.1 port 0 until its parent exits; prints {"url", "credentials"} first."""
    parent = os.getppid()
    server = make_server(platform)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdout.write(json.dumps({"url": url, "credentials": platform.credentials(url)}) + "\n")
    sys.stdout.flush()
    while os.getppid() == parent:
        time.sleep(0.2)
    server.shutdown()
