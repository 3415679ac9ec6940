#!/usr/bin/env python3
"""TEST ONLY. Checks clerk.py against Clerk's own Python SDK (clerk-backend-api, PyPI): the fake runs in
this process on 127.0.0.1 port 0, and every step below goes through the SDK only — except seeding the
user with an Apple external account, which Clerk's Backend API cannot do (external accounts come only
from the user's own OAuth sign-in), so that user is seeded through the fake's control API.

Exit 0 with one JSON line of what was checked; non-zero with the failing step on stderr.
Run with the platforms venv's python (.build/platforms-venv/bin/python).
"""

import json
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import clerk  # noqa: E402
import fakebase  # noqa: E402
from clerk_backend_api import Clerk, models  # noqa: E402
from clerk_backend_api.utils import BackoffStrategy, RetryConfig  # noqa: E402

CHECKED = []
STEP = ["start"]


def step(name):
    STEP[0] = name
    CHECKED.append(name)


def expect(condition, what):
    if not condition:
        raise AssertionError(what)


control = fakebase.control


def expect_clerk_error(call, status, code, what):
    try:
        call()
    except models.ClerkErrors as error:
        expect(error.status_code == status, f"{what}: status {error.status_code}, wanted {status}")
        expect(error.data.errors and error.data.errors[0].code == code,
               f"{what}: code {error.data.errors[0].code if error.data.errors else None}, wanted {code}")
        return error
    raise AssertionError(f"{what}: no ClerkErrors raised")


def main():
    platform = clerk.FakePlatform()
    server = fakebase.make_server(platform)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    credentials = platform.credentials(url)
    # No retries: the SDK's default retries 5XX for up to an hour.
    sdk = Clerk(bearer_auth=credentials["secret_key"], server_url=credentials["server_url"],
                retry_config=RetryConfig("backoff", BackoffStrategy(1, 1, 1.0, 1), False))
    try:
        step("seed a user with an Apple external account (control API: the Backend API cannot)")
        seeded = control(url, "users", {"email": "apple@example.com", "apple_sub": "001.apple.sub",
                                        "other_providers": ["google"], "sessions": 2})
        user_id = seeded["id"]
        expect(user_id.startswith("user_"), "seeded id")

        step("users.create")
        created = sdk.users.create(email_address=["plain@example.com"],
                                   private_metadata={"siwa": {"note": "created"}})
        expect(isinstance(created, models.User) and created.id.startswith("user_"), "created user")
        expect(created.email_addresses[0].email_address == "plain@example.com", "created email")
        expect(created.private_metadata == {"siwa": {"note": "created"}}, "created private metadata")
        expect(created.external_accounts == [] and created.banned is False, "created: no external accounts")

        step("users.list by provider=oauth_apple and provider_user_id")
        found = sdk.users.list(request={"provider": "oauth_apple", "provider_user_id": ["001.apple.sub"]})
        expect([u.id for u in found] == [user_id], f"found {[u.id for u in found]}")
        apple = [a for a in found[0].external_accounts if a.provider == "oauth_apple"]
        expect(len(apple) == 1 and apple[0].provider_user_id == "001.apple.sub", "the Apple external account")
        expect(apple[0].id.startswith("eac_") and apple[0].verification.status == "verified", "external account")
        expect(len(found[0].external_accounts) == 2, "the Google account is there too")
        expect(sdk.users.list(request={"provider": "oauth_apple", "provider_user_id": ["001.nobody"]}) == [],
               "an unknown sub finds no user (200 [])")
        both = sdk.users.list(request={"provider": "oauth_apple", "provider_user_id": ["001.apple.sub", "001.x"]})
        expect([u.id for u in both] == [user_id], "several provider user ids")

        step("users.list by email_address and query")
        expect([u.id for u in sdk.users.list(request={"email_address": ["apple@example.com"]})] == [user_id], "email")
        expect({u.id for u in sdk.users.list()} == {user_id, created.id}, "all users")
        expect([u.id for u in sdk.users.list(request={"query": "plain@"})] == [created.id], "query")

        step("users.get")
        user = sdk.users.get(user_id=user_id)
        expect(user.id == user_id and user.email_addresses[0].email_address == "apple@example.com", "get")
        expect(user.email_addresses[0].linked_to[0].id in {a.id for a in user.external_accounts}, "linked_to")

        step("users.update_metadata (deep merge, null removes)")
        merged = sdk.users.update_metadata(user_id=user_id,
                                           private_metadata={"siwa": {"email_forwarding": "off", "x": 1}})
        expect(merged.private_metadata == {"siwa": {"email_forwarding": "off", "x": 1}}, "merged")
        merged = sdk.users.update_metadata(user_id=user_id, private_metadata={"siwa": {"x": None}},
                                           public_metadata={"p": True})
        expect(merged.private_metadata == {"siwa": {"email_forwarding": "off"}}, f"{merged.private_metadata}")
        expect(merged.public_metadata == {"p": True}, "public metadata")
        state = control(url, "state")["users"]
        expect(any(u["metadata"]["private_metadata"] == {"siwa": {"email_forwarding": "off"}} for u in state),
               "neutral state has the metadata")

        step("users.update")
        updated = sdk.users.update(user_id=user_id, first_name=None)
        expect(updated.id == user_id, "update")

        step("sessions.list user_id status=active, sessions.revoke")
        active = sdk.sessions.list(user_id=user_id, status="active")
        expect(len(active) == 2 and all(s.status == models.Status.ACTIVE for s in active), "two active sessions")
        revoked = sdk.sessions.revoke(session_id=active[0].id)
        expect(revoked.status == models.Status.REVOKED and revoked.user_id == user_id, "revoked")
        expect(len(sdk.sessions.list(user_id=user_id, status="active")) == 1, "one left")
        expect_clerk_error(lambda: sdk.sessions.revoke(session_id="sess_nope"), 404, "resource_not_found",
                           "revoke an unknown session")

        step("users.ban (revokes every session), users.unban")
        banned = sdk.users.ban(user_id=user_id)
        expect(banned.banned is True, "banned")
        expect(sdk.sessions.list(user_id=user_id, status="active") == [], "no active session")
        expect(len(sdk.sessions.list(user_id=user_id, status="revoked")) == 2, "both revoked")
        expect([u["disabled"] for u in control(url, "state")["users"] if u["id"] == user_id] == [True],
               "the neutral state shows the user disabled")
        expect(sdk.users.unban(user_id=user_id).banned is False, "unbanned")

        step("users.delete_external_account (unlink Apple)")
        deleted = sdk.users.delete_external_account(user_id=user_id, external_account_id=apple[0].id)
        expect(deleted.deleted is True and deleted.id == apple[0].id and deleted.object == "external_account",
               "unlinked")
        expect(sdk.users.list(request={"provider": "oauth_apple", "provider_user_id": ["001.apple.sub"]}) == [],
               "the sub finds no user any more")
        expect([a.provider for a in sdk.users.get(user_id=user_id).external_accounts] == ["oauth_google"],
               "Google stays")
        try:
            sdk.users.delete_external_account(user_id=user_id, external_account_id=apple[0].id)
            raise AssertionError("unlinking twice succeeded")
        except models.ClerkErrors as error:
            expect(error.status_code == 404, "unlink twice: 404")

        step("users.delete, then users.get raises ClerkErrors 404 resource_not_found")
        gone = sdk.users.delete(user_id=user_id)
        expect(gone.deleted is True and gone.id == user_id and gone.object == "user", "deleted")
        expect_clerk_error(lambda: sdk.users.get(user_id=user_id), 404, "resource_not_found", "get after delete")
        expect_clerk_error(lambda: sdk.users.delete(user_id=user_id), 404, "resource_not_found", "delete twice")
        sdk.users.delete(user_id=created.id)

        step("a wrong secret key: ClerkErrors 401 clerk_key_invalid")
        wrong = Clerk(bearer_auth="sk_test_wrong", server_url=credentials["server_url"])
        expect_clerk_error(lambda: wrong.users.list(), 401, "clerk_key_invalid", "wrong key")

        step("rate_limit fault: SDKError 429 with Retry-After")
        control(url, "faults", {"rate_limit": 1})
        try:
            sdk.users.list()
            raise AssertionError("no error for 429")
        except models.SDKError as error:
            expect(error.status_code == 429 and error.headers.get("retry-after") == "1", "429 Retry-After")
        expect(sdk.users.list() == [], "after the 429, the next call answers")

        step("revoke_credentials fault: ClerkErrors 401 for the right key")
        control(url, "faults", {"revoke_credentials": True})
        expect_clerk_error(lambda: sdk.users.get(user_id="user_x"), 401, "clerk_key_invalid", "revoked key")
    except Exception as error:  # noqa: BLE001
        sys.stderr.write(f"check_clerk: step {STEP[0]!r} failed: {type(error).__name__}: {error}\n")
        return 1
    finally:
        server.shutdown()
    sys.stdout.write(json.dumps({"platform": "clerk", "sdk": "clerk-backend-api", "checked": CHECKED}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
