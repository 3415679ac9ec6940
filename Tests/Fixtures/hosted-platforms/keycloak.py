"""TEST ONLY. A fake of Keycloak's Admin REST API (users, their federated identities and sessions) and of
its OpenID Connect token endpoint (client_credentials grant), as python-keycloak (7.1.1) sends and parses it.

Followed:
  Admin REST API            https://www.keycloak.org/docs-api/latest/rest-api/index.html  (section Users)
  UsersResource / UserResource (what each call checks and answers)
      https://www.keycloak.org/docs-api/latest/javadocs/org/keycloak/services/resources/admin/UsersResource.html
      https://github.com/keycloak/keycloak/blob/main/services/src/main/java/org/keycloak/services/resources/admin/UserResource.java
  Token endpoint            https://www.keycloak.org/docs/latest/securing_apps/index.html#_token-endpoint
  Service accounts and realm-management roles
      https://www.keycloak.org/docs/latest/server_admin/index.html#_service_accounts
      https://www.keycloak.org/docs/latest/server_admin/index.html#_per_realm_admin_permissions

Credentials (flat strings): server_url, realm ("siwa"), client_id/client_secret (a confidential client
whose service account has realm-management's manage-users, view-users, query-users), and
viewer_client_id/viewer_client_secret (only view-users, which Keycloak makes a composite of query-users),
plus token_url. The identity provider alias of Sign in with Apple is `apple` (the realm also has `google`).

The calls an adapter makes per event (base <server_url>, realm R, JSON; every admin call with
`Authorization: Bearer <access_token>`):
  get a token
      POST /realms/R/protocol/openid-connect/token  (application/x-www-form-urlencoded)
           grant_type=client_credentials&client_id=…&client_secret=…  (or HTTP Basic client_id:client_secret)
      -> 200 {"access_token", "expires_in", "refresh_expires_in": 0, "token_type": "Bearer", "not-before-policy",
         "scope"}; no refresh token for this grant: ask again before expires_in runs out.
      A wrong secret or unknown client: 401 {"error": "unauthorized_client", "error_description": "Invalid client
      or Invalid client credentials"} (older releases answered "invalid_client"; key on the 401).
  find the user by the Apple sub
      GET /admin/realms/R/users?idpAlias=apple&idpUserId=<sub>&exact=true&briefRepresentation=true
      -> 200 [UserRepresentation]; 200 [] means "no such user". idpAlias/idpUserId came with KEYCLOAK-14781
      (keycloak/keycloak pull request #7319, opened 2020-08); they are there by 22.0.5 at the latest
      (keycloak/keycloak#25997) and in the 25.x/26.x UsersResource javadocs — the first release is not pinned
      down here, so an adapter should require Keycloak >= 22. GET /users/count took them only after 26.2.
      Needs query-users (or view-users); without view-users the list is empty. Both match exactly.
  end sessions (consent revoked)
      POST /admin/realms/R/users/<id>/logout (no body) -> 204; removes every session and sets the user's
      notBefore, so tokens issued earlier stop refreshing. (GET …/users/<id>/sessions -> [UserSessionRepresentation]
      to count them first.)
  unlink the Apple identity (account deleted)
      DELETE /admin/realms/R/users/<id>/federated-identity/apple -> 204; 404 {"error": "Link not found"} when
      it is already gone. GET …/users/<id>/federated-identity -> [{"identityProvider", "userId", "userName"}]
      tells whether other logins remain (with the user's `credentials`, not modelled here).
  disable
      PUT /admin/realms/R/users/<id> {"enabled": false} -> 204. Disabling does not end sessions: log out too.
  delete
      DELETE /admin/realms/R/users/<id> -> 204; 404 {"error": "User not found"} when already gone.
  record email forwarding off/on
      Keycloak has no merge: PUT /admin/realms/R/users/<id> with `attributes` REPLACES every attribute of the
      user, so GET …/users/<id>, change `attributes` (a map of string -> [string]), and PUT it back whole.
      Since Keycloak 24 the declarative user profile drops attributes it does not declare unless the realm's
      "Unmanaged attributes" policy is enabled (or the attribute, e.g. siwa_email_forwarding, is declared).
  team transfer (old sub -> new sub)
      DELETE /admin/realms/R/users/<id>/federated-identity/apple, then
      POST /admin/realms/R/users/<id>/federated-identity/apple {"identityProvider": "apple", "userId": <new sub>,
      "userName": <new sub or the email>} -> 204 (409 {"errorMessage": "User is already linked with provider"}
      when the DELETE did not happen). Keycloak does not check that the alias names a configured identity
      provider (links to unknown aliases are stored but never listed) nor that another user already holds the
      new sub (keycloak/keycloak#34608: the broker then signs in the oldest such user): look it up first with
      ?idpAlias=apple&idpUserId=<new sub>. The fake does not refuse such a duplicate either.
  "no such user" on a per-user call: 404 {"error": "User not found"}. A missing role: 403
  {"error": "HTTP 403 Forbidden"} (a client without query-users gets 403, not 404, for an unknown id).
  An expired, revoked or absent token: 401 {"error": "HTTP 401 Unauthorized"}.
  Rate limiting: Keycloak has none of its own; the fake's 429 is what a fronting proxy sends, with Retry-After
  (seconds) and an empty body. (python-keycloak's requests session, max_retries=1, lets urllib3 wait out
  Retry-After and retry a 429 once by itself; a second 429 reaches the caller as KeycloakGetError 429.)

Not modelled: groups, roles, credentials (but a password's presence: GET …/users/<id>/credentials), required actions, user profile validation, offline sessions,
consents, token expiry, the other grants, fine-grained admin permissions.
"""

import base64
import json
import re
import secrets
import time
import uuid

import fakebase
from fakebase import Reply

REALM = "siwa"
IDENTITY_PROVIDERS = {"apple", "google"}
MANAGE = {"manage-users"}
VIEW = {"view-users", "manage-users"}
QUERY = {"query-users", "view-users", "manage-users"}


def _b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _error(status, message):
    return Reply(status, {"error": message})


def _flag(value, default=False):
    return default if value is None else str(value).lower() == "true"


ROUTES = [
    ("POST", r"/realms/(?P<realm>[^/]+)/protocol/openid-connect/token", "token", None),
    ("GET", r"/admin/realms/(?P<realm>[^/]+)/users", "list_users", QUERY),
    ("GET", r"/admin/realms/(?P<realm>[^/]+)/users/count", "count_users", QUERY),
    ("POST", r"/admin/realms/(?P<realm>[^/]+)/users", "create_user", MANAGE),
    ("GET", r"/admin/realms/(?P<realm>[^/]+)/users/(?P<id>[^/]+)", "get_user", VIEW),
    ("PUT", r"/admin/realms/(?P<realm>[^/]+)/users/(?P<id>[^/]+)", "update_user", MANAGE),
    ("DELETE", r"/admin/realms/(?P<realm>[^/]+)/users/(?P<id>[^/]+)", "delete_user", MANAGE),
    ("POST", r"/admin/realms/(?P<realm>[^/]+)/users/(?P<id>[^/]+)/logout", "logout", MANAGE),
    ("GET", r"/admin/realms/(?P<realm>[^/]+)/users/(?P<id>[^/]+)/sessions", "sessions", VIEW),
    ("GET", r"/admin/realms/(?P<realm>[^/]+)/users/(?P<id>[^/]+)/federated-identity", "identities", VIEW),
    ("GET", r"/admin/realms/(?P<realm>[^/]+)/users/(?P<id>[^/]+)/credentials", "user_credentials", VIEW),
    ("POST", r"/admin/realms/(?P<realm>[^/]+)/users/(?P<id>[^/]+)/federated-identity/(?P<provider>[^/]+)", "link",
     MANAGE),
    ("DELETE", r"/admin/realms/(?P<realm>[^/]+)/users/(?P<id>[^/]+)/federated-identity/(?P<provider>[^/]+)",
     "unlink", MANAGE),
]
TEMPLATES = [(method, re.compile(pattern + "$"), handler, roles,
              re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", pattern)) for method, pattern, handler, roles in ROUTES]


class FakePlatform(fakebase.Platform):
    name = "keycloak"
    apple_provider = "apple"

    def __init__(self):
        super().__init__()
        self.clients = {
            "siwa-adapter": (secrets.token_urlsafe(24), {"manage-users", "view-users", "query-users"}),
            "siwa-viewer": (secrets.token_urlsafe(24), {"view-users", "query-users"}),
        }
        self.tokens = {}  # access token -> client id

    # --- fakebase hooks ---
    def credentials(self, url):
        return {"server_url": url, "realm": REALM, "token_url": f"{url}/realms/{REALM}/protocol/openid-connect/token",
                "client_id": "siwa-adapter", "client_secret": self.clients["siwa-adapter"][0],
                "viewer_client_id": "siwa-viewer", "viewer_client_secret": self.clients["siwa-viewer"][0]}

    def rate_limited(self):
        return None, {"Retry-After": "1"}

    def unauthorized(self):
        return 401, {"error": "HTTP 401 Unauthorized"}

    def seed(self, spec):
        identities = [{"provider": "apple", "user_id": spec["apple_sub"]}] if spec.get("apple_sub") else []
        identities += [{"provider": p, "user_id": secrets.token_hex(8)} for p in spec.get("other_providers", [])]
        with self.store.lock:
            user = self._add(spec["email"], spec["email"], identities, spec.get("password", False),
                             spec.get("metadata"))
            for _ in range(spec.get("sessions", 0)):
                user["sessions"].append(str(uuid.uuid4()))
            return self.store.neutral(user)

    def route(self, request):
        for method, pattern, handler, roles, template in TEMPLATES:
            match = pattern.match(request.path)
            if match and method == request.method:
                arguments = match.groupdict()
                if arguments.pop("realm") != REALM:
                    raise _error(404, "Realm does not exist")
                request.template = f"{method} {template}"
                if roles is not None:
                    request.roles = self._authenticate(request)
                    if "id" in arguments:
                        # Keycloak looks the user up before the operation's own check: an unknown id is 404 for
                        # any client that may query users, 403 for one that may not.
                        with self.store.lock:
                            if arguments["id"] not in self.store.users:
                                if not request.roles & QUERY:
                                    raise _error(403, "HTTP 403 Forbidden")
                                raise _error(404, "User not found")
                    if not request.roles & roles:
                        raise _error(403, "HTTP 403 Forbidden")
                return getattr(self, handler)(request, **arguments)
        return None

    # --- token endpoint ---
    def token(self, request):
        form = request.form()
        client_id, secret = form.get("client_id"), form.get("client_secret")
        header = request.headers.get("Authorization", "")
        if header.startswith("Basic "):
            try:
                client_id, _, secret = base64.b64decode(header[6:]).decode().partition(":")
            except ValueError:
                client_id = secret = None
        if form.get("grant_type") != "client_credentials":
            raise Reply(400, {"error": "unsupported_grant_type", "error_description": "Unsupported grant_type"})
        known = self.clients.get(client_id or "")
        if self.revoked or known is None or secret is None or not secrets.compare_digest(known[0].encode(),
                                                                                          secret.encode()):
            raise Reply(401, {"error": "unauthorized_client",
                              "error_description": "Invalid client or Invalid client credentials"})
        now = int(time.time())
        claims = {"exp": now + 300, "iat": now, "jti": str(uuid.uuid4()), "iss": f"/realms/{REALM}", "typ": "Bearer",
                  "azp": client_id, "sub": str(uuid.uuid5(uuid.NAMESPACE_URL, client_id)),
                  "preferred_username": f"service-account-{client_id}", "scope": "profile email",
                  "resource_access": {"realm-management": {"roles": sorted(known[1])}}}
        header_part = _b64(json.dumps({"alg": "RS256", "typ": "JWT", "kid": "fake"}).encode())
        token = f"{header_part}.{_b64(json.dumps(claims).encode())}.{_b64(secrets.token_bytes(32))}"
        self.tokens[token] = client_id
        return 200, {"access_token": token, "expires_in": 300, "refresh_expires_in": 0, "token_type": "Bearer",
                     "not-before-policy": 0, "scope": "profile email"}

    def _authenticate(self, request):
        token = request.bearer()
        client_id = self.tokens.get(token) if token else None
        if client_id is None or self.revoked:
            status, body = self.unauthorized()
            raise Reply(status, body)
        return self.clients[client_id][1]

    # --- the model ---
    def _add(self, username, email, identities, password=False, attributes=None):
        user = self.store.add(str(uuid.uuid4()), email, [], password, 0,
                              {k: list(v) if isinstance(v, list) else [str(v)] for k, v in (attributes or {}).items()})
        user["username"] = username.lower()
        user["first_name"] = user["last_name"] = None
        user["email_verified"] = False
        user["user_names"] = {}
        user["session_start"] = int(time.time() * 1000)
        for identity in identities:
            self._link(user, identity["provider"], identity["user_id"], identity.get("user_name"))
        return user

    def _link(self, user, provider, provider_user_id, user_name):
        user["identities"].append({"provider": provider, "user_id": provider_user_id})
        user["user_names"][provider] = user_name or provider_user_id

    def _identities(self, user):
        return [{"identityProvider": i["provider"], "userId": i["user_id"],
                 "userName": user["user_names"].get(i["provider"], i["user_id"])}
                for i in sorted(user["identities"], key=lambda i: i["provider"])
                if i["provider"] in IDENTITY_PROVIDERS]

    def _representation(self, user, brief=False, single=False):
        rep = {"id": user["id"], "username": user["username"], "email": user["email"],
               "emailVerified": user["email_verified"], "enabled": not user["disabled"],
               "createdTimestamp": user["created_at"] * 1000}
        for key, field in (("firstName", "first_name"), ("lastName", "last_name")):
            if user[field] is not None:
                rep[key] = user[field]
        if brief:
            return rep
        if user["metadata"]:
            rep["attributes"] = {k: list(v) for k, v in user["metadata"].items()}
        rep.update({"totp": False, "disableableCredentialTypes": [], "requiredActions": [],
                    "notBefore": user["tokens_valid_since"] or 0})
        if single:
            rep["federatedIdentities"] = self._identities(user)
            rep["access"] = {"manage": True}
        return rep

    def _user(self, user_id):
        return self.store.users[user_id]  # route() answered 404 for an unknown id

    def _matches(self, user, query):
        def text(value, wanted, exact):
            value, wanted = (value or "").lower(), wanted.lower()
            return value == wanted if exact else wanted in value

        exact = _flag(query.get("exact"))
        if "search" in query:
            term = query["search"].strip()
            fields = [user["username"], user["email"], user["first_name"], user["last_name"]]
            if term in ("", "*"):
                pass
            elif len(term) > 1 and term.startswith('"') and term.endswith('"'):
                if not any((f or "").lower() == term[1:-1].lower() for f in fields):
                    return False
            else:
                regex = re.compile(re.escape(term.lower()).replace(r"\*", ".*") + ("" if "*" in term else ".*"))
                if not any(regex.fullmatch((f or "").lower()) for f in fields):
                    return False
        else:
            for key, field in (("username", "username"), ("email", "email"), ("firstName", "first_name"),
                               ("lastName", "last_name")):
                if key in query and not text(user[field], query[key], exact):
                    return False
        if "idpAlias" in query or "idpUserId" in query:
            if not any(("idpAlias" not in query or i["provider"] == query["idpAlias"])
                       and ("idpUserId" not in query or i["user_id"] == query["idpUserId"])
                       for i in user["identities"]):
                return False
        if "enabled" in query and (not user["disabled"]) != _flag(query["enabled"]):
            return False
        if "emailVerified" in query and user["email_verified"] != _flag(query["emailVerified"]):
            return False
        for pair in query.get("q", "").split():
            key, _, value = pair.partition(":")
            if value not in user["metadata"].get(key, []):
                return False
        return True

    # --- users ---
    def list_users(self, request):
        query = request.query
        with self.store.lock:
            if not request.roles & VIEW:
                return 200, []  # query-users alone lists nothing without per-user view permission
            users = sorted((u for u in self.store.users.values() if self._matches(u, query)),
                           key=lambda u: u["username"])
            try:
                first, count = max(0, int(query.get("first", 0))), max(0, int(query.get("max", 100)))
            except ValueError:
                raise Reply(400, {"error": "invalid_request", "error_description": "first and max are integers"})
            brief = _flag(query.get("briefRepresentation"))
            return 200, [self._representation(u, brief) for u in users[first:first + count]]

    def count_users(self, request):
        with self.store.lock:
            return 200, sum(1 for u in self.store.users.values() if self._matches(u, request.query))

    def create_user(self, request):
        body = request.json()
        username = (body.get("username") or "").strip()
        if not username:
            raise Reply(400, {"errorMessage": "User name is missing"})
        email = body.get("email") or ""
        with self.store.lock:
            for other in self.store.users.values():
                if other["username"] == username.lower():
                    raise Reply(409, {"errorMessage": "User exists with same username"})
                if email and other["email"].lower() == email.lower():
                    raise Reply(409, {"errorMessage": "User exists with same email"})
            identities = [{"provider": i.get("identityProvider"), "user_id": i.get("userId"),
                           "user_name": i.get("userName")} for i in body.get("federatedIdentities") or []]
            user = self._add(username, email, identities, bool(body.get("credentials")), body.get("attributes"))
            user["disabled"] = not body.get("enabled", False)
            user["email_verified"] = bool(body.get("emailVerified", False))
            user["first_name"], user["last_name"] = body.get("firstName"), body.get("lastName")
            host = request.headers.get("Host", "127.0.0.1")
            return 201, None, {"Location": f"http://{host}/admin/realms/{REALM}/users/{user['id']}"}

    def get_user(self, request, id):
        with self.store.lock:
            return 200, self._representation(self._user(id), single=True)

    def update_user(self, request, id):
        body = request.json()
        with self.store.lock:
            user = self._user(id)
            email = body.get("email")
            if email and any(o is not user and o["email"].lower() == email.lower() for o in self.store.users.values()):
                raise Reply(409, {"errorMessage": "User exists with same email"})
            if "enabled" in body and body["enabled"] is not None:
                user["disabled"] = not body["enabled"]
            if "emailVerified" in body and body["emailVerified"] is not None:
                user["email_verified"] = bool(body["emailVerified"])
            if email:
                user["email"] = email
            for key, field in (("firstName", "first_name"), ("lastName", "last_name")):
                if key in body:
                    user[field] = body[key]
            if body.get("attributes") is not None:
                user["metadata"] = {k: list(v) if isinstance(v, list) else [str(v)]
                                    for k, v in body["attributes"].items()}
            return 204, None

    def delete_user(self, request, id):
        with self.store.lock:
            del self.store.users[id]
            return 204, None

    def logout(self, request, id):
        with self.store.lock:
            user = self._user(id)
            user["sessions"].clear()
            user["tokens_valid_since"] = int(time.time())
            return 204, None

    def sessions(self, request, id):
        with self.store.lock:
            user = self._user(id)
            start = user["session_start"]
            return 200, [{"id": s, "username": user["username"], "userId": user["id"], "ipAddress": "127.0.0.1",
                          "start": start, "lastAccess": start, "rememberMe": False, "transientUser": False,
                          "clients": {str(uuid.uuid5(uuid.NAMESPACE_URL, "siwa-web")): "siwa-web"}}
                         for s in user["sessions"]]

    def user_credentials(self, request, id):
        """[CredentialRepresentation]: a password when the user has one (the secret is never returned)."""
        with self.store.lock:
            user = self._user(id)
            return 200, ([{"id": str(uuid.uuid5(uuid.NAMESPACE_URL, user["id"] + "/password")), "type": "password",
                           "userLabel": None, "createdDate": user["created_at"] * 1000,
                           "credentialData": "{}"}] if user["password"] else [])

    def identities(self, request, id):
        with self.store.lock:
            return 200, self._identities(self._user(id))

    def link(self, request, id, provider):
        body = request.json()
        with self.store.lock:
            user = self._user(id)
            if any(i["provider"] == provider for i in user["identities"]):
                raise Reply(409, {"errorMessage": "User is already linked with provider"})
            if not body.get("userId"):
                raise Reply(400, {"errorMessage": "userId is missing"})
            self._link(user, provider, body["userId"], body.get("userName"))
            return 204, None

    def unlink(self, request, id, provider):
        with self.store.lock:
            user = self._user(id)
            kept = [i for i in user["identities"] if i["provider"] != provider]
            if len(kept) == len(user["identities"]):
                raise _error(404, "Link not found")
            user["identities"] = kept
            user["user_names"].pop(provider, None)
            return 204, None
