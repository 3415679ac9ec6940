#!/usr/bin/env python3
"""TEST ONLY. Runs one fake hosted auth platform: serve.py firebase|auth0|clerk|keycloak (see fakebase.py)."""

import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
PLATFORMS = {"firebase": "firebase", "auth0": "auth0", "clerk": "clerk", "keycloak": "keycloak"}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in PLATFORMS:
        sys.stderr.write("usage: serve.py firebase|auth0|clerk|keycloak\n")
        sys.exit(2)
    module = importlib.import_module(PLATFORMS[sys.argv[1]])
    import fakebase

    fakebase.serve(module.FakePlatform())
