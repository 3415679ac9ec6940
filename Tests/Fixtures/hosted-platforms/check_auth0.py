#!/usr/bin/env python3
"""TEST ONLY. Checks auth0.py against Auth0's own SDK, auth0-python (run with .build/platforms-venv).

Starts the fake in-process on 127.0.0.1 port 0 and drives it with auth0-python only: GetToken(protocol="http")
for /oauth/token and the Management client (auth0.management.client.Auth0 with base_url http://.../api/v2;
ManagementClient itself always builds https://{domain}). Auth0's API cannot create a social (apple) user,
so Apple users are seeded through the fake's control API (/_fake/users), as the real tenant gets them from
a sign-in. Prints one JSON line of what was checked and exits 0, or names the failing step and exits 1.
The fake module is loaded by path as auth0_fake: its file name would shadow the SDK's `auth0` package.
"""

import importlib.util
import json
import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [HERE]
import fakebase  # noqa: E402

spec = importlib.util.spec_from_file_location("auth0_fake", os.path.join(HERE, "auth0.py"))
fake = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fake)

checked = []


def step(name, condition, detail=""):
    if not condition:
        sys.stderr.write(f"check_auth0: FAILED at {name} {detail}\n")
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


control = fakebase.control


def main():
    platform = fake.FakePlatform()
    server = fakebase.make_server(platform)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    creds = platform.credentials(url)

    from auth0.authentication import GetToken
    from auth0.authentication.exceptions import Auth0Error
    from auth0.management import errors
    from auth0.management.client import Auth0

    def token_for(client_id, secret, audience=creds["audience"]):
        return GetToken(creds["domain"], client_id, client_secret=secret, protocol="http").client_credentials(audience)

    granted = token_for(creds["client_id"], creds["client_secret"])
    step("oauth/token client_credentials", granted["token_type"] == "Bearer" and granted["expires_in"] > 0
         and "delete:sessions" in granted["scope"].split())
    error = expect_raises("oauth/token: a wrong secret -> Auth0Error", Auth0Error,
                          lambda: token_for(creds["client_id"], "wrong"))
    step("oauth/token: 401 access_denied", error.status_code == 401 and error.error_code == "access_denied")
    error = expect_raises("oauth/token: another audience -> Auth0Error", Auth0Error,
                          lambda: token_for(creds["client_id"], creds["client_secret"], "https://elsewhere/api/v2/"))
    step("oauth/token: 403 access_denied", error.status_code == 403 and error.error_code == "access_denied")

    api = Auth0(base_url=f"{url}/api/v2", token=granted["access_token"])
    sub = "001234.aaaa.0001"
    error = expect_raises("users.create with connection apple -> BadRequestError", errors.BadRequestError,
                          lambda: api.users.create(connection="apple", email="a@privaterelay.appleid.com"))
    control(url, "users", {"email": "a@privaterelay.appleid.com", "apple_sub": sub, "sessions": 2})
    checked.append("apple user seeded through /_fake/users (the API cannot create social users)")
    created = api.users.create(connection=fake.DATABASE, email="db@example.com", password="Secret-123!")
    step("users.create in the database connection", created.user_id.startswith("auth0|")
         and created.identities[0].connection == fake.DATABASE)

    user_id = f"apple|{sub}"
    user = api.users.get(user_id)
    step("users.get apple|<sub>", user.user_id == user_id and user.email == "a@privaterelay.appleid.com")
    step("users.get: identity apple/<sub>", [(i.provider, i.user_id, i.connection) for i in user.identities]
         == [("apple", sub, "apple")])
    found = list(api.users.list(q=f'identities.user_id:"{sub}" AND identities.provider:"apple"', search_engine="v3"))
    step("users.list q=identities.user_id AND identities.provider (v3)", [u.user_id for u in found] == [user_id])
    step("users.list: an unknown sub finds nobody",
         list(api.users.list(q='identities.user_id:"nobody"', search_engine="v3")) == [])

    updated = api.users.update(user_id, blocked=True, app_metadata={"plan": "pro", "apple_email_forwarding": False})
    step("users.update blocked + app_metadata", updated.blocked is True
         and updated.app_metadata == {"plan": "pro", "apple_email_forwarding": False})
    merged = api.users.update(user_id, app_metadata={"apple_email_forwarding": True})
    step("users.update merges app_metadata one level", merged.app_metadata == {"plan": "pro",
                                                                                "apple_email_forwarding": True})

    step("users.sessions.list before", len(list(api.users.sessions.list(user_id))) == 2)
    api.users.sessions.delete(user_id)
    step("users.sessions.delete -> 202", list(api.users.sessions.list(user_id)) == [])
    api.users.refresh_token.delete(user_id)
    state = {u["id"]: u for u in control(url, "state")["users"]}
    step("users.refresh_token.delete -> 202", state[user_id]["tokens_valid_since"] is not None)

    # Apple as a secondary identity of a database user: unlink, then link back.
    linked = control(url, "users", {"email": "c@example.com", "apple_sub": "002.cccc", "password": True})
    identities = api.users.identities.delete(linked["id"], "apple", "002.cccc")
    step("users.identities.delete (unlink) -> remaining identities", [i.provider for i in identities] == ["auth0"])
    step("unlink leaves a standalone apple|<sub> user", api.users.get("apple|002.cccc").identities[0].provider
         == "apple")
    relinked = api.users.identities.link(linked["id"], provider="apple", user_id="002.cccc")
    step("users.identities.link -> identities", [i.provider for i in relinked] == ["auth0", "apple"])
    expect_raises("after link the secondary user is gone -> NotFoundError", errors.NotFoundError,
                  lambda: api.users.get("apple|002.cccc"))
    expect_raises("unlinking the main identity -> BadRequestError", errors.BadRequestError,
                  lambda: api.users.identities.delete(user_id, "apple", sub))

    api.users.delete(user_id)
    error = expect_raises("users.get after users.delete -> NotFoundError", errors.NotFoundError,
                          lambda: api.users.get(user_id))
    step("404 body errorCode inexistent_user", error.status_code == 404
         and error.body.get("errorCode") == "inexistent_user", str(error.body))
    api.users.delete(user_id)
    checked.append("users.delete of a missing user -> 204 (no error)")
    expect_raises("users.sessions.delete of a missing user -> NotFoundError", errors.NotFoundError,
                  lambda: api.users.sessions.delete(user_id))

    limited = Auth0(base_url=f"{url}/api/v2",
                    token=token_for(creds["limited_client_id"], creds["limited_client_secret"])["access_token"])
    step("limited token reads", limited.users.get(created.user_id).user_id == created.user_id)
    error = expect_raises("limited token: users.delete -> ForbiddenError", errors.ForbiddenError,
                          lambda: limited.users.delete(created.user_id))
    step("403 errorCode insufficient_scope", error.body.get("errorCode") == "insufficient_scope", str(error.body))

    control(url, "options", {"sessions_api": False})
    error = expect_raises("sessions API off: users.sessions.delete -> ForbiddenError", errors.ForbiddenError,
                          lambda: api.users.sessions.delete(created.user_id))
    step("403 errorCode operation_not_supported", error.body.get("errorCode") == "operation_not_supported")
    control(url, "options", {"sessions_api": True})

    control(url, "faults", {"rate_limit": 1})
    started = time.time()
    step("one 429: the SDK waits for x-ratelimit-reset and retries", api.users.get(created.user_id).user_id
         == created.user_id)
    step("the retry waited", time.time() - started >= 0.2, f"{time.time() - started:.2f}s")
    control(url, "faults", {"rate_limit": 1})
    asked = int(time.time())
    error = expect_raises("429 with max_retries=0 -> TooManyRequestsError", errors.TooManyRequestsError,
                          lambda: api.users.get(created.user_id, request_options={"max_retries": 0}))
    headers = {k.lower(): v for k, v in error.headers.items()}
    step("429 headers x-ratelimit-limit/remaining/reset", headers.get("x-ratelimit-remaining") == "0"
         and int(headers["x-ratelimit-reset"]) > asked and "x-ratelimit-limit" in headers)

    control(url, "faults", {"revoke_credentials": True})
    expect_raises("revoked credentials -> UnauthorizedError", errors.UnauthorizedError,
                  lambda: api.users.get(created.user_id))
    expect_raises("revoked credentials: no new token", Auth0Error,
                  lambda: token_for(creds["client_id"], creds["client_secret"]))
    server.shutdown()
    from auth0.management.version import __version__
    print(json.dumps({"platform": "auth0", "sdk": f"auth0-python {__version__}", "checked": checked}))


if __name__ == "__main__":
    main()
