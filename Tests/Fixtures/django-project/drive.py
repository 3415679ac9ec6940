#!/usr/bin/env python3
"""TEST ONLY. Drives the real Django, django-allauth and python-social-auth for the Django adapter tests.

Run with .build/django-venv/bin/python and the database in SIWA_DJANGO_DATABASE_URL (see
siwa_peer/settings.py). Each subcommand prints one JSON object on one line on stdout; Django's own
output goes to stderr. Exit status 0 on success, 2 on a usage error, 1 on any other error (with
{"error": ...} on stdout).

  migrate                                  Django's own migrate, every installed app
  seed --sub S --email E [--with allauth|social|both] [--sessions N]
                                           a user linked to Apple `sub` S in allauth (provider "apple",
                                           uid S) and/or python-social-auth (provider "apple-id", uid S),
                                           signed in N times (default 1) through Django's test client;
                                           prints the user and the session keys
  check --session KEY                      whether the session cookie KEY still authenticates a user,
                                           asked through Django's test client (the full middleware)
  state --sub S                            the user behind S in each library, and that user's sessions
  foreign-keys                             every foreign key that references auth_user, from pg_constraint
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "siwa_peer.settings")

ALLAUTH_PROVIDER = "apple"
SOCIAL_PROVIDER = "apple-id"


def emit(value):
    sys.stdout.write(json.dumps(value, sort_keys=True) + "\n")
    sys.stdout.flush()


def setup():
    import django

    django.setup()


def user_json(user):
    if user is None:
        return None
    return {
        "id": user.pk,
        "username": user.get_username(),
        "email": user.email,
        "is_active": user.is_active,
    }


def sessions_of(user_id):
    """Session keys in django_session whose data names this user (the db session store)."""
    from django.contrib.sessions.models import Session
    from django.utils import timezone

    keys = []
    for session in Session.objects.filter(expire_date__gt=timezone.now()).iterator():
        if str(session.get_decoded().get("_auth_user_id")) == str(user_id):
            keys.append(session.session_key)
    return sorted(keys)


def command_migrate(_arguments):
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", interactive=False, verbosity=1, stdout=sys.stderr, stderr=sys.stderr)
    emit({"migrated": True, "tables": sorted(connection.introspection.table_names())})


def command_seed(arguments):
    from allauth.socialaccount.models import SocialAccount
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import transaction
    from django.test import Client
    from social_django.models import UserSocialAuth

    User = get_user_model()
    libraries = {"allauth": ["allauth"], "social": ["social"], "both": ["allauth", "social"]}[arguments.with_]
    with transaction.atomic():
        user = (
            SocialAccount.objects.filter(provider=ALLAUTH_PROVIDER, uid=arguments.sub).first()
            or UserSocialAuth.objects.filter(provider=SOCIAL_PROVIDER, uid=arguments.sub).first()
        )
        user = user.user if user is not None else None
        if user is None:
            user = User(username=("apple-" + arguments.sub)[:150], email=arguments.email)
            user.set_unusable_password()
            user.save()
        if "allauth" in libraries:
            SocialAccount.objects.get_or_create(
                provider=ALLAUTH_PROVIDER,
                uid=arguments.sub,
                defaults={"user": user, "extra_data": {"sub": arguments.sub, "email": arguments.email}},
            )
            # allauth keeps the address too (account_emailaddress), as a sign-in with Apple would.
            from allauth.account.models import EmailAddress

            EmailAddress.objects.get_or_create(
                user=user, email=arguments.email, defaults={"verified": True, "primary": True}
            )
        if "social" in libraries:
            UserSocialAuth.objects.get_or_create(
                provider=SOCIAL_PROVIDER,
                uid=arguments.sub,
                defaults={"user": user, "extra_data": {"auth_time": 0}},
            )
    backend = (
        "allauth.account.auth_backends.AuthenticationBackend"
        if "allauth" in libraries
        else "social_core.backends.apple.AppleIdAuth"
    )
    keys = []
    for _ in range(arguments.sessions):
        client = Client(REMOTE_ADDR="127.0.0.1", HTTP_USER_AGENT="siwa-django-peer")
        client.force_login(user, backend=backend)
        # The first request after signing in, as a browser makes it: allauth.usersessions records the
        # session here (its middleware, USERSESSIONS_TRACK_ACTIVITY), since force_login sends Django's
        # user_logged_in but not allauth's own signal, which allauth's login views send.
        response = client.get("/whoami")
        if response.status_code != 200 or not json.loads(response.content)["authenticated"]:
            raise RuntimeError("the new session does not authenticate (%d)" % response.status_code)
        keys.append(client.cookies[settings.SESSION_COOKIE_NAME].value)
    emit({"sub": arguments.sub, "user": user_json(user), "libraries": libraries, "session_keys": keys})


def command_check(arguments):
    from django.conf import settings
    from django.contrib.sessions.models import Session
    from django.test import Client

    client = Client(REMOTE_ADDR="127.0.0.1", HTTP_USER_AGENT="siwa-django-peer")
    client.cookies[settings.SESSION_COOKIE_NAME] = arguments.session
    response = client.get("/whoami")
    if response.status_code != 200:
        raise RuntimeError("whoami answered %d" % response.status_code)
    answer = json.loads(response.content)
    stored = Session.objects.filter(session_key=arguments.session).exists()
    user_session = None
    try:
        from allauth.usersessions.models import UserSession

        user_session = UserSession.objects.filter(session_key=arguments.session).exists()
    except ImportError:
        pass
    emit(
        {
            "session": arguments.session,
            "authenticated": answer["authenticated"],
            "user_id": answer["user_id"],
            "django_session_row": stored,
            "usersessions_row": user_session,
        }
    )


def command_state(arguments):
    from allauth.socialaccount.models import SocialAccount
    from allauth.usersessions.models import UserSession
    from social_django.models import UserSocialAuth

    result = {"sub": arguments.sub}
    for name, model, provider in (
        ("allauth", SocialAccount, ALLAUTH_PROVIDER),
        ("social", UserSocialAuth, SOCIAL_PROVIDER),
    ):
        link = model.objects.select_related("user").filter(provider=provider, uid=arguments.sub).first()
        user = link.user if link is not None else None
        result[name] = {
            "exists": link is not None,
            "provider": provider,
            "user": user_json(user),
            "is_active": user.is_active if user is not None else None,
            "session_keys": sessions_of(user.pk) if user is not None else [],
            "usersessions": (
                sorted(UserSession.objects.filter(user=user).values_list("session_key", flat=True))
                if user is not None
                else []
            ),
        }
    emit(result)


def command_foreign_keys(_arguments):
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT c.conrelid::regclass::text, a.attname, c.conname,
                   CASE c.confdeltype WHEN 'a' THEN 'NO ACTION' WHEN 'r' THEN 'RESTRICT'
                        WHEN 'c' THEN 'CASCADE' WHEN 'n' THEN 'SET NULL' WHEN 'd' THEN 'SET DEFAULT' END,
                   c.condeferrable, c.condeferred
            FROM pg_constraint c
            JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
            WHERE c.contype = 'f' AND c.confrelid = 'auth_user'::regclass
            ORDER BY 1, 2
            """
        )
        rows = cursor.fetchall()
    emit(
        {
            "references_auth_user": [
                {
                    "table": table,
                    "column": column,
                    "constraint": name,
                    "on_delete": on_delete,
                    "deferrable": deferrable,
                    "initially_deferred": deferred,
                }
                for table, column, name, on_delete, deferrable, deferred in rows
            ]
        }
    )


class Parser(argparse.ArgumentParser):
    def error(self, message):
        emit({"error": message})
        sys.exit(2)


def main(argv):
    parser = Parser(prog="drive.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    commands.add_parser("migrate")
    seed = commands.add_parser("seed")
    seed.add_argument("--sub", required=True)
    seed.add_argument("--email", required=True)
    seed.add_argument("--with", dest="with_", choices=["allauth", "social", "both"], default="both")
    seed.add_argument("--sessions", type=int, default=1)
    check = commands.add_parser("check")
    check.add_argument("--session", required=True)
    state = commands.add_parser("state")
    state.add_argument("--sub", required=True)
    commands.add_parser("foreign-keys")
    arguments = parser.parse_args(argv)
    handlers = {
        "migrate": command_migrate,
        "seed": command_seed,
        "check": command_check,
        "state": command_state,
        "foreign-keys": command_foreign_keys,
    }
    try:
        setup()
        handlers[arguments.command](arguments)
    except Exception as error:  # reported as JSON for the Swift test, with the type for diagnosis
        emit({"error": "%s: %s" % (type(error).__name__, error)})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
