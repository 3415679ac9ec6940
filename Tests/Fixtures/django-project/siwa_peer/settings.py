"""TEST ONLY. Settings of the minimal Django project the Django adapter tests drive (drive.py).

The database comes from the environment, never from this file:
- SIWA_DJANGO_DATABASE_URL, e.g. postgresql://postgres@/peer?host=/tmp/siwa-pg-abc123&port=5432 (a Unix
  socket directory as `host` in the query) or postgresql://user:password@host:port/name; or, when it is
  unset,
- the libpq variables PGDATABASE (required), PGUSER, PGPASSWORD, PGHOST, PGPORT.
"""

import os
from urllib.parse import parse_qs, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured


def _database_from_environment():
    url = os.environ.get("SIWA_DJANGO_DATABASE_URL", "")
    if url:
        parts = urlsplit(url)
        if parts.scheme not in ("postgres", "postgresql"):
            raise ImproperlyConfigured("SIWA_DJANGO_DATABASE_URL must be a postgresql:// URL")
        query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
        name = unquote(parts.path.lstrip("/")) or query.get("dbname", "")
        host = unquote(parts.hostname or "") if parts.hostname else query.get("host", "")
        port = str(parts.port) if parts.port else query.get("port", "")
        user = unquote(parts.username or "") or query.get("user", "")
        password = unquote(parts.password or "") or query.get("password", "")
    else:
        name = os.environ.get("PGDATABASE", "")
        host = os.environ.get("PGHOST", "")
        port = os.environ.get("PGPORT", "")
        user = os.environ.get("PGUSER", "")
        password = os.environ.get("PGPASSWORD", "")
    if not name:
        raise ImproperlyConfigured("set SIWA_DJANGO_DATABASE_URL (or PGDATABASE) to the test database")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": user,
        "PASSWORD": password,
        "HOST": host,
        "PORT": port,
        "CONN_MAX_AGE": 0,
    }


BASE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECRET_KEY = "TEST-ONLY-not-a-secret-siwa-django-peer"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "localhost"]
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
ROOT_URLCONF = "siwa_peer.urls"
SITE_ID = 1

DATABASES = {"default": _database_from_environment()}

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.sessions",
    "django.contrib.sites",
    "allauth",
    "allauth.account",
    "allauth.socialaccount",
    "allauth.socialaccount.providers.apple",
    "allauth.usersessions",
    "social_django",
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "allauth.account.middleware.AccountMiddleware",
    "allauth.usersessions.middleware.UserSessionsMiddleware",
]

# Sessions live in the database (django_session), where an adapter can end them.
SESSION_ENGINE = "django.contrib.sessions.backends.db"

AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    "allauth.account.auth_backends.AuthenticationBackend",
    "social_core.backends.apple.AppleIdAuth",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {"context_processors": ["django.template.context_processors.request"]},
    }
]

# allauth.usersessions: record each login's session (usersessions_usersession) and its last activity.
USERSESSIONS_TRACK_ACTIVITY = True

# Fast hashing: the users here never have a usable password.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

LOGGING = {"version": 1, "disable_existing_loggers": False, "root": {"handlers": [], "level": "ERROR"}}
