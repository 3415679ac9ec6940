#!/usr/bin/env python3
"""TEST ONLY. Checks keycloak.py against Keycloak's Python admin client (python-keycloak, PyPI): the fake
runs in this process on 127.0.0.1 port 0 and every step goes through the SDK only (KeycloakAdmin with a
confidential client's service account, client_credentials grant).

Exit 0 with one JSON line of what was checked; non-zero with the failing step on stderr.
Run with the platforms venv's python (.build/platforms-venv/bin/python).
"""

import base64
import importlib.util
import json
import os
import sys
import threading
import time

# This directory's keycloak.py (the fake) would shadow the SDK's package `keycloak`: import the SDK with the
# directory off the path, then load the fake under another name.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
from keycloak import KeycloakAdmin, KeycloakOpenID  # noqa: E402  (the SDK)
from keycloak.exceptions import (  # noqa: E402
    KeycloakAuthenticationError, KeycloakDeleteError, KeycloakGetError, KeycloakPostError, KeycloakPutError)

sys.path.insert(0, HERE)
import fakebase  # noqa: E402

_spec = importlib.util.spec_from_file_location("keycloak_fake", os.path.join(HERE, "keycloak.py"))
keycloak_fake = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(keycloak_fake)

CHECKED = []
STEP = ["start"]


def step(name):
    STEP[0] = name
    CHECKED.append(name)


def expect(condition, what):
    if not condition:
        raise AssertionError(what)


control = fakebase.control


def expect_error(call, kind, status, what):
    try:
        call()
    except kind as error:
        expect(error.response_code == status, f"{what}: status {error.response_code}, wanted {status}")
        return error
    raise AssertionError(f"{what}: no {kind.__name__} raised")


def main():
    platform = keycloak_fake.FakePlatform()
    server = fakebase.make_server(platform)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    credentials = platform.credentials(url)

    def admin(client_id="client_id", secret="client_secret"):
        return KeycloakAdmin(server_url=credentials["server_url"], realm_name=credentials["realm"],
                             client_id=credentials[client_id], client_secret_key=credentials[secret])

    sdk = admin()
    try:
        step("KeycloakOpenID.token client_credentials")
        openid = KeycloakOpenID(server_url=credentials["server_url"], realm_name=credentials["realm"],
                                client_id=credentials["client_id"], client_secret_key=credentials["client_secret"])
        token = openid.token(grant_type="client_credentials")
        expect(token["token_type"] == "Bearer" and token["expires_in"] > 0 and token["access_token"], "token")
        payload = token["access_token"].split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        expect("manage-users" in claims["resource_access"]["realm-management"]["roles"], "roles in the token")

        step("a wrong client secret: KeycloakAuthenticationError 401 unauthorized_client")
        wrong = KeycloakOpenID(server_url=credentials["server_url"], realm_name=credentials["realm"],
                               client_id=credentials["client_id"], client_secret_key="wrong")
        error = expect_error(lambda: wrong.token(grant_type="client_credentials"), KeycloakAuthenticationError, 401,
                             "wrong secret")
        expect(b"unauthorized_client" in error.response_body, "error code")

        step("create_user with federatedIdentities (Apple)")
        user_id = sdk.create_user({"username": "apple@example.com", "email": "apple@example.com", "enabled": True,
                                   "attributes": {"keep": ["me"]},
                                   "federatedIdentities": [{"identityProvider": "apple", "userId": "001.apple.sub",
                                                            "userName": "apple@example.com"}]})
        expect(len(user_id) == 36, f"user id from Location: {user_id}")
        expect_error(lambda: sdk.create_user({"username": "apple@example.com"}), KeycloakPostError, 409,
                     "the same username twice")

        step("create_user then add_user_social_login")
        other_id = sdk.create_user({"username": "plain", "email": "plain@example.com", "enabled": True})
        sdk.add_user_social_login(other_id, "apple", "001.other.sub", "plain@example.com")
        expect_error(lambda: sdk.add_user_social_login(other_id, "apple", "001.again", "x"), KeycloakPostError, 409,
                     "linking Apple twice")

        step("get_users idpAlias+idpUserId (exact, briefRepresentation)")
        found = sdk.get_users({"idpAlias": "apple", "idpUserId": "001.apple.sub", "exact": True,
                               "briefRepresentation": True})
        expect([u["id"] for u in found] == [user_id], f"found {found}")
        expect(found[0]["enabled"] is True and "attributes" not in found[0], "brief representation")
        expect(sdk.get_users({"idpAlias": "apple", "idpUserId": "001.nobody"}) == [], "unknown sub: []")
        expect(sdk.get_user_id("plain") == other_id, "get_user_id (username, exact)")
        expect([u["id"] for u in sdk.get_users({"search": "apple"})] == [user_id], "search (prefix)")
        expect([u["id"] for u in sdk.get_users({"email": "plain@example.com", "exact": True})] == [other_id],
               "email exact")
        expect(sdk.users_count() == 2, "users_count")

        step("get_user (full representation with federatedIdentities)")
        user = sdk.get_user(user_id)
        expect(user["id"] == user_id and user["email"] == "apple@example.com" and user["enabled"] is True, "get_user")
        expect(user["federatedIdentities"] == [{"identityProvider": "apple", "userId": "001.apple.sub",
                                                "userName": "apple@example.com"}], f"{user['federatedIdentities']}")
        expect(user["attributes"] == {"keep": ["me"]}, "attributes")

        step("update_user attributes (read, change, write back whole)")
        attributes = dict(user["attributes"], siwa_email_forwarding=["off"])
        expect(sdk.update_user(user_id, {"attributes": attributes}) == {}, "204")
        expect(sdk.get_user(user_id)["attributes"] == {"keep": ["me"], "siwa_email_forwarding": ["off"]}, "merged")
        found = sdk.get_users({"q": "siwa_email_forwarding:off"})
        expect([u["id"] for u in found] == [user_id], "q= attribute search")

        step("disable_user (PUT enabled false)")
        sdk.disable_user(user_id)
        expect(sdk.get_user(user_id)["enabled"] is False, "disabled")
        expect([u["disabled"] for u in control(url, "state")["users"] if u["id"] == user_id] == [True], "state")

        step("get_sessions, user_logout")
        seeded = control(url, "users", {"email": "sessions@example.com", "apple_sub": "001.s", "sessions": 2})
        sessions = sdk.get_sessions(seeded["id"])
        expect(len(sessions) == 2 and all(s["userId"] == seeded["id"] for s in sessions), "two sessions")
        expect(sdk.user_logout(seeded["id"]) == {}, "logout 204")
        expect(sdk.get_sessions(seeded["id"]) == [], "no session")
        expect(sdk.get_user(seeded["id"])["notBefore"] > 0, "notBefore set")

        step("team transfer: delete_user_social_login then add_user_social_login with the new sub")
        sdk.delete_user_social_login(user_id, "apple")
        sdk.add_user_social_login(user_id, "apple", "002.apple.sub", "apple@example.com")
        expect(sdk.get_users({"idpAlias": "apple", "idpUserId": "001.apple.sub"}) == [], "old sub gone")
        expect([u["id"] for u in sdk.get_users({"idpAlias": "apple", "idpUserId": "002.apple.sub"})] == [user_id],
               "new sub found")
        expect(sdk.get_user_social_logins(user_id) == [{"identityProvider": "apple", "userId": "002.apple.sub",
                                                        "userName": "apple@example.com"}], "social logins")

        step("delete_user_social_login (unlink), twice -> 404")
        sdk.delete_user_social_login(user_id, "apple")
        expect(sdk.get_user_social_logins(user_id) == [], "unlinked")
        expect_error(lambda: sdk.delete_user_social_login(user_id, "apple"), KeycloakDeleteError, 404, "unlink twice")

        step("least privilege: the view-users client reads but gets 403 on manage calls")
        viewer = admin("viewer_client_id", "viewer_client_secret")
        expect(viewer.get_user(user_id)["id"] == user_id, "viewer reads")
        expect(len(viewer.get_users({"idpAlias": "apple", "idpUserId": "001.other.sub"})) == 1, "viewer finds")
        expect_error(lambda: viewer.user_logout(user_id), KeycloakPostError, 403, "viewer logout")
        expect_error(lambda: viewer.disable_user(user_id), KeycloakPutError, 403, "viewer disable")
        expect_error(lambda: viewer.delete_user_social_login(other_id, "apple"), KeycloakDeleteError, 403,
                     "viewer unlink")
        expect_error(lambda: viewer.delete_user(user_id), KeycloakDeleteError, 403, "viewer delete")

        step("delete_user, then get_user raises KeycloakGetError 404")
        expect(sdk.delete_user(user_id) == {}, "deleted")
        error = expect_error(lambda: sdk.get_user(user_id), KeycloakGetError, 404, "get after delete")
        expect(b"User not found" in error.response_body, "User not found")
        expect_error(lambda: sdk.delete_user(user_id), KeycloakDeleteError, 404, "delete twice")

        step("rate_limit fault: requests/urllib3 (max_retries=1) waits Retry-After and retries a 429 once")
        control(url, "faults", {"rate_limit": 1})
        started = time.monotonic()
        expect(sdk.get_user(other_id)["id"] == other_id, "answers after one 429")
        expect(time.monotonic() - started >= 0.9, "waited Retry-After")
        control(url, "faults", {"rate_limit": 2})
        expect_error(lambda: sdk.get_user(other_id), KeycloakGetError, 429, "two 429s in a row")
        expect(sdk.get_user(other_id)["id"] == other_id, "answers after the 429s")

        step("revoke_credentials fault: KeycloakAuthenticationError 401")
        control(url, "faults", {"revoke_credentials": True})
        expect_error(lambda: sdk.get_user(other_id), KeycloakAuthenticationError, 401, "revoked")
    except Exception as error:  # noqa: BLE001
        sys.stderr.write(f"check_keycloak: step {STEP[0]!r} failed: {type(error).__name__}: {error}\n")
        return 1
    finally:
        server.shutdown()
    sys.stdout.write(json.dumps({"platform": "keycloak", "sdk": "python-keycloak", "checked": CHECKED}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
