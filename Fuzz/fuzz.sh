#!/usr/bin/env bash
# Builds the libFuzzer targets in Fuzz/Targets and runs each for a fixed time budget.
#
#   Fuzz/fuzz.sh [--build-only] [TARGET...]      (default: every target)
#
# Environment: FUZZ_SECONDS (per target, default 60), FUZZ_OUT (default fuzz-corpus-out, git-ignored).
#
# How it builds (SwiftPM's `-sanitize=fuzzer` on the whole package breaks linking its executables): the
# library modules are compiled once by SwiftPM, instrumented (`-sanitize=fuzzer,address`) and with
# `-enable-testing`, into a separate scratch path (.build/fuzz); each target is then one small Swift file
# with `@_cdecl("LLVMFuzzerTestOneInput")`, linked by swiftc against those object files with libFuzzer's
# main. `@testable import` reaches internal parsers (e.g. the JSON parser) without changing any API.
#
# Each run uses the seeds in Fuzz/corpus/TARGET and writes what it discovers to $FUZZ_OUT/corpus/TARGET;
# crashing inputs go to $FUZZ_OUT/artifacts. The summary table shows executions, exec/s, libFuzzer's
# `cov:` (edges) and `ft:` (features), and crashes. Exit status 1 if any target crashed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

SECONDS_PER_TARGET=${FUZZ_SECONDS:-60}
OUT=${FUZZ_OUT:-$ROOT/fuzz-corpus-out}
SCRATCH=$ROOT/.build/fuzz
MODULES=$SCRATCH/release
BIN=$SCRATCH/bin
SWIFT=${SWIFT:-swift}
SWIFTC=${SWIFTC:-swiftc}

# target name, -max_len, the module it needs (AppleNotifications or Receiver).
TARGETS=(
    "base64url 4096 AppleNotifications"
    "jws 16500 AppleNotifications"
    "json 16384 AppleNotifications"
    "jwks 65536 AppleNotifications"
    "rsa 4200 AppleNotifications"
    "claims 12000 AppleNotifications"
    "body 65536 Receiver"
)

build_only=0
selected=()
for argument in "$@"; do
    case "$argument" in
        --build-only) build_only=1 ;;
        -h | --help)
            sed -n '2,16p' "$0"
            exit 0
            ;;
        *) selected+=("$argument") ;;
    esac
done

is_selected() {
    [ ${#selected[@]} -eq 0 ] && return 0
    local name
    for name in "${selected[@]}"; do [ "$name" = "$1" ] && return 0; done
    return 1
}

for name in "${selected[@]}"; do
    [ -f "Fuzz/Targets/$name.swift" ] || { echo "fuzz: no target named '$name'" >&2; exit 2; }
done

# 1. The library modules, instrumented. lld: gold hits an internal error on ASan-instrumented objects.
echo "fuzz: building instrumented modules into $SCRATCH"
"$SWIFT" build -c release --scratch-path "$SCRATCH" \
    -Xswiftc -sanitize=fuzzer,address -Xswiftc -enable-testing -Xswiftc -use-ld=lld \
    --target Receiver >"$SCRATCH.log" 2>&1 || { cat "$SCRATCH.log" >&2; exit 2; }

# 2. One binary per target.
mkdir -p "$BIN"
common=(-O -swift-version 6 -parse-as-library -sanitize=fuzzer,address -use-ld=lld
    -I "$MODULES/Modules" -I "$ROOT/Sources/COpenSSL")
receiver=(-I "$ROOT/Sources/CLibPQ" -I "$ROOT/Sources/CMicroHTTPD" -I "$MODULES/CHTTPShim.build"
    -I "$ROOT/Sources/CCurl" -I "$MODULES/CCurlShim.build"
    $(pkg-config --cflags-only-I libpq | sed 's/-I/-Xcc -I/g')
    "$MODULES"/Receiver.build/*.o "$MODULES"/Postgres.build/*.o "$MODULES"/HTTPServer.build/*.o
    "$MODULES"/ServiceSupport.build/*.o "$MODULES"/CHTTPShim.build/*.o
    "$MODULES"/HTTPClient.build/*.o "$MODULES"/CCurlShim.build/*.o "$MODULES"/AppleKeys.build/*.o
    -lpq -lmicrohttpd -lcurl)
for entry in "${TARGETS[@]}"; do
    read -r name max_len module <<<"$entry"
    is_selected "$name" || continue
    extra=()
    [ "$module" = Receiver ] && extra=("${receiver[@]}")
    echo "fuzz: linking fuzz-$name"
    "$SWIFTC" "${common[@]}" "Fuzz/Targets/$name.swift" Fuzz/Support/*.swift "$MODULES"/AppleNotifications.build/*.o \
        "$MODULES"/Crypto.build/*.o "${extra[@]}" -lcrypto -o "$BIN/fuzz-$name"
done
[ "$build_only" = 1 ] && exit 0

# 3. Run each for its budget and summarise. Swift's own crash backtracer is turned off: it reads the
# crashed process's memory in a way AddressSanitizer reports as a use-after-free, which would bury the
# real report; libFuzzer's deadly-signal handler prints the stack instead.
export SWIFT_BACKTRACE=enable=no
mkdir -p "$OUT/artifacts" "$OUT/logs"
rows=()
crashed=0
for entry in "${TARGETS[@]}"; do
    read -r name max_len module <<<"$entry"
    is_selected "$name" || continue
    mkdir -p "$OUT/corpus/$name"
    log=$OUT/logs/$name.log
    dictionary=()
    [ -f "Fuzz/dictionaries/$name.dict" ] && dictionary=(-dict="Fuzz/dictionaries/$name.dict")
    echo "fuzz: running $name for ${SECONDS_PER_TARGET}s (-max_len=$max_len)"
    status=0
    "$BIN/fuzz-$name" "$OUT/corpus/$name" "Fuzz/corpus/$name" -max_total_time="$SECONDS_PER_TARGET" \
        -max_len="$max_len" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$OUT/artifacts/$name-" "${dictionary[@]}" >"$log" 2>&1 || status=$?
    # A crash while loading the seeds leaves no stats or coverage lines: hence the `|| true`s.
    executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1 || true)
    speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1 || true)
    coverage=$({ grep -o 'cov: [0-9]*' "$log" || true; } | tail -1 | cut -d' ' -f2)
    features=$({ grep -o 'ft: [0-9]*' "$log" || true; } | tail -1 | cut -d' ' -f2)
    artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1 || true)
    crash=0
    if [ "$status" -ne 0 ] || [ -n "$artifact" ]; then
        crash=1
        crashed=1
        echo "fuzz: $name CRASHED (exit $status); input: ${artifact:-see $log}; log: $log" >&2
        grep -m 5 -E 'ERROR|Fatal error|SUMMARY' "$log" >&2 || true
    fi
    rows+=("$name ${executions:-?} ${speed:-?} ${coverage:-?} ${features:-?} $crash")
done

printf '\n%-10s %12s %8s %7s %7s %8s\n' target executions exec/s cov ft crashes
for row in "${rows[@]}"; do
    # shellcheck disable=SC2086
    printf '%-10s %12s %8s %7s %7s %8s\n' $row
done
printf 'budget: %ss per target; new corpus entries: %s/corpus; logs: %s/logs\n' \
    "$SECONDS_PER_TARGET" "$OUT" "$OUT"
exit "$crashed"
