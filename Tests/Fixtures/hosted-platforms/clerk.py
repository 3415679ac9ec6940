"""TEST ONLY. A fake of Clerk's Backend API v1 (users, their external accounts, sessions), as the
clerk-backend-api SDK (7.0.0, Clerk-API-Version 2025-11-10) sends and parses it.

Followed:
  Backend API reference   https://clerk.com/docs/reference/backend-api
  Its OpenAPI spec         https://github.com/clerk/openapi-specs/blob/main/bapi/2025-11-10.yml (the SDK's version)
    Users                  https://clerk.com/docs/reference/backend-api/tag/users
    Sessions               https://clerk.com/docs/reference/backend-api/tag/sessions
  Rate limits             https://clerk.com/docs/guides/how-clerk-works/system-limits (429 + Retry-After, seconds)
  Errors                  https://clerk.com/docs/errors/overview
                          (ClerkErrors: {"errors": [{message, long_message, code}], "clerk_trace_id"})
  The SDK's own models     clerk_backend_api/models/{user,externalaccountwithverification,session,getuserlistop}.py

Credentials: {"secret_key": "sk_test_…", "server_url": "<url>/v1"} — `Authorization: Bearer <secret key>`.
The Apple provider is `oauth_apple`; an external account's `provider_user_id` is Apple's `sub`.

The calls an adapter makes per event (base https://api.clerk.com/v1, Bearer secret key, JSON):
  find the user by the Apple sub
      GET /v1/users?provider=oauth_apple&provider_user_id=<sub>
      -> 200 [User] ; 200 [] means "no such user" (the user list never 404s). Both parameters are needed
         together (the reference: "Must be used in combination"); the fake answers 422 otherwise. The filter
         is in the spec of every API version since clerk/openapi-specs' update of 2025-07-21; up to 100 ids.
         The Apple external account is the entry of user.external_accounts with provider "oauth_apple" and
         provider_user_id == sub; its "id" (eac_…) is what the unlink call takes. (`query` does NOT search
         external accounts: it matches emails, phones, usernames, web3 wallets, user ids and names.)
  end the user's sessions (consent revoked)
      GET /v1/sessions?user_id=<user_id>&status=active      -> 200 [Session]
      POST /v1/sessions/<session_id>/revoke (no body)       -> 200 Session with status "revoked"
      (one call per session; there is no "revoke all of a user's sessions" call.)
  unlink the Apple identity (account deleted)
      DELETE /v1/users/<user_id>/external_accounts/<eac_id> -> 200 {"object": "external_account", "id", "deleted": true}
      404 resource_not_found when the user or the external account is gone (already unlinked).
  disable (when unlinking leaves no way to sign in)
      POST /v1/users/<user_id>/ban (no body) -> 200 User with "banned": true; Clerk revokes all the user's
      sessions as part of the ban. POST /v1/users/<user_id>/unban undoes it. (The SDK also maps a 402 for
      these two: banning is a plan feature on some instances.)
  delete
      DELETE /v1/users/<user_id> -> 200 {"object": "user", "id", "deleted": true}; 404 when already gone.
  record email forwarding off/on (and anything else the adapter keeps)
      PATCH /v1/users/<user_id>/metadata {"private_metadata": {"siwa": {...}}} -> 200 User; a deep merge,
      null removes a key. (PATCH /v1/users/<id> with *_metadata replaces the field; deprecated in API version
      2025-11-10 — the SDK 7.0.0 no longer sends it — and rejected from 2026-05-12 on. PUT /v1/users/<id>/metadata
      replaces a whole metadata field.)
  team transfer (old sub -> new sub)
      Clerk's Backend API cannot add an external account to a user nor change an external account's
      provider_user_id: external accounts are created only by the user's own OAuth sign-in (Frontend API),
      and the Backend API offers only DELETE /v1/users/<id>/external_accounts/<eac_id> (checked in every
      bapi/*.yml of clerk/openapi-specs up to 2026-05-12). What an adapter can
      do: find the user by the OLD sub, record the new sub in private_metadata (PATCH …/metadata), and leave
      the Apple link as it is until the user signs in again — or, if the old link must not survive, DELETE it
      (the user's next Sign in with Apple, under the new sub, then creates or links by verified email
      according to the instance's settings). It must report the transfer as not applied to the link itself.
  "no such user" on a per-user call: 404 {"errors": [{"code": "resource_not_found", …}], "clerk_trace_id"}.
  Rate limit: 429 with Retry-After (seconds) — the SDK raises models.SDKError for a 429 and retries only 5XX
  by default (exponential backoff for up to an hour unless `retries` is given); a revoked or wrong secret
  key: 401 {"errors": [{"code": "clerk_key_invalid", …}]} (models.ClerkErrors in the SDK).

Not modelled: organizations, the Frontend API, creating external accounts (seed them through /_fake/users),
email address objects beyond one primary verified address per user, pagination totals.
"""

import re
import secrets
import time

import fakebase
from fakebase import Reply

APPLE = "oauth_apple"


def _ms():
    return int(time.time() * 1000)


def _error(status, message, long_message, code, headers=None):
    body = {"errors": [{"message": message, "long_message": long_message, "code": code}],
            "clerk_trace_id": secrets.token_hex(16)}
    return Reply(status, body, headers)


def _not_found():
    return _error(404, "not found", "Resource not found", "resource_not_found")


def _merge(target, patch):
    """Clerk's deep merge: nested objects merge, null removes a key."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = value


def _number(query, name, default):
    try:
        return max(0, int(query.get(name, default)))
    except ValueError:
        raise _error(422, "is invalid", f"{name} must be an integer", "form_param_format_invalid")


def _truthy(value):
    return str(value).lower() == "true"


ROUTES = [
    ("GET", r"/v1/users", "users"),
    ("POST", r"/v1/users", "create_user"),
    ("GET", r"/v1/users/(?P<user>[^/]+)", "get_user"),
    ("PATCH", r"/v1/users/(?P<user>[^/]+)", "update_user"),
    ("DELETE", r"/v1/users/(?P<user>[^/]+)", "delete_user"),
    ("PATCH", r"/v1/users/(?P<user>[^/]+)/metadata", "merge_metadata"),
    ("PUT", r"/v1/users/(?P<user>[^/]+)/metadata", "replace_metadata"),
    ("POST", r"/v1/users/(?P<user>[^/]+)/ban", "ban"),
    ("POST", r"/v1/users/(?P<user>[^/]+)/unban", "unban"),
    ("DELETE", r"/v1/users/(?P<user>[^/]+)/external_accounts/(?P<account>[^/]+)", "unlink"),
    ("GET", r"/v1/sessions", "sessions"),
    ("POST", r"/v1/sessions/(?P<session>[^/]+)/revoke", "revoke_session"),
]
TEMPLATES = [(method, re.compile(pattern + "$"), handler,
              re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", pattern)) for method, pattern, handler in ROUTES]


class FakePlatform(fakebase.Platform):
    name = "clerk"
    apple_provider = APPLE

    def __init__(self):
        super().__init__()
        self.api_versions = set()
        self.secret_key = "sk_test_" + secrets.token_urlsafe(30)
        self.ended_sessions = {}  # session id -> Session object (revoked or ended), for GET answers

    # --- fakebase hooks ---
    def credentials(self, url):
        return {"secret_key": self.secret_key, "server_url": f"{url}/v1"}

    def rate_limited(self):
        return ({"errors": [{"message": "Too many requests",
                             "long_message": "Too many requests, please try again later.",
                             "code": "too_many_requests"}],
                 "clerk_trace_id": secrets.token_hex(16)}, {"Retry-After": "1"})

    def unauthorized(self):
        return 401, {"errors": [{"message": "The provided Clerk Secret Key is invalid. Make sure that your Clerk "
                                            "Secret Key is correct.",
                                 "long_message": "The provided Clerk Secret Key is invalid. Make sure that your "
                                                 "Clerk Secret Key is correct.",
                                 "code": "clerk_key_invalid"}],
                     "clerk_trace_id": secrets.token_hex(16)}

    def seed(self, spec):
        identities = [{"provider": APPLE, "user_id": spec["apple_sub"]}] if spec.get("apple_sub") else []
        identities += [{"provider": p if p.startswith("oauth_") else f"oauth_{p}", "user_id": secrets.token_hex(8)}
                       for p in spec.get("other_providers", [])]
        user = self._add(spec["email"], identities, spec.get("password", False), spec.get("sessions", 0),
                         spec.get("metadata"))
        return self.store.neutral(user)

    def control(self, request):
        """GET /_fake/api_versions: the Clerk-API-Version headers the Backend API calls carried."""
        if request.path == "/_fake/api_versions":
            return 200, {"api_versions": sorted(self.api_versions)}
        return None

    def route(self, request):
        for method, pattern, handler, template in TEMPLATES:
            match = pattern.match(request.path)
            if match and method == request.method:
                self.api_versions.add(request.headers.get("Clerk-API-Version", "none"))
                self._authenticate(request)
                request.template = f"{method} {template}"
                return getattr(self, handler)(request, **match.groupdict())
        return None

    # --- the model ---
    def _authenticate(self, request):
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer "):
            raise _error(401, "Invalid Authorization header format",
                         "Invalid Authorization header format. Must be 'Bearer <YOUR_API_KEY>'",
                         "authorization_header_format_invalid")
        if self.revoked or not secrets.compare_digest(header[7:].encode(), self.secret_key.encode()):
            status, body = self.unauthorized()
            raise Reply(status, body)

    def _add(self, email, identities, password=False, sessions=0, metadata=None):
        user_id = "user_" + secrets.token_hex(13)
        user = self.store.add(user_id, email, identities, password, 0,
                              {"public_metadata": {}, "private_metadata": {}, "unsafe_metadata": {}})
        for key, value in (metadata or {}).items():
            if key in user["metadata"] and isinstance(value, dict):
                user["metadata"][key].update(value)
        now = _ms()
        user["email_id"] = "idn_" + secrets.token_hex(13)
        user["updated_at"] = now
        user["created_ms"] = now
        user["external_ids"] = {}
        for identity in user["identities"]:
            user["external_ids"][(identity["provider"], identity["user_id"])] = (
                "eac_" + secrets.token_hex(13), "idn_" + secrets.token_hex(13))
        user["session_objects"] = {}
        for _ in range(sessions):
            self._new_session(user)
        return user

    def _new_session(self, user):
        session_id = "sess_" + secrets.token_hex(13)
        user["sessions"].append(session_id)
        now = _ms()
        user["session_objects"][session_id] = {
            "object": "session", "id": session_id, "user_id": user["id"],
            "client_id": "client_" + secrets.token_hex(13),
            "status": "active", "last_active_at": now, "expire_at": now + 7 * 86400000,
            "abandon_at": now + 30 * 86400000, "updated_at": now, "created_at": now,
            "last_active_organization_id": None, "actor": None, "latest_activity": None, "tasks": None}

    def _end_session(self, user, session_id, status):
        session = user["session_objects"].pop(session_id)
        user["sessions"].remove(session_id)
        session["status"] = status
        session["updated_at"] = _ms()
        self.ended_sessions[session_id] = session
        return session

    def _user(self, user_id):
        user = self.store.users.get(user_id)
        if user is None:
            raise _not_found()
        return user

    def _external_account(self, user, identity):
        account_id, identification_id = user["external_ids"][(identity["provider"], identity["user_id"])]
        created = user["created_ms"]
        return {
            "object": "external_account", "id": account_id, "provider": identity["provider"],
            "identification_id": identification_id, "provider_user_id": identity["user_id"],
            "approved_scopes": "email name", "email_address": user["email"], "first_name": "", "last_name": "",
            "avatar_url": "", "image_url": None, "username": None, "phone_number": None, "label": None,
            "public_metadata": {}, "created_at": created, "updated_at": created, "email_address_verified": True,
            "verification": {"object": "verification_oauth", "status": "verified", "strategy": identity["provider"],
                             "attempts": None, "expire_at": created + 600000},
        }

    def _representation(self, user):
        accounts = [self._external_account(user, i) for i in user["identities"]]
        email = {
            "id": user["email_id"], "object": "email_address", "email_address": user["email"], "reserved": False,
            "verification": {"object": "verification_admin", "status": "verified", "strategy": "admin",
                             "attempts": None, "expire_at": None},
            "linked_to": [{"type": a["provider"], "id": a["id"]} for a in accounts],
            "created_at": user["created_ms"], "updated_at": user["created_ms"],
        }
        last = max((s["last_active_at"] for s in user["session_objects"].values()), default=None)
        metadata = user["metadata"]
        return {
            "id": user["id"], "object": "user", "external_id": None, "primary_email_address_id": user["email_id"],
            "primary_phone_number_id": None, "primary_web3_wallet_id": None, "username": None, "first_name": None,
            "last_name": None, "has_image": False, "image_url": "", "public_metadata": metadata["public_metadata"],
            "private_metadata": metadata["private_metadata"], "unsafe_metadata": metadata["unsafe_metadata"],
            "email_addresses": [email], "phone_numbers": [], "web3_wallets": [], "passkeys": [],
            "password_enabled": user["password"], "two_factor_enabled": False, "totp_enabled": False,
            "backup_code_enabled": False, "mfa_enabled_at": None, "mfa_disabled_at": None,
            "external_accounts": accounts, "saml_accounts": [], "enterprise_accounts": [],
            "last_sign_in_at": last, "banned": user["disabled"], "locked": False, "lockout_expires_in_seconds": None,
            "verification_attempts_remaining": 100, "updated_at": user["updated_at"], "created_at": user["created_ms"],
            "delete_self_enabled": True, "create_organization_enabled": True, "last_active_at": last,
            "legal_accepted_at": None,
        }

    # --- users ---
    def users(self, request):
        query = request.query
        if ("provider" in query) != ("provider_user_id" in query):
            raise _error(422, "is missing", "provider and provider_user_id must be used in combination",
                         "form_param_missing")
        with self.store.lock:
            users = sorted(self.store.users.values(), key=lambda u: u["created_ms"], reverse=True)
            if "provider" in query:
                wanted = set(request.query_all.get("provider_user_id", []))
                users = [u for u in users if any(i["provider"] == query["provider"] and i["user_id"] in wanted
                                                 for i in u["identities"])]
            if "email_address" in query:
                wanted = {e.lower() for e in request.query_all["email_address"]}
                users = [u for u in users if u["email"].lower() in wanted]
            if "user_id" in query:
                wanted = set(request.query_all["user_id"])
                users = [u for u in users if u["id"] in wanted]
            if "query" in query:
                needle = query["query"].lower()
                users = [u for u in users if needle in u["email"].lower() or needle in u["id"].lower()]
            if "banned" in query:
                users = [u for u in users if u["disabled"] == _truthy(query["banned"])]
            offset = _number(query, "offset", 0)
            limit = min(_number(query, "limit", 10), 500)
            return 200, [self._representation(u) for u in users[offset:offset + limit]]

    def create_user(self, request):
        body = request.json()
        emails = body.get("email_address") or []
        if not emails:
            raise _error(422, "is missing", "email_address is required", "form_param_missing")
        with self.store.lock:
            if any(u["email"].lower() == emails[0].lower() for u in self.store.users.values()):
                raise _error(422, "That email address is taken. Please try another.",
                             "That email address is taken. Please try another.", "form_identifier_exists")
            user = self._add(emails[0], (), bool(body.get("password")), 0,
                             {k: body[k] for k in ("public_metadata", "private_metadata", "unsafe_metadata")
                              if isinstance(body.get(k), dict)})
            if body.get("banned"):
                user["disabled"] = True
            return 200, self._representation(user)

    def get_user(self, request, user):
        with self.store.lock:
            return 200, self._representation(self._user(user))

    def update_user(self, request, user):
        body = request.json()
        with self.store.lock:
            record = self._user(user)
            fields = [k for k in ("public_metadata", "private_metadata", "unsafe_metadata") if k in body]
            if fields and request.headers.get("Clerk-API-Version", "") >= "2026-05-12":
                raise _error(422, "is unknown", f"{fields[0]} is not accepted here: use /v1/users/{{id}}/metadata",
                             "form_param_unknown")
            for key in fields:
                record["metadata"][key] = dict(body[key] or {})
            if body.get("sign_out_of_other_sessions"):
                for session_id in list(record["sessions"]):
                    self._end_session(record, session_id, "revoked")
            record["updated_at"] = _ms()
            return 200, self._representation(record)

    def delete_user(self, request, user):
        with self.store.lock:
            record = self._user(user)
            for session_id in list(record["sessions"]):
                self._end_session(record, session_id, "removed")
            del self.store.users[user]
            return 200, {"object": "user", "id": user, "deleted": True}

    def merge_metadata(self, request, user):
        return self._metadata(request, user, merge=True)

    def replace_metadata(self, request, user):
        return self._metadata(request, user, merge=False)

    def _metadata(self, request, user, merge):
        body = request.json()
        with self.store.lock:
            record = self._user(user)
            for key in ("public_metadata", "private_metadata", "unsafe_metadata"):
                if key not in body or body[key] is None:
                    continue
                if not isinstance(body[key], dict):
                    raise _error(422, "is invalid", f"{key} must be an object", "form_param_format_invalid")
                if merge:
                    _merge(record["metadata"][key], body[key])
                else:
                    record["metadata"][key] = dict(body[key])
            record["updated_at"] = _ms()
            return 200, self._representation(record)

    def ban(self, request, user):
        with self.store.lock:
            record = self._user(user)
            record["disabled"] = True
            for session_id in list(record["sessions"]):
                self._end_session(record, session_id, "revoked")
            record["updated_at"] = _ms()
            return 200, self._representation(record)

    def unban(self, request, user):
        with self.store.lock:
            record = self._user(user)
            record["disabled"] = False
            record["updated_at"] = _ms()
            return 200, self._representation(record)

    def unlink(self, request, user, account):
        with self.store.lock:
            record = self._user(user)
            for key, (account_id, _) in list(record["external_ids"].items()):
                if account_id == account:
                    del record["external_ids"][key]
                    record["identities"] = [i for i in record["identities"]
                                            if (i["provider"], i["user_id"]) != key]
                    record["updated_at"] = _ms()
                    return 200, {"object": "external_account", "id": account, "deleted": True}
            raise _not_found()

    # --- sessions ---
    def sessions(self, request):
        query = request.query
        if "user_id" not in query and "client_id" not in query:
            raise _error(400, "is missing", "one of user_id or client_id is required", "form_param_missing")
        with self.store.lock:
            found = []
            for user in self.store.users.values():
                found += list(user["session_objects"].values())
            found += list(self.ended_sessions.values())
            if "user_id" in query:
                found = [s for s in found if s["user_id"] == query["user_id"]]
            if "client_id" in query:
                found = [s for s in found if s["client_id"] == query["client_id"]]
            if "status" in query:
                found = [s for s in found if s["status"] == query["status"]]
            found.sort(key=lambda s: s["created_at"], reverse=True)
            offset = _number(query, "offset", 0)
            limit = min(_number(query, "limit", 10), 500)
            return 200, [dict(s) for s in found[offset:offset + limit]]

    def revoke_session(self, request, session):
        with self.store.lock:
            for user in self.store.users.values():
                if session in user["session_objects"]:
                    return 200, dict(self._end_session(user, session, "revoked"))
            if session in self.ended_sessions:
                return 200, dict(self.ended_sessions[session])
            raise _not_found()
