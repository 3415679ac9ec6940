# Sign in with Apple server-to-server notifications — build, test, demo.
#
# `make demo` and `make test` work on a bare Debian 12 machine with Swift: missing Debian packages are
# installed when running as root, otherwise the exact apt-get line is printed.

SWIFT      ?= swift
CONFIG     ?= debug
BUILD_FLAGS = -c $(CONFIG)
BIN         = $(shell $(SWIFT) build $(BUILD_FLAGS) --show-bin-path 2>/dev/null)

# What building and testing need from Debian (PostgreSQL server binaries for the test cluster, the
# openssl CLI for interoperability fixtures).
DEB_PACKAGES = pkg-config libpq-dev libssl-dev libmicrohttpd-dev postgresql openssl ca-certificates

.PHONY: all deps build release test lint format demo coverage bench clean

all: build

deps:
	@./scripts/ensure-debian-packages $(DEB_PACKAGES)

build: deps
	$(SWIFT) build $(BUILD_FLAGS)

release:
	$(MAKE) build CONFIG=release

lint:
	$(SWIFT) format lint --strict -r Sources Tests Package.swift

format:
	$(SWIFT) format -i -r Sources Tests Package.swift

test: deps lint
	$(SWIFT) build --build-tests
	$(SWIFT) test --skip-build

coverage: deps
	$(SWIFT) test --enable-code-coverage
	llvm-cov report "$$($(SWIFT) build --show-bin-path)/siwa-notificationsPackageTests.xctest" \
	  -instr-profile="$$($(SWIFT) build --show-bin-path)/codecov/default.profdata" \
	  -ignore-filename-regex='(\.build|Tests)/'

# Benchmarks (not part of `make test`): release binaries, a throwaway PostgreSQL with fsync on, wrk and
# pgbench side by side. Pass options with BENCH_ARGS, e.g. `make bench BENCH_ARGS=--quick`.
bench: deps
	@./scripts/ensure-debian-packages wrk postgresql-client
	$(SWIFT) build -c release
	python3 scripts/bench.py $(BENCH_ARGS)

demo: build
	@./scripts/demo "$(BIN)"

clean:
	$(SWIFT) package clean
	rm -rf .siwa
