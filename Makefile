# Sign in with Apple server-to-server notifications — build, test, demo.
#
# `make demo` and `make test` work on a bare Debian 12 machine with Swift: missing Debian packages are
# installed when running as root, otherwise the exact apt-get line is printed.

SWIFT      ?= swift
CONFIG     ?= debug
BUILD_FLAGS = -c $(CONFIG)
BIN         = $(shell $(SWIFT) build $(BUILD_FLAGS) --show-bin-path 2>/dev/null)
# scripts/dist's scratch path (its default): make bench builds there too, as make dist does.
DIST_SCRATCH ?= .build/dist

# What each goal needs from Debian. Building: the C libraries' headers (libcurl: outbound HTTP, through
# the HTTPClient module). The demo: PostgreSQL (server and psql), curl and python3 for the script, the
# openssl CLI for the demo's team key. Testing, on top: CA certificates, nginx, systemd-analyze, PyYAML
# and promtool (Debian's prometheus package: only its promtool is used; the server it also installs is
# not started by the tests) for validate-deploy, faketime for make test-dates, and python3-venv for the
# webhook tests' independent verifier and the reference consumers in examples/ (the PyPI packages
# standardwebhooks, cryptography and psycopg in .build/webhooks-venv).
BUILD_PACKAGES = pkg-config libpq-dev libssl-dev libmicrohttpd-dev libcurl4-openssl-dev
DEMO_PACKAGES  = $(BUILD_PACKAGES) postgresql curl python3 openssl
TEST_PACKAGES  = $(DEMO_PACKAGES) ca-certificates nginx systemd python3-yaml python3-venv prometheus faketime \
                 iproute2 util-linux

.PHONY: all deps demo-deps test-deps build release test mail-test lint format demo run coverage bench clean \
        validate-deploy webhooks-venv ssf-venv sigv4-venv django-venv platforms-venv schema schema-check dist dist-test image image-test container-deps

all: build

deps:
	@./scripts/ensure-debian-packages $(BUILD_PACKAGES)

demo-deps:
	@./scripts/ensure-debian-packages $(DEMO_PACKAGES)

test-deps:
	@./scripts/ensure-debian-packages $(TEST_PACKAGES)
	@./scripts/ensure-postfix

build: deps
	$(SWIFT) build $(BUILD_FLAGS)

release:
	$(MAKE) build CONFIG=release

lint: schema-check
	$(SWIFT) format lint --strict -r Sources Tests Plugins Fuzz Package.swift
	python3 scripts/check-imports
	python3 scripts/check-docs

# schema.sql is generated from the part files in schema/ (docs/architecture.md, "The SQL layout"): edit
# the parts, then `make schema`. The build (the EmbedSchema plugin) and `make lint` fail while it is stale.
schema:
	python3 scripts/schema

schema-check:
	@python3 scripts/schema --check

format:
	$(SWIFT) format -i -r Sources Tests Plugins Fuzz Package.swift

test: test-deps lint validate-deploy webhooks-venv ssf-venv sigv4-venv django-venv platforms-venv
	$(SWIFT) build --build-tests
	./scripts/test-schema "$$($(SWIFT) build --show-bin-path)"
	$(SWIFT) test --skip-build
	./scripts/mail-test "$$($(SWIFT) build --show-bin-path)"

# The date-sensitive suites with the clock moved by libfaketime to a month's last and first second, New
# Year and 29 February (scripts/test-dates; not part of `make test`: a few minutes per instant).
.PHONY: test-dates
# The relay-mail gate inside Debian's Postfix, end to end in a network namespace (also run by `make test`).
mail-test: test-deps
	$(SWIFT) build
	./scripts/mail-test "$$($(SWIFT) build --show-bin-path)"

test-dates: test-deps
	$(SWIFT) build --build-tests
	./scripts/test-dates "$$($(SWIFT) build --show-bin-path)"

# The database suites against Debian 13's PostgreSQL 17 (not part of `make test`, which runs Debian 12's
# 15): a root made once by mmdebstrap (`scripts/container-images postgres17`, kept in podman's store like
# the image's base; REBUILD=1 makes it again, e.g. for a point release), whose tools the test clusters
# run inside it (POSTGRES_CLUSTER_CHROOT: unshare -m, chroot as postgres). As root.
# The test targets that start PostgreSQL clusters (a regular expression for swift test --filter).
POSTGRES17_SUITES = ^(AdminSQLTests|AuthPlatformsTests|BounceEventsTests|MailGateTests|MigratorTests|PostgresTests|ProcessTests|ReceiverTests|RevokerTests|SignalDeliveryTests|SignalTransmitterTests|SignInTests|SiwactlTests|SuppressionsTests|WebhookAdministrationTests|WebhookDeliveryTests|WebhookTests|WorkerTests)\.
.PHONY: test-postgres17
test-postgres17: test-deps container-deps webhooks-venv
	$(SWIFT) build --build-tests
	root="$$(podman image mount "$$(./scripts/container-images postgres17)")" && \
	  POSTGRES_CLUSTER_CHROOT="$$root" $(SWIFT) test --skip-build \
	    --filter '$(POSTGRES17_SUITES)'

# The webhook tests verify signatures with a second implementation: the PyPI package standardwebhooks,
# installed into .build/webhooks-venv (git-ignored) by pip, which also runs examples/ in the tests.
webhooks-venv: test-deps
	@./scripts/webhooks-venv

# The Shared Signals tests verify every SET with PyJWT and cryptography (PyPI), in .build/ssf-venv.
ssf-venv: test-deps
	@./scripts/ssf-venv

# The SES tests compare each SigV4 signature with botocore's (PyPI), in .build/sigv4-venv.
sigv4-venv: test-deps
	@./scripts/sigv4-venv

# The Django adapter tests (issue 47) drive the real Django, django-allauth and social-auth-app-django
# (PyPI, pinned) in .build/django-venv, through Tests/Fixtures/django-project/drive.py; a prerequisite of
# `make test` (the suite fails, naming this target, when the venv is missing).
django-venv: test-deps
	@./scripts/django-venv

# The hosted platforms' fakes (issue 48) are checked with each vendor's own admin SDK (PyPI, pinned):
# firebase-admin, auth0-python, clerk-backend-api, python-keycloak, in .build/platforms-venv.
platforms-venv: test-deps
	@./scripts/platforms-venv

coverage: test-deps webhooks-venv ssf-venv sigv4-venv django-venv platforms-venv
	$(SWIFT) test --enable-code-coverage
	"$$(dirname "$$(readlink -f "$$(command -v $(SWIFT))")")/llvm-cov" report \
	  "$$($(SWIFT) build --show-bin-path)/siwa-notificationsPackageTests.xctest" \
	  -instr-profile="$$($(SWIFT) build --show-bin-path)/codecov/default.profdata" \
	  -ignore-filename-regex='(\.build|Tests|TestSupport|Fuzz)/'

# Benchmarks (not part of `make test`): the release binaries as make dist builds them (the Swift
# runtime linked in, --static-swift-stdlib, in dist's scratch path, so one build serves both), a
# throwaway PostgreSQL with fsync on, wrk and pgbench side by side. Pass options with BENCH_ARGS, e.g. `make bench BENCH_ARGS=--quick`.
# The worker's reference is PgQueuer (PyPI, pinned) draining no-op jobs, from .build/bench-venv.
bench: demo-deps
	@./scripts/ensure-debian-packages wrk postgresql-client python3-venv
	@./scripts/bench-venv
	$(SWIFT) build -c release --static-swift-stdlib --scratch-path $(DIST_SCRATCH)
	python3 scripts/bench.py --bin-path "$$($(SWIFT) build -c release --static-swift-stdlib \
	  --scratch-path $(DIST_SCRATCH) --show-bin-path)" $(BENCH_ARGS)

# Fuzzing (not part of `make test`): libFuzzer + AddressSanitizer targets in Fuzz/, each run for
# FUZZ_SECONDS; pick targets with FUZZ_TARGETS (e.g. `make fuzz FUZZ_TARGETS="json claims"`). New corpus
# entries, logs and crashing inputs land in fuzz-corpus-out/ (git-ignored); exits non-zero on a crash.
FUZZ_SECONDS ?= 60
.PHONY: fuzz
fuzz: deps
	SWIFT=$(SWIFT) FUZZ_SECONDS=$(FUZZ_SECONDS) ./Fuzz/fuzz.sh $(FUZZ_TARGETS)

# Fault drills (not part of `make test`): release binaries, a throwaway PostgreSQL, loopback only; PostgreSQL
# restarts, kill -9 of receiver and workers, JWKS faults, pool exhaustion, disk full, failover to a
# synchronous standby (and what asynchronous replication loses), the ESP suppression outbox against a
# fake SendGrid (throughput; kill -9 mid-call, the ESP down), the auth adapters through kill -9 (Supabase Auth,
# and the hosted platforms' fakes, whose Firebase needs the platforms venv's cryptography). Exits 1 on any lost
# acknowledged notification. Pass options with DRILLS_ARGS, e.g. `make drills DRILLS_ARGS=--quick`.
.PHONY: drills
drills: demo-deps platforms-venv
	@./scripts/ensure-debian-packages postgresql-client
	$(SWIFT) build -c release
	python3 drills/drills.py $(DRILLS_ARGS)

# Static and loopback checks of deploy/ (systemd units, nginx site, Kubernetes YAML, Dockerfile, env
# names against the binaries' --help).
validate-deploy: test-deps build
	./scripts/validate-deploy "$(BIN)"

# The whole pipeline end to end on this machine: PostgreSQL under .siwa/ (or SIWA_DATABASE_URL; as root
# with a checkout the postgres user cannot reach, under /var/tmp/siwa-demo-*, linked from .siwa), a
# stand-in for Apple's keys, receiver and worker; one notification of each type; then all is stopped.
demo: demo-deps build
	@./scripts/demo "$(BIN)"

# The same stack, kept up until Ctrl-C.
run: demo-deps build
	@./scripts/run "$(BIN)"

# Releases (not part of `make test`: minutes each). The version is the file VERSION.
#   make dist        release binaries with the Swift runtime linked in, packed as
#                    dist/siwa-<version>-linux-<arch>.tar.gz (bin/, schema.sql, deploy/, docs/, examples/,
#                    README.md, LICENSE, NOTICE, CHANGELOG.md) and dist/SHA256SUMS
#   make dist-test   that tarball on a Debian 12 root without Swift (mmdebstrap minbase + the run-time
#                    libraries): migrate, receiver and worker against PostgreSQL, one notification applied
#   make image       deploy/container/Dockerfile with podman from local Debian base images (no registry)
#   make image-test  the same first deployment from the image: non-root, read-only root file system
# The container targets run as root (podman, mmdebstrap, PostgreSQL as postgres).
VERSION       := $(shell tr -d '[:space:]' < VERSION)
DIST_TARBALL   = dist/siwa-$(VERSION)-linux-$(shell uname -m).tar.gz
IMAGE         ?= localhost/siwa:$(VERSION)
CONTAINER_PACKAGES = mmdebstrap podman buildah runc uidmap postgresql curl python3 python3-yaml

container-deps:
	@./scripts/ensure-debian-packages $(CONTAINER_PACKAGES)

dist: deps
	SWIFT=$(SWIFT) DIST_SCRATCH=$(DIST_SCRATCH) ./scripts/dist

dist-test: dist container-deps
	./scripts/install-test tarball $(DIST_TARBALL)

image: container-deps
	IMAGE=$(IMAGE) ./scripts/image

image-test: image
	./scripts/install-test image $(IMAGE)

clean:
	$(SWIFT) package clean
	if [ -L .siwa ]; then rm -rf "$$(readlink .siwa)"; fi
	rm -rf .siwa dist
