#!/bin/sh
# TEST FIXTURE ONLY. Produces a compact JWS signed with RS256 entirely outside Swift, to prove
# that tokens from another implementation verify (interoperability).
#
# Usage: openssl-sign.sh HEADER.json CLAIMS.json PRIVATE-KEY.pem   → prints the JWS on stdout.
# The JSON files are signed byte for byte as given (a trailing newline is removed).
set -eu
if [ "$#" -ne 3 ]; then
    echo "usage: $0 HEADER.json CLAIMS.json PRIVATE-KEY.pem" >&2
    exit 2
fi
b64url() { openssl base64 -A | tr '+/' '-_' | tr -d '='; }
header=$(printf '%s' "$(cat "$1")" | b64url)
claims=$(printf '%s' "$(cat "$2")" | b64url)
signature=$(printf '%s.%s' "$header" "$claims" | openssl dgst -sha256 -sign "$3" -binary | b64url)
printf '%s.%s.%s\n' "$header" "$claims" "$signature"
