"""TEST ONLY. A fake Auth0 tenant: the Management API v2 (users) and POST /oauth/token (client credentials).

Follows Auth0's public reference (no code copied):
  https://auth0.com/docs/api/authentication#client-credentials-flow              (POST /oauth/token)
  https://auth0.com/docs/api/management/v2/users/get-users                       (q, search_engine=v3)
  https://auth0.com/docs/manage-users/user-search/user-search-query-syntax
  https://auth0.com/docs/api/management/v2/users/get-users-by-id
  https://auth0.com/docs/api/management/v2/users/post-users
  https://auth0.com/docs/api/management/v2/users/patch-users-by-id             (metadata merged one level)
  https://auth0.com/docs/api/management/v2/users/delete-users-by-id
  https://auth0.com/docs/api/management/v2/users/post-identities               (link)
  https://auth0.com/docs/api/management/v2/users/delete-user-identity-by-user-id (unlink)
  https://auth0.com/docs/api/management/v2/users/delete-sessions-for-user
  https://auth0.com/docs/api/management/v2/users/delete-refresh-tokens-for-user
  https://auth0.com/docs/manage-users/sessions/manage-user-sessions-with-auth0-management-api (Enterprise only)
  https://auth0.com/docs/troubleshoot/customer-support/operational-policies/rate-limit-policy
  https://auth0.com/docs/get-started/apis/scopes/management-api-scopes
  https://github.com/auth0/node-auth0/issues/645 and #451 (DELETE of an unknown user is 204 by design)
and what auth0-python 6.8.0 sends (auth0/management/users/*, auth0/authentication/get_token.py).

Credentials (serve.py prints them): domain (host:port; the tenant's https://{domain} is http here),
client_id/client_secret with every scope the adapter needs, limited_client_id/limited_client_secret with
only read:users and update:users (for least-privilege tests), audience = {url}/api/v2/.
Tokens are opaque strings here (Auth0 issues RS256 JWTs; an adapter must not parse them).

Model: user ids are "<provider>|<id>": an Apple user is "apple|<sub>" with identities[0] = {"connection":
"apple", "provider": "apple", "user_id": "<sub>", "isSocial": true}. A seeded user with a password is a
database user "auth0|..." (connection Username-Password-Authentication) with Apple linked as a secondary
identity. metadata = app_metadata; sessions = Auth0 sessions; tokens_valid_since = the time refresh
tokens were last deleted.

Errors, Auth0's shape: {"statusCode", "error", "message", "errorCode"?}. No such user: GET/PATCH answer
404 {"statusCode": 404, "error": "Not Found", "message": "The user does not exist.", "errorCode":
"inexistent_user"}; DELETE /api/v2/users/{id} answers 204 whether or not the user exists. A token lacking
the endpoint's scope: 403 {"errorCode": "insufficient_scope", "message": "Insufficient scope, expected any
of: <scope>"}. Bad token: 401 {"error": "Unauthorized", "message": "Invalid token"}. Rate limit: 429
{"errorCode": "too_many_requests"} with x-ratelimit-limit, x-ratelimit-remaining (0) and x-ratelimit-reset
(epoch seconds); auth0-python's Management client retries a 429 twice, waiting until x-ratelimit-reset.
/oauth/token refuses a bad client with 401 {"error": "access_denied", "error_description": "Unauthorized"}
and an unknown audience with 403 {"error": "access_denied", "error_description": "Service not enabled
within domain: <audience>"}.
Session and refresh-token endpoints need an Enterprise plan. Auth0 does not document the answer on a
tenant without the feature; this fake (POST /_fake/options {"sessions_api": false}) answers both with
403 {"error": "Forbidden", "errorCode": "operation_not_supported", "message": "This feature is not enabled
for this tenant."} -- an ASSUMPTION: an adapter should treat a 403 whose errorCode is not
insufficient_scope as "not available" and fall back to blocking the user.

The calls an adapter makes per event (Bearer token from POST /oauth/token {"grant_type":
"client_credentials", "client_id", "client_secret", "audience": "https://{domain}/api/v2/"}; cache it
for expires_in):
  find the user by the Apple sub:
      GET /api/v2/users?q=identities.user_id:"<sub>" AND identities.provider:"apple"&search_engine=v3
      [read:users] -> 200 [users] (or {"users": [...], "total"} with include_totals=true); none = empty list.
      The search index is eventually consistent (seconds). For the primary identity the direct read is
      GET /api/v2/users/apple%7C<sub> -> 200 user, or 404 errorCode inexistent_user = no such user.
  consent revoked (end sessions): DELETE /api/v2/users/{id}/sessions [delete:sessions] -> 202, and
      DELETE /api/v2/users/{id}/refresh-tokens [delete:refresh_tokens] -> 202; 404 = no such user;
      403 non-scope = feature not on the tenant (see above): block instead or record it.
  account deleted: Apple as the primary identity (user id apple|<sub>): DELETE /api/v2/users/{id}
      [delete:users] -> 204 (also 204 for an unknown id; the primary identity cannot be unlinked), or
      PATCH /api/v2/users/{id} {"blocked": true} [update:users] -> 200 user.
      Apple as a secondary identity: DELETE /api/v2/users/{primary id}/identities/apple/<sub>
      [update:users] -> 200 [remaining identities]; Auth0 then creates a standalone user apple|<sub>,
      which the adapter deletes with DELETE /api/v2/users/apple%7C<sub>.
  email forwarding off/on: PATCH /api/v2/users/{id} {"app_metadata": {"apple_email_forwarding": false}}
      [update:users] -> 200; app_metadata is merged one level deep (a key set to null is removed).
  team transfer (old sub -> new sub): an identity's user_id (and the user_id "apple|<old sub>") cannot be
      changed, and POST /api/v2/users cannot create a social (apple) user. What can be done: record the
      new sub, PATCH {"app_metadata": {"apple_sub": "<new sub>", "apple_transferred_from": "<old sub>"}};
      once the user signs in with the new sub (a new user apple|<new sub> appears), link it into the old
      one: POST /api/v2/users/{old user id}/identities {"provider": "apple", "user_id": "<new sub>"}
      [update:users] -> 201 [identities] (the secondary user disappears into the primary); a login Action
      can do the same. Apple's old sub then stays as the (dead) primary identity.
Not modelled: organizations, roles, user_metadata search, Lucene beyond AND of field:"value" terms,
pagination beyond page/per_page, GET /api/v2/users-by-email, jobs (bulk import), custom domains.
"""

import json
import time
from datetime import datetime, timezone
from urllib.parse import unquote

import fakebase

FULL_SCOPES = ("read:users", "update:users", "delete:users", "create:users", "read:sessions", "delete:sessions",
               "read:refresh_tokens", "delete:refresh_tokens")
LIMITED_SCOPES = ("read:users", "update:users")
DATABASE = "Username-Password-Authentication"
CONNECTIONS = {"auth0": DATABASE, "apple": "apple", "google-oauth2": "google-oauth2"}
STATUS_TEXT = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 409: "Conflict",
               429: "Too Many Requests"}


def auth0_error(status, message, code=None):
    body = {"statusCode": status, "error": STATUS_TEXT.get(status, "Error"), "message": message}
    if code:
        body["errorCode"] = code
    return fakebase.Reply(status, body)


def iso(epoch):
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


class FakePlatform(fakebase.Platform):
    name = "auth0"
    apple_provider = "apple"

    def __init__(self):
        super().__init__()
        self.url = None
        self.sessions_api = True
        self.clients = {
            "siwa-full-client": ("full-secret-" + fakebase.secrets.token_hex(8), FULL_SCOPES),
            "siwa-limited-client": ("limited-secret-" + fakebase.secrets.token_hex(8), LIMITED_SCOPES),
        }
        self.token_scopes = {}

    def credentials(self, url):
        self.url = url
        full, limited = self.clients["siwa-full-client"], self.clients["siwa-limited-client"]
        return {"domain": url.split("//", 1)[1], "token_url": f"{url}/oauth/token", "audience": f"{url}/api/v2/",
                "client_id": "siwa-full-client", "client_secret": full[0], "scopes": " ".join(full[1]),
                "limited_client_id": "siwa-limited-client", "limited_client_secret": limited[0],
                "limited_scopes": " ".join(limited[1])}

    def control(self, request):
        if request.path == "/_fake/options" and request.method == "POST":
            spec = request.json()
            if "sessions_api" in spec:
                self.sessions_api = bool(spec["sessions_api"])
            return 200, {"sessions_api": self.sessions_api}
        return None

    def rate_limited(self):
        return ({"statusCode": 429, "error": "Too Many Requests", "message": "Global limit has been reached",
                 "errorCode": "too_many_requests"},
                {"x-ratelimit-limit": "50", "x-ratelimit-remaining": "0",
                 "x-ratelimit-reset": str(int(time.time()) + 2)})

    def unauthorized(self):
        return 401, {"statusCode": 401, "error": "Unauthorized", "message": "Invalid token",
                     "attributes": {"error": "Invalid token"}}

    # --- POST /oauth/token ---
    def token(self, request):
        body = request.json() if "json" in request.headers.get("Content-Type", "") else request.form()
        if body.get("grant_type") != "client_credentials":
            raise fakebase.Reply(403, {"error": "unauthorized_client",
                                       "error_description": "Grant type not allowed for the client."})
        client = self.clients.get(body.get("client_id") or "")
        if client is None or body.get("client_secret") != client[0] or self.revoked:
            raise fakebase.Reply(401, {"error": "access_denied", "error_description": "Unauthorized"})
        if body.get("audience") != f"{self.url}/api/v2/":
            raise fakebase.Reply(403, {"error": "access_denied", "error_description":
                                       f"Service not enabled within domain: {body.get('audience')}"})
        token = self.issue_token()
        self.token_scopes[token] = set(client[1])
        return 200, {"access_token": token, "scope": " ".join(client[1]), "expires_in": 86400,
                     "token_type": "Bearer"}

    def require(self, request, scope):
        self.require_token(request)
        if scope not in self.token_scopes.get(request.bearer(), ()):
            raise auth0_error(403, f"Insufficient scope, expected any of: {scope}", "insufficient_scope")

    # --- the Management API ---
    def route(self, request):
        if request.path == "/oauth/token" and request.method == "POST":
            request.template = "POST /oauth/token"
            return self.token(request)
        if not request.path.startswith("/api/v2/users"):
            return None
        parts = [unquote(p) for p in request.path[len("/api/v2/"):].split("/")]
        method = request.method
        with self.store.lock:
            if parts == ["users"]:
                request.template = f"{method} /api/v2/users"
                if method == "GET":
                    self.require(request, "read:users")
                    return self.search(request)
                if method == "POST":
                    self.require(request, "create:users")
                    return self.create(request.json())
                return None
            if len(parts) == 2:
                request.template = f"{method} /api/v2/users/{{id}}"
                scope = {"GET": "read:users", "PATCH": "update:users", "DELETE": "delete:users"}.get(method)
                if scope is None:
                    return None
                self.require(request, scope)
                if method == "DELETE":
                    self.store.users.pop(parts[1], None)
                    return 204, None
                user = self.existing(parts[1])
                if method == "PATCH":
                    self.patch(user, request.json())
                return 200, self.render(user)
            if len(parts) == 3 and parts[2] in ("sessions", "refresh-tokens"):
                request.template = f"{method} /api/v2/users/{{id}}/{parts[2]}"
                kind = parts[2].replace("-", "_")
                if method not in ("GET", "DELETE"):
                    return None
                self.require(request, ("read:" if method == "GET" else "delete:") + kind)
                if not self.sessions_api:
                    raise auth0_error(403, "This feature is not enabled for this tenant.", "operation_not_supported")
                user = self.existing(parts[1], "User not found")
                return self.sessions(user, kind, method)
            if len(parts) == 3 and parts[2] == "identities" and method == "POST":
                request.template = "POST /api/v2/users/{id}/identities"
                self.require(request, "update:users")
                return self.link(self.existing(parts[1]), request.json())
            if len(parts) == 5 and parts[2] == "identities" and method == "DELETE":
                request.template = "DELETE /api/v2/users/{id}/identities/{provider}/{user_id}"
                self.require(request, "update:users")
                return self.unlink(self.existing(parts[1]), parts[3], parts[4])
        return None

    def existing(self, user_id, message="The user does not exist."):
        user = self.store.users.get(user_id)
        if user is None:
            raise auth0_error(404, message, "inexistent_user")
        return user

    @staticmethod
    def identity(identity):
        provider = identity["provider"]
        return {"connection": CONNECTIONS.get(provider, provider), "provider": provider,
                "user_id": identity["user_id"], "isSocial": provider != "auth0"}

    def render(self, user):
        rendered = {"user_id": user["id"], "email": user["email"], "email_verified": True,
                    "created_at": iso(user["created_at"]), "updated_at": iso(user.get("updated_at", user["created_at"])),
                    "identities": [self.identity(i) for i in user["identities"]],
                    "app_metadata": user["metadata"], "user_metadata": user.get("user_metadata", {}),
                    "name": user["email"], "nickname": (user["email"] or "user").split("@")[0],
                    "picture": "https://s.gravatar.com/avatar/0?s=480&r=pg&d=mp", "logins_count": 1}
        if user["disabled"]:
            rendered["blocked"] = True
        return rendered

    def search(self, request):
        engine = request.query.get("search_engine", "v3")
        if engine != "v3":
            raise auth0_error(400, f"The search engine {engine} is no longer available; use v3.",
                              "operation_not_supported")
        terms = self.parse_query(request.query.get("q", ""))
        users = sorted((u for u in self.store.users.values() if all(self.matches(u, f, v) for f, v in terms)),
                       key=lambda u: u["id"])
        page, per_page = int(request.query.get("page", 0)), min(int(request.query.get("per_page", 50)), 100)
        chunk = [self.render(u) for u in users[page * per_page:(page + 1) * per_page]]
        if request.query.get("include_totals") == "true":
            return 200, {"start": page * per_page, "limit": per_page, "length": len(chunk), "total": len(users),
                         "users": chunk}
        return 200, chunk

    @staticmethod
    def parse_query(q):
        """field:"value" or field:value terms joined by AND (the subset an adapter needs)."""
        terms = []
        for term in [t.strip() for t in q.replace(" and ", " AND ").split(" AND ") if t.strip()]:
            field, sep, value = term.partition(":")
            if not sep or not field or not value or " " in field or (" " in value and not value.startswith('"')):
                raise auth0_error(400, f"Query validation error: 'Invalid query: {q}'", "invalid_query_string")
            terms.append((field, value[1:-1] if value.startswith('"') and value.endswith('"') else value))
        return terms

    def matches(self, user, field, value):
        if field.startswith("identities."):
            key = field[len("identities."):]
            return any(str(self.identity(i).get(key)) == value for i in user["identities"])
        if field.startswith("app_metadata."):
            return str(user["metadata"].get(field[len("app_metadata."):])) == value
        if field == "user_id":
            return user["id"] == value
        if field == "email":
            return (user["email"] or "").lower() == value.lower()
        if field == "blocked":
            return str(user["disabled"]).lower() == value.lower()
        raise auth0_error(400, f"Query validation error: unsupported field {field}", "invalid_query_string")

    def create(self, body):
        connection = body.get("connection")
        if not connection:
            raise auth0_error(400, "Payload validation error: 'Missing required property: connection'.",
                              "invalid_body")
        if connection != DATABASE:
            raise auth0_error(400, "Connection is not supported for this operation: user creation requires a "
                                   "database or passwordless connection.", "operation_not_supported")
        email = body.get("email")
        if not email or not body.get("password"):
            raise auth0_error(400, "Payload validation error: 'Missing required property: email, password'.",
                              "invalid_body")
        if any((u["email"] or "").lower() == email.lower() and u["identities"]
               and u["identities"][0]["provider"] == "auth0" for u in self.store.users.values()):
            raise auth0_error(409, "The user already exists.", "auth0_idp_error")
        local = body.get("user_id") or self.store.new_id()
        user = self.store.add(f"auth0|{local}", email, [{"provider": "auth0", "user_id": local}], password=True,
                              metadata=body.get("app_metadata"))
        user["disabled"] = bool(body.get("blocked", False))
        return 201, self.render(user)

    @staticmethod
    def patch(user, body):
        if "blocked" in body:
            user["disabled"] = bool(body["blocked"])
        if "email" in body:
            user["email"] = body["email"]
        for key, target in (("app_metadata", "metadata"), ("user_metadata", "user_metadata")):
            if key in body:
                merged = dict(user.get(target) or {})
                for name, value in (body[key] or {}).items():
                    if value is None:
                        merged.pop(name, None)
                    else:
                        merged[name] = value
                user[target] = merged
        user["updated_at"] = int(time.time())

    def sessions(self, user, kind, method):
        if method == "GET":
            if kind == "sessions":
                return 200, {"sessions": [{"id": s, "user_id": user["id"], "created_at": iso(user["created_at"])}
                                          for s in user["sessions"]]}
            return 200, {"tokens": []}
        if kind == "sessions":
            user["sessions"] = []
        else:
            user["tokens_valid_since"] = int(time.time())
        return 202, {}

    def link(self, primary, body):
        provider, secondary_id = body.get("provider"), str(body.get("user_id") or "")
        if not provider or not secondary_id:
            raise auth0_error(400, "Payload validation error: 'Missing required property: provider, user_id'.",
                              "invalid_body")
        secondary = self.store.users.get(f"{provider}|{secondary_id}")
        if secondary is None or secondary is primary:
            raise auth0_error(400, "The secondary user does not exist.", "invalid_body")
        primary["identities"] += secondary["identities"]
        primary["sessions"] += secondary["sessions"]
        del self.store.users[secondary["id"]]
        return 201, [self.identity(i) for i in primary["identities"]]

    def unlink(self, primary, provider, user_id):
        if primary["identities"] and primary["identities"][0] == {"provider": provider, "user_id": user_id}:
            raise auth0_error(400, "Main identity cannot be removed.", "invalid_body")
        linked = [i for i in primary["identities"][1:] if i["provider"] == provider and i["user_id"] == user_id]
        for identity in linked:
            primary["identities"].remove(identity)
            standalone = self.store.add(f"{provider}|{user_id}", primary["email"], [identity])
            standalone["created_at"] = int(time.time())
        return 200, [self.identity(i) for i in primary["identities"]]

    def seed(self, spec):
        identities = []
        if spec.get("password"):
            identities.append({"provider": "auth0", "user_id": self.store.new_id()})
        if spec.get("apple_sub"):
            identities.append({"provider": "apple", "user_id": spec["apple_sub"]})
        identities += [{"provider": p, "user_id": str(10 ** 20 + self.store.serial * 7919)}
                       for p in spec.get("other_providers", [])]
        if not identities:
            identities.append({"provider": "auth0", "user_id": self.store.new_id()})
        primary = identities[0]
        user = self.store.add(f"{primary['provider']}|{primary['user_id']}", spec["email"], identities,
                              spec.get("password", False), spec.get("sessions", 0), spec.get("metadata"))
        return self.store.neutral(user)
