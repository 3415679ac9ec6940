"""TEST ONLY. A fake Firebase Authentication / Identity Platform admin API (Identity Toolkit v1).

Follows Google's public reference (no code copied):
  https://cloud.google.com/identity-platform/docs/reference/rest/v1/projects.accounts
  https://cloud.google.com/identity-platform/docs/reference/rest/v1/accounts/lookup
  https://cloud.google.com/identity-platform/docs/reference/rest/v1/accounts/update   (SetAccountInfoRequest)
  https://cloud.google.com/identity-platform/docs/reference/rest/v1/accounts/delete
  https://cloud.google.com/identity-platform/docs/reference/rest/v1/projects.accounts/batchCreate
  https://cloud.google.com/identity-platform/docs/reference/rest/v1/projects.accounts/batchGet
  https://developers.google.com/identity/protocols/oauth2/service-account#httprest  (JWT bearer grant)
  https://cloud.google.com/apis/design/errors  (error shape; 429 RESOURCE_EXHAUSTED)
  https://firebase.google.com/docs/emulator-suite/connect_auth  (the emulator's "Bearer owner")
  https://github.com/firebase/firebase-js-sdk/issues/8159  (400 QUOTA_EXCEEDED / INVALID_ARGUMENT seen)
and what firebase-admin 7.7.0 sends (firebase_admin/_user_mgt.py, _auth_client.py).

Paths: POST {base}/projects/{project}/accounts[:lookup|:update|:delete|:batchCreate|:batchDelete] and
GET {base}/projects/{project}/accounts:batchGet, with {base} = /v1 (the real host's path) or
/identitytoolkit.googleapis.com/v1 (what firebase-admin sends to FIREBASE_AUTH_EMULATOR_HOST).
Auth: `Authorization: Bearer <access token from POST /token>` or `Bearer owner` (the emulator's admin
token, which firebase-admin sends when FIREBASE_AUTH_EMULATOR_HOST is set). A token whose assertion
asked for none of the scopes identitytoolkit, firebase, cloud-platform gets 403 PERMISSION_DENIED
(ACCESS_TOKEN_SCOPE_INSUFFICIENT) as Google answers.

Model: a user is {localId, email, disabled, providerUserInfo: [{providerId, rawId, federatedId, email}],
validSince, customAttributes}. Neutral mapping: identities = providerUserInfo (provider = providerId,
user_id = rawId); metadata = customAttributes (custom claims, a JSON object); tokens_valid_since =
validSince; sessions = refresh tokens, all revoked (0) when validSince is set. "password" users carry a
providerUserInfo entry {providerId: "password", rawId: email}.

Errors, Google's shape: {"error": {"code": 400, "message": "USER_NOT_FOUND", "errors": [...], "status"?}}.
firebase-admin maps error.message (up to a ':') to its exception (USER_NOT_FOUND -> UserNotFoundError).
Rate limit: 429 {"error": {"code": 429, "message": "Quota exceeded for quota metric ...",
"status": "RESOURCE_EXHAUSTED", "details": [ErrorInfo reason RATE_LIMIT_EXCEEDED]}} with NO Retry-After
(Google does not document one for API quota errors; back off exponentially). firebase-admin raises
ResourceExhaustedError and does not retry a 429 (its retry list is 500/503). Identity Toolkit also
answers some per-project quotas as 400 QUOTA_EXCEEDED (status INVALID_ARGUMENT); an adapter should
treat both as "retry later". Expired/revoked access token: 401 {"error": {"code": 401, "message":
"Request had invalid authentication credentials. ...", "status": "UNAUTHENTICATED"}}. The token
endpoint refuses a bad assertion with 400 {"error": "invalid_grant", "error_description": ...}.

The calls an adapter makes per event (all POST with JSON, Bearer access token; {P} = /v1/projects/{project}):
  find the user by the Apple sub:
      POST {P}/accounts:lookup {"federatedUserId": [{"providerId": "apple.com", "rawId": "<sub>"}]}
      -> 200 {"kind": ..., "users": [{"localId", "providerUserInfo", "disabled", ...}]};
      no such user = 200 WITHOUT "users" (not an error status).
  consent revoked (end sessions): POST {P}/accounts:update {"localId": uid, "validSince": "<now epoch s>"}
      -> 200 {"localId": uid, ...}; revokes every refresh token (ID tokens live until they expire, <= 1 h).
  account deleted: unlink Apple: POST {P}/accounts:update {"localId": uid, "deleteProvider": ["apple.com"]}
      and/or delete: POST {P}/accounts:delete {"localId": uid} -> 200 {"kind": ...};
      disable instead: POST {P}/accounts:update {"localId": uid, "disableUser": true}.
      "no such user" on update/delete = 400 {"error": {"message": "USER_NOT_FOUND"}}.
  email forwarding off/on: POST {P}/accounts:update {"localId": uid, "customAttributes": "<JSON string>"}
      customAttributes REPLACES all custom claims (read them first with accounts:lookup and merge; it is
      a JSON-encoded string, at most 1000 characters, and reaches ID tokens).
  team transfer (old sub -> new sub): a providerUserInfo's rawId cannot be edited; replace it:
      POST {P}/accounts:update {"localId": uid, "deleteProvider": ["apple.com"]} then
      POST {P}/accounts:update {"localId": uid, "linkProviderUserInfo": {"providerId": "apple.com",
      "rawId": "<new sub>", "email"?: ...}}; if the new sub is already linked to another user:
      400 FEDERATED_USER_ID_ALREADY_LINKED. (Two calls: Google does not document both in one request.)
      firebase-admin (Python) has no provider_to_link; the Node SDK's providerToLink sends the same body.
Not modelled: tenants (/projects/{p}/tenants/{t}/accounts...), phone numbers, MFA, password hashes,
the non-project paths (/v1/accounts:lookup with targetProjectId), sendOobCode, custom tokens.
"""

import base64
import json
import os
import time

import fakebase

FIXTURES = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRIVATE_KEY = os.path.join(FIXTURES, "TEST-ONLY-rsa-2048-private-key.pem")
PUBLIC_KEY = os.path.join(FIXTURES, "TEST-ONLY-rsa-2048-public-key.pem")
PROJECT = "siwa-fake-project"
CLIENT_EMAIL = "siwa-adapter@siwa-fake-project.iam.gserviceaccount.com"
GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"
ADMIN_SCOPES = {
    "https://www.googleapis.com/auth/identitytoolkit",
    "https://www.googleapis.com/auth/firebase",
    "https://www.googleapis.com/auth/cloud-platform",
}
PREFIXES = ("/identitytoolkit.googleapis.com/v1/projects/", "/v1/projects/")
KIND = "identitytoolkit#"


def google_error(status, message, reason="invalid", state=None):
    error = {"code": status, "message": message, "errors": [{"message": message, "domain": "global",
                                                              "reason": reason}]}
    if state:
        error["status"] = state
    return fakebase.Reply(status, {"error": error})


def b64url_decode(text):
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class FakePlatform(fakebase.Platform):
    name = "firebase"
    apple_provider = "apple.com"

    def __init__(self):
        super().__init__()
        self.token_scopes = {}
        self.url = None

    def credentials(self, url):
        self.url = url
        with open(PRIVATE_KEY) as f:
            private_key = f.read()
        account = {
            "type": "service_account",
            "project_id": PROJECT,
            "private_key_id": "test-only-key",
            "private_key": private_key,
            "client_email": CLIENT_EMAIL,
            "client_id": "100000000000000000001",
            "token_uri": f"{url}/token",
        }
        return {"project_id": PROJECT, "service_account": account,
                "service_account_json": json.dumps(account), "token_uri": f"{url}/token",
                "emulator_host": url.split("//", 1)[1], "api_base": f"{url}/v1/projects/{PROJECT}"}

    def rate_limited(self):
        message = ("Quota exceeded for quota metric 'Account management requests' and limit 'Account management "
                   "requests per minute' of service 'identitytoolkit.googleapis.com' for consumer "
                   f"'project_number:100000000001'.")
        return {"error": {"code": 429, "message": message, "status": "RESOURCE_EXHAUSTED", "details": [{
            "@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "RATE_LIMIT_EXCEEDED",
            "domain": "googleapis.com", "metadata": {"service": "identitytoolkit.googleapis.com",
                                                      "consumer": "projects/100000000001"}}]}}, {}

    def unauthorized(self):
        return 401, {"error": {"code": 401, "message": (
            "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or "
            "other valid authentication credential."), "status": "UNAUTHENTICATED"}}

    # --- the token endpoint: OAuth 2.0 JWT bearer grant (RFC 7523) ---
    def token(self, request):
        form = request.form() if "json" not in request.headers.get("Content-Type", "") else request.json()

        def refuse(description):
            raise fakebase.Reply(400, {"error": "invalid_grant", "error_description": description})

        if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
            raise fakebase.Reply(400, {"error": "unsupported_grant_type",
                                       "error_description": "Invalid grant_type: "})
        parts = (form.get("assertion") or "").split(".")
        if len(parts) != 3:
            refuse("Invalid JWT: Malformed.")
        try:
            header, claims = json.loads(b64url_decode(parts[0])), json.loads(b64url_decode(parts[1]))
            signature = b64url_decode(parts[2])
        except ValueError:
            refuse("Invalid JWT: Malformed.")
        if header.get("alg") != "RS256" or not self.signature_ok(f"{parts[0]}.{parts[1]}".encode(), signature):
            refuse("Invalid JWT Signature.")
        now = time.time()
        if claims.get("iss") != CLIENT_EMAIL:
            refuse("Invalid grant: account not found")
        if claims.get("aud") not in (GOOGLE_TOKEN_AUDIENCE, f"{self.url}/token"):
            refuse("Invalid JWT: Failed audience check.")
        iat, exp = claims.get("iat", 0), claims.get("exp", 0)
        if not (iat - 300 <= now <= exp + 300) or exp - iat > 3600:
            refuse("Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. "
                   "Check your iat and exp values in the JWT claim.")
        scopes = set((claims.get("scope") or "").split())
        if not scopes:
            raise fakebase.Reply(400, {"error": "invalid_scope",
                                       "error_description": "Empty or missing scope not allowed."})
        if self.revoked:
            refuse("Invalid JWT Signature.")  # a deleted service-account key answers this way
        token = "ya29.fake-" + self.issue_token()
        self.issued_tokens.add(token)
        self.token_scopes[token] = scopes
        return 200, {"access_token": token, "expires_in": 3599, "token_type": "Bearer"}

    @staticmethod
    def signature_ok(data, signature):
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import padding

        with open(PUBLIC_KEY, "rb") as f:
            key = serialization.load_pem_public_key(f.read())
        try:
            key.verify(signature, data, padding.PKCS1v15(), hashes.SHA256())
            return True
        except InvalidSignature:
            return False

    def authorize(self, request):
        token = request.bearer()
        if token == "owner" and not self.revoked:
            return
        self.require_token(request)
        if token.startswith("ya29.fake-"):
            if not self.token_scopes.get(token, set()) & ADMIN_SCOPES:
                raise fakebase.Reply(403, {"error": {
                    "code": 403, "message": "Request had insufficient authentication scopes.",
                    "status": "PERMISSION_DENIED", "details": [{
                        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                        "reason": "ACCESS_TOKEN_SCOPE_INSUFFICIENT", "domain": "googleapis.com"}]}})

    # --- the admin API ---
    def route(self, request):
        if request.path == "/token" and request.method == "POST":
            request.template = "POST /token"
            return self.token(request)
        prefix = next((p for p in PREFIXES if request.path.startswith(p)), None)
        if prefix is None:
            return None
        project, _, rest = request.path[len(prefix):].partition("/")
        if rest not in ("accounts", "accounts:lookup", "accounts:update", "accounts:delete", "accounts:batchCreate",
                        "accounts:batchGet", "accounts:batchDelete"):
            return None
        request.template = f"{request.method} /v1/projects/{{project}}/{rest}"
        self.authorize(request)
        if project != PROJECT:
            raise google_error(403, f"The caller does not have permission", "forbidden", "PERMISSION_DENIED")
        if rest == "accounts:batchGet":
            if request.method != "GET":
                return None
            return self.batch_get(request)
        if request.method != "POST":
            return None
        body = request.json()
        handler = {"accounts": self.create, "accounts:lookup": self.lookup, "accounts:update": self.update,
                   "accounts:delete": self.delete, "accounts:batchCreate": self.batch_create,
                   "accounts:batchDelete": self.batch_delete}[rest]
        with self.store.lock:
            return handler(body)

    def record(self, user):
        """A user as Identity Toolkit's UserInfo."""
        infos = []
        for identity in user["identities"]:
            info = {"providerId": identity["provider"], "rawId": identity["user_id"]}
            if identity["provider"] == "password":
                info.update(email=user["email"], federatedId=user["email"])
            else:
                info["federatedId"] = identity["user_id"]
                if user["email"]:
                    info["email"] = user["email"]
            infos.append(info)
        record = {"localId": user["id"], "emailVerified": True, "disabled": user["disabled"],
                  "providerUserInfo": infos, "createdAt": str(user["created_at"] * 1000),
                  "lastLoginAt": str(user["created_at"] * 1000)}
        if user["email"]:
            record["email"] = user["email"]
        if user["tokens_valid_since"] is not None:
            record["validSince"] = str(user["tokens_valid_since"])
        if user["metadata"]:
            record["customAttributes"] = json.dumps(user["metadata"])
        if user["password"]:
            record["passwordHash"] = "UkVEQUNURUQ="  # Identity Toolkit redacts hashes for most callers
            record["passwordUpdatedAt"] = user["created_at"] * 1000
        return record

    def by_email(self, email):
        return next((u for u in self.store.users.values() if u["email"] and email
                     and u["email"].lower() == email.lower()), None)

    def existing(self, body):
        user = self.store.users.get(body.get("localId") or "")
        if user is None:
            raise google_error(400, "USER_NOT_FOUND")
        return user

    def create(self, body):
        uid = body.get("localId") or self.store.new_id("fb")
        if uid in self.store.users:
            raise google_error(400, "DUPLICATE_LOCAL_ID")
        email = body.get("email")
        if email and self.by_email(email):
            raise google_error(400, "EMAIL_EXISTS")
        identities = [{"provider": "password", "user_id": email}] if body.get("password") and email else []
        user = self.store.add(uid, email, identities, password=bool(body.get("password")))
        user["disabled"] = bool(body.get("disabled", False))
        return 200, {"kind": KIND + "SignupNewUserResponse", "localId": uid, **({"email": email} if email else {})}

    def lookup(self, body):
        found = []
        for uid in body.get("localId") or []:
            if uid in self.store.users:
                found.append(self.store.users[uid])
        for email in body.get("email") or []:
            user = self.by_email(email)
            if user:
                found.append(user)
        for federated in body.get("federatedUserId") or []:
            user = self.store.find_identity(federated.get("providerId"), federated.get("rawId"))
            if user:
                found.append(user)
        unique = list({u["id"]: u for u in found}.values())
        answer = {"kind": KIND + "GetAccountInfoResponse"}
        if unique:
            answer["users"] = [self.record(u) for u in unique]
        return 200, answer

    def update(self, body):
        user = self.existing(body)
        if "email" in body:
            other = self.by_email(body["email"])
            if other and other is not user:
                raise google_error(400, "EMAIL_EXISTS")
        link = body.get("linkProviderUserInfo")
        if link is not None:
            if not link.get("providerId") or not link.get("rawId"):
                raise google_error(400, "INVALID_PROVIDER_ID")
            owner = self.store.find_identity(link["providerId"], link["rawId"])
            if owner is not None and owner is not user:
                raise google_error(400, "FEDERATED_USER_ID_ALREADY_LINKED")
        if "email" in body:
            user["email"] = body["email"]
        if "disableUser" in body:
            user["disabled"] = bool(body["disableUser"])
        if "validSince" in body:
            user["tokens_valid_since"] = int(body["validSince"])
            user["sessions"] = []
        if "customAttributes" in body:
            try:
                claims = json.loads(body["customAttributes"] or "{}")
            except ValueError:
                raise google_error(400, "INVALID_CLAIMS")
            if not isinstance(claims, dict):
                raise google_error(400, "INVALID_CLAIMS")
            if len(body["customAttributes"]) > 1000:
                raise google_error(400, "CLAIMS_TOO_LARGE")
            user["metadata"] = claims
        for provider in body.get("deleteProvider") or []:
            user["identities"] = [i for i in user["identities"] if i["provider"] != provider]
            if provider == "password":
                user["password"] = False
        if link is not None and not any(i["provider"] == link["providerId"] and i["user_id"] == link["rawId"]
                                        for i in user["identities"]):
            user["identities"].append({"provider": link["providerId"], "user_id": link["rawId"]})
        record = self.record(user)
        answer = {"kind": KIND + "SetAccountInfoResponse", "localId": user["id"],
                  "providerUserInfo": record["providerUserInfo"]}
        if user["email"]:
            answer["email"] = user["email"]
        return 200, answer

    def delete(self, body):
        user = self.existing(body)
        del self.store.users[user["id"]]
        return 200, {"kind": KIND + "DeleteAccountResponse"}

    def batch_delete(self, body):
        errors = []
        for index, uid in enumerate(body.get("localIds") or []):
            user = self.store.users.get(uid)
            if user is None:
                continue
            if not user["disabled"] and not body.get("force"):
                errors.append({"index": index, "localId": uid, "message": "NOT_DISABLED"})
                continue
            del self.store.users[uid]
        return 200, ({"errors": errors} if errors else {})

    def batch_create(self, body):
        errors = []
        for index, spec in enumerate(body.get("users") or []):
            uid = spec.get("localId")
            if not uid:
                errors.append({"index": index, "message": "localId is missing"})
                continue
            if uid in self.store.users:
                errors.append({"index": index, "message": "localId already exists"})
                continue
            identities = []
            for info in spec.get("providerUserInfo") or []:
                if self.store.find_identity(info.get("providerId"), info.get("rawId")):
                    errors.append({"index": index, "message": "raw id exists in other account in database"})
                    break
                identities.append({"provider": info.get("providerId"), "user_id": info.get("rawId")})
            else:
                claims = json.loads(spec["customAttributes"]) if spec.get("customAttributes") else {}
                user = self.store.add(uid, spec.get("email"), identities, password="passwordHash" in spec,
                                      metadata=claims)
                user["disabled"] = bool(spec.get("disabled", False))
        return 200, ({"kind": KIND + "UploadAccountResponse", "error": errors} if errors
                     else {"kind": KIND + "UploadAccountResponse"})

    def batch_get(self, request):
        size = min(int(request.query.get("maxResults", 1000)), 1000)
        after = request.query.get("nextPageToken", "")
        with self.store.lock:
            users = sorted((u for u in self.store.users.values() if u["id"] > after), key=lambda u: u["id"])
            page = [self.record(u) for u in users[:size]]
        answer = {"kind": KIND + "DownloadAccountResponse", "users": page}
        if len(users) > size:
            answer["nextPageToken"] = page[-1]["localId"]
        return 200, answer

    def seed(self, spec):
        spec = dict(spec)
        others = list(spec.pop("other_providers", []))
        user = fakebase.Platform.seed(self, spec)
        with self.store.lock:
            stored = self.store.users[user["id"]]
            stored["identities"] += [{"provider": p, "user_id": self.store.new_id()} for p in others]
            if stored["password"] and stored["email"]:
                stored["identities"].append({"provider": "password", "user_id": stored["email"]})
            return self.store.neutral(stored)
