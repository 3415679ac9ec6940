#!/usr/bin/env python3
"""TEST ONLY. Checks firebase.py against Google's own SDK, firebase-admin (run with .build/platforms-venv).

Starts the fake in-process on 127.0.0.1 port 0 and drives it with firebase-admin only (the service-account
token exchange through google-auth, the user calls through FIREBASE_AUTH_EMULATOR_HOST), except the one
call firebase-admin for Python lacks (accounts:update linkProviderUserInfo), sent over plain HTTP with the
SDK-obtained access token. Prints one JSON line of what was checked and exits 0, or names the failing step
and exits 1.
"""

import json
import os
import sys
import threading
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fakebase  # noqa: E402
import firebase  # noqa: E402

checked = []


def step(name, condition, detail=""):
    if not condition:
        sys.stderr.write(f"check_firebase: FAILED at {name} {detail}\n")
        sys.exit(1)
    checked.append(name)


def expect_raises(name, exception_type, call):
    try:
        call()
    except exception_type as error:
        checked.append(name)
        return error
    except Exception as error:  # noqa: BLE001
        step(name, False, f"raised {type(error).__name__}: {error}")
    step(name, False, "raised nothing")


def post(url, body, token=None):
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def main():
    platform = firebase.FakePlatform()
    server = fakebase.make_server(platform)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    creds = platform.credentials(url)
    os.environ["FIREBASE_AUTH_EMULATOR_HOST"] = creds["emulator_host"]

    import firebase_admin
    import google.auth.exceptions
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from firebase_admin import auth, credentials, exceptions

    # The service-account token exchange (google-auth signs the RS256 assertion; the fake verifies it).
    certificate = credentials.Certificate(creds["service_account"])
    access = certificate.get_access_token()
    step("token: JWT bearer grant -> access_token", access.access_token.startswith("ya29.") and access.expiry)
    wrong_key = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    forged = credentials.Certificate({**creds["service_account"], "private_key": wrong_key})
    error = expect_raises("token: a key the fake does not know -> RefreshError", google.auth.exceptions.RefreshError,
                          forged.get_access_token)
    step("token: refusal is invalid_grant", "invalid_grant" in str(error), str(error))

    import google.auth.transport.requests
    from google.oauth2 import service_account

    narrow = service_account.Credentials.from_service_account_info(
        creds["service_account"], scopes=["https://www.googleapis.com/auth/userinfo.email"])
    narrow.refresh(google.auth.transport.requests.Request())
    status, body = post(f"{creds['api_base']}/accounts:lookup", {"localId": ["x"]}, narrow.token)
    step("a token without an Identity Toolkit scope -> 403 PERMISSION_DENIED",
         status == 403 and body["error"]["status"] == "PERMISSION_DENIED", f"{status} {body}")

    app = firebase_admin.initialize_app(certificate, {"projectId": creds["project_id"]})
    uid, sub, other_sub = "user-apple-1", "001234.aaaa.0001", "009999.bbbb.0002"

    result = auth.import_users([auth.ImportUserRecord(
        uid, email="a@privaterelay.appleid.com", custom_claims={"plan": "pro"},
        provider_data=[auth.UserProvider(uid=sub, provider_id="apple.com", email="a@privaterelay.appleid.com")])],
        app=app)
    step("import_users with an apple.com provider", result.success_count == 1 and result.failure_count == 0)
    duplicate = auth.import_users([auth.ImportUserRecord(
        "user-apple-dup", provider_data=[auth.UserProvider(uid=sub, provider_id="apple.com")])], app=app)
    step("import_users: the same Apple sub twice fails per user", duplicate.failure_count == 1)

    user = auth.get_user(uid, app=app)
    step("get_user", user.uid == uid and user.email == "a@privaterelay.appleid.com" and not user.disabled)
    step("get_user: provider_data apple.com/sub",
         [(p.provider_id, p.uid) for p in user.provider_data] == [("apple.com", sub)])
    step("get_user: custom_claims", user.custom_claims == {"plan": "pro"})
    step("get_user_by_email", auth.get_user_by_email("a@privaterelay.appleid.com", app=app).uid == uid)

    found = auth.get_users([auth.ProviderIdentifier("apple.com", sub), auth.ProviderIdentifier("apple.com", "nobody")],
                           app=app)
    step("get_users by ProviderIdentifier (federatedUserId)", [u.uid for u in found.users] == [uid])
    step("get_users: an unknown sub is in not_found",
         [(i.provider_id, i.provider_uid) for i in found.not_found] == [("apple.com", "nobody")])

    step("update_user disabled=True", auth.update_user(uid, disabled=True, app=app).disabled is True)
    auth.revoke_refresh_tokens(uid, app=app)
    revoked = auth.get_user(uid, app=app)
    step("revoke_refresh_tokens -> tokens_valid_after_timestamp",
         revoked.tokens_valid_after_timestamp and revoked.tokens_valid_after_timestamp > 0)
    auth.set_custom_user_claims(uid, {"plan": "pro", "apple_email_forwarding": False}, app=app)
    step("set_custom_user_claims replaces the claims",
         auth.get_user(uid, app=app).custom_claims == {"plan": "pro", "apple_email_forwarding": False})

    # Team transfer: deleteProvider (SDK) then linkProviderUserInfo (plain HTTP; not in firebase-admin Python).
    step("update_user providers_to_delete=['apple.com']",
         auth.update_user(uid, providers_to_delete=["apple.com"], app=app).provider_data == [])
    status, body = post(f"{creds['api_base']}/accounts:update", {
        "localId": uid, "linkProviderUserInfo": {"providerId": "apple.com", "rawId": other_sub}}, access.access_token)
    step("accounts:update linkProviderUserInfo (HTTP, SDK token)", status == 200 and body.get("localId") == uid,
         f"{status} {body}")
    moved = auth.get_users([auth.ProviderIdentifier("apple.com", other_sub)], app=app)
    step("the new sub finds the user", [u.uid for u in moved.users] == [uid])

    other = auth.create_user(email="b@example.com", password="secret-123", app=app)
    status, body = post(f"{creds['api_base']}/accounts:update", {
        "localId": other.uid, "linkProviderUserInfo": {"providerId": "apple.com", "rawId": other_sub}},
        access.access_token)
    step("linking a sub linked elsewhere -> FEDERATED_USER_ID_ALREADY_LINKED",
         status == 400 and body["error"]["message"] == "FEDERATED_USER_ID_ALREADY_LINKED", f"{status} {body}")
    listed = [u.uid for u in auth.list_users(app=app).iterate_all()]
    step("list_users (accounts:batchGet)", sorted(listed) == sorted([uid, other.uid]), str(listed))

    auth.delete_user(uid, app=app)
    expect_raises("get_user after delete_user -> UserNotFoundError", auth.UserNotFoundError,
                  lambda: auth.get_user(uid, app=app))
    expect_raises("delete_user twice -> UserNotFoundError (USER_NOT_FOUND)", auth.UserNotFoundError,
                  lambda: auth.delete_user(uid, app=app))
    expect_raises("update_user of a missing user -> UserNotFoundError", auth.UserNotFoundError,
                  lambda: auth.update_user(uid, disabled=True, app=app))

    post(f"{url}/_fake/faults", {"rate_limit": 1})
    error = expect_raises("rate limit -> ResourceExhaustedError (429 RESOURCE_EXHAUSTED)",
                          exceptions.ResourceExhaustedError, lambda: auth.get_user(other.uid, app=app))
    step("rate limit: 429 without Retry-After", error.http_response.status_code == 429
         and "Retry-After" not in error.http_response.headers)
    step("after the 429 the call succeeds", auth.get_user(other.uid, app=app).uid == other.uid)
    post(f"{url}/_fake/faults", {"revoke_credentials": True})
    expect_raises("revoked credentials -> UnauthenticatedError (401)", exceptions.UnauthenticatedError,
                  lambda: auth.get_user(other.uid, app=app))
    server.shutdown()
    print(json.dumps({"platform": "firebase", "sdk": f"firebase-admin {firebase_admin.__version__}",
                      "checked": checked}))


if __name__ == "__main__":
    main()
