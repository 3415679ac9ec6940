#!/usr/bin/env python3
"""make drills: fault drills that prove nothing acknowledged is lost.

Each drill runs the real binaries against a throwaway PostgreSQL cluster (fsync on, run as `postgres`
when we are root) on loopback only, breaks something on purpose under load, and checks the invariant:

    every jti that was answered 200 is in siwa.notification_log (exactly once: (jti, iat) is its primary
    key, and a redelivery is the same token).

  1. PostgreSQL stopped (fast, then immediate mode) and restarted under load; the receiver is not restarted.
  2. kill -9 of the receiver under load, then a restart on the same port.
  3. kill -9 of siwa-worker processes mid-batch, repeatedly, while they drain queued events whose
     siwa.on_event hook counts its effects by jti under a unique constraint.
  4. The JWKS endpoint down, slow (beyond the fetch timeout), returning garbage, flapping, and serving a
     key set without the needed key; then recovered, with no receiver restart.
  5. Pool / connection exhaustion: the table locked by another session beyond the commit timeout with
     --pool-size 2, and every connection the receiver's role may open held by another client; and disk
     full: the log's partitions and the queue in a tablespace on a 2 MiB tmpfs mounted for the drill (root only; skipped,
     with the reason printed, where mounting is not allowed).
  6. Failover to a streaming standby under load: a primary and a synchronous standby (pg_basebackup -R),
     the receiver and a worker connected to both hosts with target_session_attrs=read-write; the primary's
     WAL sender stopped for a moment, then every primary process killed -9 and the standby promoted. Every
     jti answered 200 is on the new primary, applied exactly once; 503 and /readyz 503 while there is no
     primary; both services recover by themselves. 6b repeats it with asynchronous replication and
     reports (without failing) the acknowledged notifications it loses.
  7. The ESP suppression outbox against a fake SendGrid on loopback: its throughput (one worker, a fast
     fake, 10,000 adds), then alternating email-disabled/enabled events over the same addresses while
     the worker is killed -9 mid-call and the fake is stopped for a while and started again: every
     address's list changes exactly as the events asked, once each, in order, and no row is dead.
  8. Auth adapters (Supabase Auth): each user's events (consent revoked, a team transfer for every
     third, the account's deletion for every other) applied through the adapter while siwa-worker is
     killed -9 repeatedly: every row done once, no session left, each identity as the events say.
  9. Hosted adapters (Firebase Auth, Auth0, Clerk, Keycloak) against their fakes on loopback
     (Tests/Fixtures/hosted-platforms): the same events, with 429s, while siwa-worker is killed -9
     repeatedly: every row finished, none dead, each user as its platform's policy table says.

Each drill prints what it did and the counts it checked; the run ends with a summary table and exits 1 on
any violation. Known limitations are reported as findings with their numbers (--strict makes them fail). Standard library only; reuses scripts/bench.py's helpers.
"""

import argparse
import base64
import functools
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # leave no __pycache__ in scripts/ behind
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import bench  # noqa: E402  (the same repository's benchmark helpers)
from bench import http_status, port_of, start_listening, wait_until  # noqa: E402

AUDIENCE = "com.example.drills"
# NotificationStore.Configuration's default commitTimeout: a request never waits longer for its commit.
COMMIT_TIMEOUT_S = 10
# JWKSSource's default fetch timeout (the receiver waits at most this + 1 s for one fetch).
JWKS_FETCH_TIMEOUT_S = 10
# --strict: findings (known limitations) count as violations.
STRICT = [False]


log = functools.partial(bench.log, tag="drills", stream=sys.stdout)


class DrillFailure(Exception):
    pass


# What ends a drill early: its own failures, and bench.wait_until's timeouts.
ABORTS = (DrillFailure, bench.WaitTimeout)


# ---------------------------------------------------------------------------------------------------
# PostgreSQL
# ---------------------------------------------------------------------------------------------------

class Cluster(bench.Cluster):
    """bench.py's throwaway cluster, small (drills care about failures, not speed)."""

    def __init__(self, root):
        super().__init__(root, settings="-c max_connections=100 -c shared_buffers=64MB")

    def psql(self, db, sql):
        try:
            return super().psql(db, sql)
        except RuntimeError as error:
            raise DrillFailure(str(error)) from None

    def stored_jtis(self, db):
        out = self.psql(db, "SELECT jti FROM siwa.notification_log")
        return out.split("\n") if out else []


# ---------------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------------

class Receiver:
    """siwa-receiver on port 0 the first time (the kernel's choice, read back from --listen-address-file);
    a restart binds the port it had, as a restarted receiver behind a fixed address does."""

    def __init__(self, ctx, name, database_url, jwks_url, extra=(), threads=32):
        self.ctx = ctx
        self.name = name
        self.port = 0
        self.log_path = os.path.join(ctx.workdir, f"{name}.log")
        self.arguments = [
            ctx.binaries["siwa-receiver"], "--database-url", database_url,
            "--audience", AUDIENCE, "--jwks-url", jwks_url, "--threads", str(threads), "--log-level", "warning", *extra]
        self.process = None

    def start(self, ready="/readyz"):
        with open(self.log_path, "a") as out:
            try:
                self.process, listeners = start_listening(
                    [*self.arguments, "--listen", f"127.0.0.1:{self.port}"], f"receiver-{self.name}", timeout=30,
                    stdout=out, stderr=out)
            except RuntimeError as error:
                raise DrillFailure(f"{error}; see {self.log_path}") from None
        self.port = port_of(listeners["notifications"])
        wait_until(lambda: http_status(f"http://127.0.0.1:{self.port}{ready}") == 200
                   or self.process.poll() is not None,
                   "the receiver to be ready", timeout=30)
        if self.process.poll() is not None:
            raise DrillFailure(f"siwa-receiver exited with {self.process.returncode}; see {self.log_path}")
        return self

    def alive(self):
        return self.process is not None and self.process.poll() is None

    def kill9(self):
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self):
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


# ---------------------------------------------------------------------------------------------------
# Load: distinct pre-signed notifications, every answer recorded per jti
# ---------------------------------------------------------------------------------------------------

def jti_of(body):
    token = json.loads(body)["payload"]
    claims = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))["jti"]


def load_bodies(path):
    with open(path) as f:
        return [(jti_of(line), line.strip().encode()) for line in f if line.strip()]


class Answers:
    """Every answer, per jti: (status or 'error', sent at (monotonic), seconds taken)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.by_jti = {}

    def record(self, jti, status, sent, seconds):
        with self.lock:
            self.by_jti.setdefault(jti, []).append((status, sent, seconds))

    def all(self):
        with self.lock:
            return [(jti, *answer) for jti, answers in self.by_jti.items() for answer in answers]

    def acknowledged(self):
        with self.lock:
            return {jti for jti, answers in self.by_jti.items() if any(a[0] == 200 for a in answers)}


def post(connection, body):
    connection.request("POST", "/apple/notifications", body=body, headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    text = response.read()
    return response.status, text


class Load:
    """`threads` keep-alive clients posting distinct bodies, each once, until stopped or out of bodies."""

    def __init__(self, port_of, bodies, answers, threads=16, pause=0.01, timeout=30):
        self.port_of = port_of  # a callable: drill 2 moves nothing, but reads the port each reconnect
        self.bodies = bodies
        self.answers = answers
        self.pause = pause
        self.timeout = timeout
        self.next = 0
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def start(self):
        for thread in self.threads:
            thread.start()
        return self

    def stop(self):
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=self.timeout + 5)

    @property
    def exhausted(self):
        with self.lock:
            return self.next >= len(self.bodies)

    def _take(self):
        with self.lock:
            if self.next >= len(self.bodies):
                return None
            self.next += 1
            return self.bodies[self.next - 1]

    def _run(self):
        connection = None
        while not self.stopping.is_set():
            item = self._take()
            if item is None:
                return
            jti, body = item
            if connection is None:
                connection = http.client.HTTPConnection("127.0.0.1", self.port_of(), timeout=self.timeout)
            started = time.monotonic()
            try:
                status, _ = post(connection, body)
            except (OSError, http.client.HTTPException):
                status = "error"
                connection.close()
                connection = None
            self.answers.record(jti, status, started, time.monotonic() - started)
            if status in ("error", 503):
                time.sleep(0.05)  # back off a little, as Apple does, instead of burning bodies
            elif self.pause:
                time.sleep(self.pause)
        if connection:
            connection.close()


# ---------------------------------------------------------------------------------------------------
# Checking and reporting
# ---------------------------------------------------------------------------------------------------

class Result:
    def __init__(self, name):
        self.name = name
        self.counts = {}
        self.violations = []
        self.notes = []
        self.findings = []

    def check(self, ok, message):
        mark = "ok" if ok else "VIOLATION"
        log(f"  [{mark}] {message}")
        if not ok:
            self.violations.append(message)

    def finding(self, ok, message):
        """A check that fails the run only with --strict: a known limitation, reported with its numbers."""
        if ok or STRICT[0]:
            self.check(ok, message)
            return
        log(f"  [finding: not met] {message}")
        self.notes.append("finding: see log")
        self.findings.append(message)

    @property
    def passed(self):
        return not self.violations


def check_invariant(result, cluster, db, answers):
    """Every 200-acknowledged jti is stored; no jti is stored twice. Fills the standard counts."""
    every = answers.all()
    acknowledged = answers.acknowledged()
    stored_list = cluster.stored_jtis(db)
    stored = set(stored_list)
    lost = acknowledged - stored
    statuses = [a[1] for a in every]
    result.counts.update({
        "sent": len(every),
        "200": statuses.count(200),
        "503": statuses.count(503),
        "conn errors": statuses.count("error"),
        "other": len(every) - statuses.count(200) - statuses.count(503) - statuses.count("error"),
        "stored": len(stored_list),
        "lost": len(lost),
        "dup rows": len(stored_list) - len(stored),
    })
    c = result.counts
    log(f"  sent {c['sent']}, 200 {c['200']}, 503 {c['503']}, connection errors {c['conn errors']}, "
        f"other {c['other']}; stored {c['stored']}, lost {c['lost']}, duplicate rows {c['dup rows']}")
    unacknowledged_but_stored = len(stored - acknowledged)
    if unacknowledged_but_stored:
        log(f"  ({unacknowledged_but_stored} stored without a 200 reaching the client: committed while the "
            "answer was lost or timed out; Apple's retry gets `duplicate`, which is allowed)")
    result.check(not lost, f"every 200-acknowledged jti is stored ({len(acknowledged)} acknowledged, "
                           f"{len(lost)} lost{': e.g. ' + sorted(lost)[0] if lost else ''})")
    result.check(c["dup rows"] == 0, "no jti is stored twice")


def answered_after(answers, instant, status):
    return any(a[1] == status and a[2] >= instant for a in answers.all())


def answered_between(answers, start, end, status):
    return sum(1 for a in answers.all() if a[1] == status and start <= a[2] + a[3] and a[2] <= end)


# ---------------------------------------------------------------------------------------------------
# Drills
# ---------------------------------------------------------------------------------------------------

def drill_postgres_restart(ctx, mode):
    result = Result(f"1 PostgreSQL stop/start ({mode})")
    log(f"drill {result.name}: stop PostgreSQL -m {mode} for {ctx.down_seconds} s under load, start it "
        "again; the receiver keeps running")
    db = f"drill1_{mode}"
    ctx.cluster.create_database(db)
    receiver = Receiver(ctx, db, ctx.cluster.url(db), ctx.jwks_url).start()
    pid = receiver.process.pid
    answers = Answers()
    load = Load(lambda: receiver.port, ctx.bodies, answers, threads=ctx.threads).start()
    try:
        time.sleep(ctx.warmup)
        down_at = time.monotonic()
        ctx.cluster.stop(mode)
        log(f"  PostgreSQL stopped ({mode})")
        time.sleep(ctx.down_seconds)
        up_at = time.monotonic()
        ctx.cluster.start()
        log(f"  PostgreSQL started again after {up_at - down_at:.1f} s")
        wait_until(lambda: answered_after(answers, time.monotonic() - 0.5, 200) and
                   answered_after(answers, up_at, 200), "200s after the restart", timeout=30)
        recovered = time.monotonic() - up_at
        time.sleep(ctx.warmup)
    finally:
        load.stop()
    while_down = answered_between(answers, down_at, up_at, 503)
    result.check(while_down > 0, f"503 while PostgreSQL was down ({while_down} answers)")
    log(f"  200s again {recovered:.1f} s after PostgreSQL started")
    result.check(receiver.alive() and receiver.process.pid == pid, "the receiver was never restarted")
    result.check(not load.exhausted, "the load ran for the whole drill (bodies left over)")
    receiver.stop()
    check_invariant(result, ctx.cluster, db, answers)
    return result


def drill_receiver_kill(ctx):
    result = Result("2 kill -9 receiver")
    log(f"drill {result.name}: kill -9 the receiver under load {ctx.kills} times, restart it on the port it had")
    db = "drill2"
    ctx.cluster.create_database(db)
    receiver = Receiver(ctx, db, ctx.cluster.url(db), ctx.jwks_url).start()
    answers = Answers()
    load = Load(lambda: receiver.port, ctx.bodies, answers, threads=ctx.threads).start()
    restarted_at = []
    try:
        for kill in range(ctx.kills):
            time.sleep(ctx.warmup)
            receiver.kill9()
            log(f"  kill -9 #{kill + 1} (in flight: whatever the 16 clients had sent)")
            time.sleep(0.5)
            receiver.start()
            restarted_at.append(time.monotonic())
            wait_until(lambda: answered_after(answers, restarted_at[-1], 200), "200s after the restart", timeout=30)
        time.sleep(ctx.warmup)
    finally:
        load.stop()
    errors = sum(1 for a in answers.all() if a[1] == "error")
    result.check(errors > 0, f"clients saw the crashes ({errors} connection errors)")
    result.check(all(answered_after(answers, t, 200) for t in restarted_at), "200s after every restart")
    result.check(not load.exhausted, "the load ran for the whole drill (bodies left over)")
    receiver.stop()
    check_invariant(result, ctx.cluster, db, answers)
    return result


HOOK_SQL = """
CREATE SCHEMA drill;
CREATE TABLE drill.hook_effects (
    jti        text PRIMARY KEY,
    event_type text NOT NULL,
    backend    integer NOT NULL DEFAULT pg_backend_pid(),
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE OR REPLACE FUNCTION siwa.on_event(event_type text, sub text, event_time timestamptz, email text, jti text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_sleep(%(sleep)s);
    INSERT INTO drill.hook_effects (jti, event_type) VALUES (on_event.jti, on_event.event_type);
END;
$$;
"""


def drill_worker_kill(ctx):
    result = Result("3 kill -9 workers")
    events, subs = ctx.worker_events, max(1, ctx.worker_events // 5) | 1
    log(f"drill {result.name}: {events} queued events over {subs} users with sessions, a counting "
        "siwa.on_event hook (unique by jti); 2 workers, one killed -9 every ~0.5 s and restarted")
    db = "drill3"
    cluster = ctx.cluster
    cluster.create_database(db)
    cluster.psql(db, HOOK_SQL % {"sleep": ctx.hook_sleep})
    cluster.psql(db, f"""
        INSERT INTO siwa.sessions (sub, created_at)
        SELECT 'drill-sub-' || g, now() - interval '1 day' FROM generate_series(0, {subs - 1}) g""")
    # Each with a token signed by key A with exactly its claims: the workers verify every stored token.
    rows = os.path.join(ctx.workdir, "drill3-rows.tsv")
    bench.drain_rows(ctx.binaries["siwa-bench"], ctx.keys_a, "drill-key-a", AUDIENCE, events, rows, subs=subs,
                     jti_prefix="drill3-", sub_prefix="drill-sub-")
    bench.load_drain_rows(cluster, db, rows)
    cluster.psql(db, "VACUUM ANALYZE")  # a statement of its own: VACUUM cannot run in a transaction
    def arguments(slot):
        # application_name tells the two workers' sessions apart in pg_stat_activity.
        return [ctx.binaries["siwa-worker"], "--database-url", cluster.url(db) + f"&application_name=drill-worker-{slot}",
                "--concurrency", "1", "--batch-size", "50", "--poll-interval", "0.2", "--retry-base-delay", "0.1",
                "--jwks-url", ctx.jwks_url, "--audience", AUDIENCE, "--log-level", "warning"]

    log_path = os.path.join(ctx.workdir, "drill3-workers.log")
    out = open(log_path, "a")
    workers = [subprocess.Popen(arguments(slot), stdout=out, stderr=out) for slot in range(2)]
    kills, mid_batch = 0, 0
    pending = lambda: int(cluster.psql(db, "SELECT count(*) FROM siwa.notification_queue"))
    started = time.monotonic()
    try:
        while pending() > 0 and time.monotonic() - started < ctx.worker_timeout:
            time.sleep(random.uniform(0.35, 0.65))
            victim = random.randrange(2)
            # A batch in flight shows as the victim's session actively running the claim-and-apply function.
            busy = int(cluster.psql(db, "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
                                        f"AND application_name = 'drill-worker-{victim}' "
                                        "AND (query LIKE '%claim_notifications%' "
                                        "OR query LIKE '%apply_verified_notifications%')"))
            workers[victim].send_signal(signal.SIGKILL)
            workers[victim].wait()
            kills += 1
            mid_batch += 1 if busy else 0
            workers[victim] = subprocess.Popen(arguments(victim), stdout=out, stderr=out)
        log(f"  {kills} kill -9s ({mid_batch} while a batch was executing); waiting for the queue to drain")
        wait_until(lambda: pending() == 0, "every event to be finished", timeout=ctx.worker_timeout)
        drained = time.monotonic() - started
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
        for worker in workers:
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
        out.close()
    row = cluster.psql(db, """
        SELECT count(*) FILTER (WHERE state = 'applied'), count(*) FILTER (WHERE state = 'dead'),
               count(*) FILTER (WHERE state NOT IN ('applied', 'dead')),
               count(*) FILTER (WHERE state = 'skipped' AND last_error LIKE 'account erased:%'),
               count(*) FILTER (WHERE last_error LIKE '%23505%' OR last_error ILIKE '%duplicate key%'),
               count(*) FILTER (WHERE last_error IS NOT NULL), coalesce(max(attempts), 0),
               (SELECT count(*) FROM drill.hook_effects),
               (SELECT count(*) FROM drill.hook_effects h
                 WHERE NOT EXISTS (SELECT 1 FROM siwa.notifications n WHERE n.jti = h.jti)),
               (SELECT count(*) FROM siwa.sessions s WHERE s.revoked_at IS NULL AND EXISTS (
                    SELECT 1 FROM siwa.notifications n
                     WHERE n.sub = s.sub AND n.event_type IN ('consent-revoked', 'account-delete'))),
               (SELECT count(*) FROM siwa.sessions WHERE revoked_at IS NOT NULL)
          FROM siwa.notifications""").split("|")
    applied, dead, other, erased, duplicate_errors, errors, max_attempts, hooks, stray, unrevoked, revoked = \
        map(int, row)
    # A user's events queued behind its account-delete find the account erased, their tokens cleared with
    # it: nothing to verify and nothing to change, so they end skipped (the worker applies only what it
    # verified), not applied.
    log(f"  drained in {drained:.1f} s: applied {applied}, skipped after erasure {erased}, dead {dead}, "
        f"other {other - erased}, hook effects {hooks}, "
        f"rows with an error recorded {errors} (duplicate-key {duplicate_errors}), max attempts {max_attempts}, "
        f"sessions revoked {revoked}")
    result.counts.update({"sent": events, "stored": events, "lost": events - applied - erased,
                          "dup rows": hooks - applied})
    result.notes.append(f"{kills} kills, {mid_batch} mid-batch")
    result.check(kills >= 3, f"workers were killed repeatedly while draining ({kills})")
    result.check(mid_batch > 0, f"at least one kill landed while a batch was executing ({mid_batch})")
    result.check(applied + erased == events and other == erased,
                 f"every event ends applied, or skipped after its account was erased ({applied} + {erased}/{events})")
    result.check(dead == 0, "no event is dead")
    result.check(hooks == applied and stray == 0,
                 f"each hook effect exactly once ({hooks} for {applied} applied events)")
    result.check(duplicate_errors == 0, "no duplicate-key error recorded as a failure")
    result.check(unrevoked == 0, f"every session of a revoked or deleted user is revoked ({unrevoked} left)")
    return result


class JWKSServer:
    """A controllable stand-in for Apple's key endpoint: ok (key A), both (A and B), slow, garbage, error,
    flap (alternately error and ok), or down (not listening)."""

    def __init__(self, set_a, set_b, slow_seconds):
        self.port = 0  # the kernel's choice on the first start; up() binds it again
        self.sets = {"ok": set_a, "both": json.dumps({"keys": json.loads(set_a)["keys"] + json.loads(set_b)["keys"]})}
        self.slow_seconds = slow_seconds
        self.mode = "ok"
        self.requests = 0
        self.server = None
        self.start()

    def start(self):
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                owner.requests += 1
                mode = owner.mode
                if mode == "flap":
                    mode = "error" if owner.requests % 2 else "ok"
                if mode == "slow":
                    time.sleep(owner.slow_seconds)
                    mode = "both"
                if mode == "error":
                    body, status = b'{"error":"try later"}', 503
                elif mode == "garbage":
                    body, status = b"<html>\x00\xffnot a key set", 200
                else:
                    body, status = owner.sets[mode].encode(), 200
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the receiver gave up waiting (slow mode)

        ThreadingHTTPServer.daemon_threads = True
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.listening = True

    def down(self):
        self.server.shutdown()
        self.server.server_close()
        self.listening = False

    def up(self, mode):
        self.mode = mode
        self.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}/auth/keys"


def drill_jwks(ctx):
    result = Result("4 JWKS faults")
    log(f"drill {result.name}: receiver with --jwks-cooldown 1 against a controllable key server; tokens "
        "signed by a served key (A) and by a key (B) the server adds only at the end")
    db = "drill4"
    ctx.cluster.create_database(db)
    server = JWKSServer(ctx.jwks_a, ctx.jwks_b, slow_seconds=JWKS_FETCH_TIMEOUT_S + 3)
    receiver = Receiver(ctx, db, ctx.cluster.url(db), server.url, extra=["--jwks-cooldown", "1"]).start()
    answers = Answers()
    a_bodies, b_bodies = iter(ctx.bodies), iter(ctx.bodies_b)

    def send(kind, expect_fast=False):
        jti, body = next(a_bodies if kind == "A" else b_bodies)
        connection = http.client.HTTPConnection("127.0.0.1", receiver.port, timeout=JWKS_FETCH_TIMEOUT_S + 10)
        started = time.monotonic()
        try:
            status, text = post(connection, body)
        except (OSError, http.client.HTTPException):
            status, text = "error", b""
        finally:
            connection.close()
        seconds = time.monotonic() - started
        answers.record(jti, status, started, seconds)
        return status, text, seconds

    def phase(name, mode, b_expected, settle=1.3, known=5, tries_timeout=30.0):
        if mode == "down":
            if server.listening:
                server.down()
        elif not server.listening:
            server.up(mode)
        else:
            server.mode = mode
        time.sleep(settle)  # past the cooldown, so the next miss fetches again
        known_answers = [send("A") for _ in range(known)]
        slowest = max(s for _, _, s in known_answers)
        result.check(all(s == 200 for s, _, _ in known_answers) and slowest < 2.0,
                     f"{name}: known kid A verifies ({known}× 200, slowest {slowest * 1000:.0f} ms)")
        # The unknown kid B: poll until the expected answer (a slow fetch in flight may still be running).
        seen = []
        deadline = time.monotonic() + tries_timeout
        while time.monotonic() < deadline:
            status, text, seconds = send("B")
            seen.append(status)
            if status == b_expected:
                break
            time.sleep(0.3)
        wrong = [s for s in seen if s not in (200, 401, 503)] + ([200] if b_expected != 200 and 200 in seen else [])
        if b_expected == 503:
            result.check(b"keys_unavailable" in text, f"{name}: the 503 says keys_unavailable")
        result.check(seen[-1] == b_expected and not wrong,
                     f"{name}: unknown kid B gets {b_expected} (answers {seen}, last in {seconds:.1f} s)")
        return seconds

    def slow_phase():
        # The last fetch succeeded, so nothing fetches until B misses: that miss starts a fetch which hangs
        # (the server would answer with B after 13 s). Known kids must not wait for it; B must get 503 once
        # the 10 s fetch timeout passes, never a late 200.
        name = f"endpoint slow ({server.slow_seconds} s > {JWKS_FETCH_TIMEOUT_S} s fetch timeout)"
        server.mode = "slow"
        time.sleep(1.3)
        b_answer = []
        b_thread = threading.Thread(target=lambda: b_answer.append(send("B")), daemon=True)
        b_thread.start()
        time.sleep(0.5)
        known_answers = [send("A") for _ in range(5)]
        slowest = max(s for _, _, s in known_answers)
        result.check(all(s == 200 for s, _, _ in known_answers) and slowest < 2.0 and b_thread.is_alive(),
                     f"{name}: known kid A verifies while B's fetch hangs (5× 200, slowest {slowest * 1000:.0f} ms)")
        b_thread.join(timeout=JWKS_FETCH_TIMEOUT_S + 10)
        status, _, seconds = b_answer[0] if b_answer else ("no answer", b"", 0.0)
        result.check(status == 503 and seconds <= JWKS_FETCH_TIMEOUT_S + 2.5,
                     f"{name}: unknown kid B gets 503 after the fetch timeout ({status} in {seconds:.1f} s)")

    try:
        slow_phase()
        phase("endpoint down", "down", 503)
        phase("endpoint returns garbage", "garbage", 503)
        phase("endpoint answers 503", "error", 503)
        phase("endpoint flapping (503 / set without B)", "flap", 401)
        phase("fresh set still without B", "ok", 401)
        phase("recovered: set with B", "both", 200, known=3)
        result.check(receiver.alive(), "the receiver recovered without a restart")
        failures = metric(receiver.port, 'siwa_jwks_fetches_total{result="failure"}')
        result.check(failures > 0, f"failed fetches were counted in siwa_jwks_fetches_total ({failures:.0f})")
    finally:
        receiver.stop()
        if server.listening:
            server.down()
    check_invariant(result, ctx.cluster, db, answers)
    return result


def metric_or_none(port, name):
    """`metric`, or None while nothing answers on `port`."""
    try:
        return metric(port, name)
    except (OSError, http.client.HTTPException):
        return None


def metric(port, name):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    connection.close()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def drill_table_lock(ctx):
    result = Result("5a pool-size 2, table locked")
    hold = COMMIT_TIMEOUT_S + 4
    log(f"drill {result.name}: siwa-receiver --pool-size 2 under load while psql holds "
        f"LOCK TABLE siwa.notifications (log and queue) IN ACCESS EXCLUSIVE MODE for {hold} s")
    db = "drill5a"
    ctx.cluster.create_database(db)
    receiver = Receiver(ctx, db, ctx.cluster.url(db), ctx.jwks_url, extra=["--pool-size", "2"]).start()
    answers = Answers()
    load = Load(lambda: receiver.port, ctx.bodies, answers, threads=ctx.threads).start()
    try:
        time.sleep(ctx.warmup)
        locked_at = time.monotonic()
        locker = subprocess.Popen(
            ctx.cluster.psql_command(db) + ["-c", "BEGIN", "-c", "LOCK TABLE siwa.notifications IN ACCESS "
                                            f"EXCLUSIVE MODE", "-c", f"SELECT pg_sleep({hold})", "-c", "COMMIT"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        locker.wait(timeout=hold + 30)
        released_at = time.monotonic()
        log(f"  lock held {released_at - locked_at:.1f} s, released")
        wait_until(lambda: answered_after(answers, released_at, 200), "200s after the lock is released", 30)
        time.sleep(ctx.warmup)
    finally:
        load.stop()
    during = [a for a in answers.all() if a[2] >= locked_at and a[2] < released_at]
    slowest = max((a[3] for a in during), default=0.0)
    by_latency = sorted(during, key=lambda a: -a[3])[:6]
    log("  slowest answers while locked: " + ", ".join(
        f"{a[1]} in {a[3]:.1f} s (sent +{a[2] - locked_at:.1f} s)" for a in by_latency))
    errors = [a for a in answers.all() if a[1] == "error"]
    if errors:
        log("  connection errors (sent relative to the lock, after): " + ", ".join(
            f"+{a[2] - locked_at:.1f} s after {a[3]:.2f} s" for a in sorted(errors, key=lambda a: a[2])))
    unavailable = sum(1 for a in during if a[1] == 503)
    result.check(unavailable > 0, f"503 while the table was locked ({unavailable} answers)")
    slowest_503 = max((a[3] for a in during if a[1] == 503), default=0.0)
    result.check(slowest_503 <= COMMIT_TIMEOUT_S + 2.5,
                 f"every 503 came within the {COMMIT_TIMEOUT_S} s commit timeout (slowest {slowest_503:.1f} s)")
    # The commit timeout counts from a request's arrival, waiting for a handler thread included, so no
    # client waits much beyond it. (Before handlers moved off libmicrohttpd's I/O threads, a request
    # could wait behind another connection's blocked handler on its thread: this drill found that.)
    queued = [a for a in during if a[3] > COMMIT_TIMEOUT_S + 2.5 or a[1] == "error"]
    result.check(not queued,
                   f"every request is answered within the {COMMIT_TIMEOUT_S} s commit timeout (slowest "
                   f"{slowest:.1f} s; {len(queued)} not: "
                   + ", ".join(f"{a[1]} after {a[3]:.1f} s" for a in sorted(queued, key=lambda a: -a[3])[:6])
                   + ")")
    result.check(receiver.alive(), "service recovered without a restart")
    receiver.stop()
    check_invariant(result, ctx.cluster, db, answers)
    return result


def drill_head_of_line(ctx):
    """5a's worst case made deterministic: one handler thread, two connections, the table locked. The
    second request waits for the thread; its commit deadline counts from its arrival, so it is answered
    (503) at the commit timeout too, not after the first request's wait plus its own."""
    result = Result("5d one handler thread, table locked")
    hold = COMMIT_TIMEOUT_S + 4
    log(f"drill {result.name}: siwa-receiver --threads 1 --pool-size 2; the table locked for {hold} s; "
        "two requests on two connections, 0.2 s apart")
    db = "drill5d"
    ctx.cluster.create_database(db)
    receiver = Receiver(ctx, db, ctx.cluster.url(db), ctx.jwks_url, extra=["--pool-size", "2"], threads=1).start()
    answers = Answers()
    locker = subprocess.Popen(
        ctx.cluster.psql_command(db) + ["-c", "BEGIN", "-c", "LOCK TABLE siwa.notifications IN ACCESS EXCLUSIVE "
                                        "MODE", "-c", f"SELECT pg_sleep({hold})", "-c", "COMMIT"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: ctx.cluster.psql(db, "SELECT count(*) FROM pg_locks WHERE mode = 'AccessExclusiveLock' "
                                                "AND relation = 'siwa.notification_log'::regclass") == "1",
                   "the lock to be held", 10)

        def one(index):
            jti, body = ctx.bodies[index]
            connection = http.client.HTTPConnection("127.0.0.1", receiver.port, timeout=3 * COMMIT_TIMEOUT_S)
            started = time.monotonic()
            try:
                status, _ = post(connection, body)
            except (OSError, http.client.HTTPException):
                status = "error"
            finally:
                connection.close()
            answers.record(jti, status, started, time.monotonic() - started)

        clients = [threading.Thread(target=one, args=(index,)) for index in range(2)]
        clients[0].start()
        time.sleep(0.2)
        clients[1].start()
        for client in clients:
            client.join()
    finally:
        locker.wait(timeout=hold + 30)
    first, second = sorted(answers.all(), key=lambda a: a[2])
    log(f"  first: {first[1]} in {first[3]:.1f} s; second: {second[1]} in {second[3]:.1f} s")
    result.check(first[1] == 503 and first[3] <= COMMIT_TIMEOUT_S + 2.5,
                 f"the first request gets 503 at the commit timeout ({first[3]:.1f} s)")
    result.check(second[3] <= COMMIT_TIMEOUT_S + 2.5,
                 f"the second request, queued for the only handler thread, is answered within the commit "
                 f"timeout too ({second[1]} in {second[3]:.1f} s)")
    receiver.stop()
    check_invariant(result, ctx.cluster, db, answers)
    return result


def drill_connection_limit(ctx):
    result = Result("5b role connections all held")
    log(f"drill {result.name}: the receiver logs in as a role with CONNECTION LIMIT 2 (member of "
        "siwa_receiver) while two other sessions of that role hold both connections; then they leave")
    db = "drill5b"
    cluster = ctx.cluster
    cluster.create_database(db)
    cluster.psql("postgres", "DROP ROLE IF EXISTS drill_receiver")
    cluster.psql("postgres", "CREATE ROLE drill_receiver LOGIN CONNECTION LIMIT 2 IN ROLE siwa_receiver")
    hold = 6
    hogs = [subprocess.Popen(cluster.psql_command(db, user="drill_receiver") + ["-c", f"SELECT pg_sleep({hold})"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(2)]
    try:
        wait_until(lambda: cluster.psql(db, "SELECT count(*) FROM pg_stat_activity "
                                            "WHERE usename = 'drill_receiver'") == "2", "both hogs connected", 10)
        held_at = time.monotonic()
        receiver = Receiver(ctx, db, cluster.url(db, user="drill_receiver"), ctx.jwks_url,
                            extra=["--pool-size", "4"]).start(ready="/healthz")
        answers = Answers()
        load = Load(lambda: receiver.port, ctx.bodies, answers, threads=ctx.threads).start()
        try:
            # Released when the first hog leaves: from then on one connection can be opened.
            wait_until(lambda: any(hog.poll() is not None for hog in hogs), "a hog to leave", hold + 30, 0.01)
            released_at = time.monotonic()
            for hog in hogs:
                hog.wait(timeout=30)
            log(f"  connections held {released_at - held_at:.1f} s, released")
            wait_until(lambda: answered_after(answers, released_at, 200), "200s after the connections are free", 30)
            time.sleep(ctx.warmup)
        finally:
            load.stop()
    finally:
        for hog in hogs:
            if hog.poll() is None:
                hog.kill()
    # Answered while held (less 0.1 s: the slot frees as the hog's backend exits, around when we see it go).
    during = [a for a in answers.all() if a[2] + a[3] < released_at - 0.1]
    slowest = max((a[3] for a in during), default=0.0)
    unavailable = sum(1 for a in during if a[1] == 503)
    result.check(unavailable > 0 and all(a[1] == 503 for a in during),
                 f"only 503 while no connection could be opened ({unavailable} of {len(during)})")
    result.check(slowest <= COMMIT_TIMEOUT_S + 2.5, f"answers stayed bounded (slowest {slowest:.2f} s)")
    result.check(receiver.alive(), "service recovered without a restart")
    receiver.stop()
    check_invariant(result, cluster, db, answers)
    return result


def drill_disk_full(ctx):
    """Disk full, inside the throwaway cluster only: the log's partitions and the queue are moved to a tablespace on a
    2 MiB tmpfs mounted for the drill, which the load fills; then the tmpfs is grown (space freed)."""
    result = Result("5c disk full (tablespace)")
    mount_point = tempfile.mkdtemp(prefix="siwa-drills-tmpfs-")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0755", "tmpfs", mount_point],
                             capture_output=True, text=True) if os.geteuid() == 0 else None
    if mounted is None or mounted.returncode != 0:
        os.rmdir(mount_point)
        why = "not root" if mounted is None else mounted.stderr.strip()
        result.skipped = (f"skipped: cannot mount a small tmpfs for a tablespace ({why}); filling the real "
                          "disk would hurt everything else on the machine")
        log(f"drill {result.name}: {result.skipped}")
        return result
    log(f"drill {result.name}: the log's partitions and the queue moved to a tablespace on a 2 MiB tmpfs; load fills it, "
        "then the tmpfs is grown to 64 MiB; the receiver keeps running")
    cluster, db = ctx.cluster, "drill5c"
    receiver = None
    try:
        location = os.path.join(mount_point, "ts")
        os.mkdir(location)
        if cluster.as_postgres:
            shutil.chown(location, "postgres")
        cluster.create_database(db)
        cluster.psql("postgres", f"CREATE TABLESPACE drill_small LOCATION '{location}'")
        cluster.psql(db, """
            DO $$
            DECLARE t regclass;
            BEGIN
                FOR t IN SELECT i.inhrelid::regclass FROM pg_inherits i
                          WHERE i.inhparent = 'siwa.notification_log'::regclass
                          UNION ALL SELECT 'siwa.notification_queue'::regclass LOOP
                    EXECUTE format('ALTER TABLE %s SET TABLESPACE drill_small', t);
                END LOOP;
            END $$""")
        receiver = Receiver(ctx, db, cluster.url(db), ctx.jwks_url).start()
        answers = Answers()
        load = Load(lambda: receiver.port, ctx.bodies, answers, threads=ctx.threads).start()
        try:
            started = time.monotonic()
            wait_until(lambda: answered_after(answers, started, 503), "the tablespace to fill (503s)", 60)
            full_at = time.monotonic()
            log(f"  full after {full_at - started:.1f} s ({cluster.psql(db, 'SELECT count(*) FROM siwa.notification_log')}"
                " rows)")
            time.sleep(ctx.warmup)
            subprocess.run(["mount", "-o", "remount,size=64m", mount_point], check=True)
            grown_at = time.monotonic()
            log("  tmpfs grown to 64 MiB")
            wait_until(lambda: answered_after(answers, grown_at, 200), "200s after space was freed", 30)
            time.sleep(ctx.warmup)
        finally:
            load.stop()
        full_503 = answered_between(answers, full_at, grown_at, 503)
        full_200 = sum(1 for a in answers.all() if a[1] == 200 and full_at + 0.5 <= a[2] and a[2] + a[3] <= grown_at)
        result.check(full_503 > 0, f"503 while the tablespace was full ({full_503} answers, {full_200} 200s)")
        with open(os.path.join(cluster.root, "server.log"), errors="replace") as f:
            enospc = "No space left on device" in f.read()
        result.check(enospc, "PostgreSQL reported ENOSPC (server.log: No space left on device)")
        result.check(answered_after(answers, grown_at, 200), "200s again once space was freed")
        result.check(receiver.alive(), "the receiver was never restarted")
        receiver.stop()
        check_invariant(result, cluster, db, answers)
    finally:
        if receiver:
            receiver.stop()
        try:
            cluster.psql("postgres", f"DROP DATABASE IF EXISTS {db}")
            cluster.psql("postgres", "DROP TABLESPACE IF EXISTS drill_small")
        except ABORTS as error:
            log(f"  cleanup: {error}")
        subprocess.run(["umount", "-l", mount_point], check=False)
        os.rmdir(mount_point)
    return result


# ---------------------------------------------------------------------------------------------------
# Drill 6: failover to a streaming standby
# ---------------------------------------------------------------------------------------------------

class Standby(Cluster):
    """A streaming replica of `primary` (pg_basebackup -R, as `postgres` when we are root) in its own
    directory, with its own socket there (no TCP, as the primary); `promote()` makes it the primary."""

    def __init__(self, root, primary):  # noqa: super().__init__ would initdb: set up by hand instead
        self.bindir = primary.bindir
        self.root = root
        self.data = os.path.join(root, "data")
        self.port = self.PORT
        self.as_postgres = primary.as_postgres
        if self.as_postgres:
            shutil.chown(root, "postgres")
        self._tool("pg_basebackup", "-D", self.data, "-h", primary.root, "-p", str(primary.port), "-U", "postgres",
                   "-R", "-X", "stream", "--checkpoint=fast")
        self.options = primary.options.replace(f"-k {primary.root} ", f"-k {root} ")
        assert self.options != primary.options, "the standby needs its own socket directory"
        self.start()

    def promote(self):
        self._tool("pg_ctl", "-D", self.data, "-w", "-t", "60", "promote")


def process_name(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def crash(cluster):
    """kill -9 of the postmaster and every one of its processes at once: a machine or container dying."""
    postmaster = cluster.postmaster_pid()
    children = bench.children_of(postmaster)
    for pid in [postmaster, *children]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    def dead(pid):
        try:
            with open(f"/proc/{pid}/status") as f:
                return "zombie" in f.read()
        except OSError:
            return True

    wait_until(lambda: all(dead(pid) for pid in [postmaster, *children]), "the primary's processes to die", 10)


FAILOVER_HOOK_SQL = """
CREATE SCHEMA drill;
-- No unique key: an event applied twice shows as two rows instead of failing.
CREATE TABLE drill.hook_effects (
    jti        text NOT NULL,
    event_type text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE OR REPLACE FUNCTION siwa.on_event(event_type text, sub text, event_time timestamptz, email text, jti text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO drill.hook_effects (jti, event_type) VALUES (on_event.jti, on_event.event_type);
END;
$$;
"""


class Prober:
    """GETs `url` every `interval` seconds in a thread, recording (monotonic time, status or None)."""

    def __init__(self, url, interval=0.1):
        self.url = url
        self.interval = interval
        self.seen = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stopping.is_set():
            at = time.monotonic()
            self.seen.append((at, http_status(self.url, timeout=3)))
            self.stopping.wait(self.interval)

    def stop(self):
        self.stopping.set()
        self.thread.join(timeout=10)

    def between(self, start, end):
        return [status for at, status in self.seen if start <= at <= end]


def resend_until_stored(answers, port, bodies, timeout):
    """Apple's retries: every body not answered 200 is posted again until it is (bounded by `timeout`)."""
    by_jti = dict(bodies)
    acknowledged = answers.acknowledged()
    waiting = [jti for jti, _ in bodies if jti in answers.by_jti and jti not in acknowledged]
    resent = len(waiting)
    deadline = time.monotonic() + timeout
    connection = None
    while waiting and time.monotonic() < deadline:
        jti = waiting[0]
        if connection is None:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=COMMIT_TIMEOUT_S + 5)
        started = time.monotonic()
        try:
            status, _ = post(connection, by_jti[jti])
        except (OSError, http.client.HTTPException):
            status = "error"
            connection.close()
            connection = None
        answers.record(jti, status, started, time.monotonic() - started)
        if status == 200:
            waiting.pop(0)
        else:
            time.sleep(0.2)
    if connection:
        connection.close()
    return resent, len(waiting)


def drill_failover(ctx, synchronous):
    mode = "synchronous" if synchronous else "asynchronous"
    result = Result("6 failover (sync replication)" if synchronous else "6b failover (async; shown, not checked)")
    log(f"drill {result.name}: a primary and a streaming standby ({mode} replication); siwa-receiver and "
        "siwa-worker connect with host=primary,standby&target_session_attrs=read-write. Under load the "
        f"primary's WAL sender is stopped for {ctx.lag_seconds} s (replication lag), then every primary process is "
        f"killed -9; {ctx.detect_seconds} s later the standby is promoted")
    primary = standby = receiver = worker = prober = worker_log = None
    roots = [tempfile.mkdtemp(prefix="siwa-drills-primary-"), tempfile.mkdtemp(prefix="siwa-drills-standby-")]
    db = "drill6"
    try:
        primary = Cluster(roots[0])
        primary.create_database(db)
        primary.psql(db, FAILOVER_HOOK_SQL)
        standby = Standby(roots[1], primary)
        # Set on the primary only after the base backup, so the standby does not inherit it: once promoted
        # it runs alone, and with '*' and no standby every commit would wait forever.
        if synchronous:
            primary.psql("postgres", "ALTER SYSTEM SET synchronous_standby_names = '*'")
        primary.psql("postgres", "SELECT pg_reload_conf()")
        wanted = "sync" if synchronous else "async"
        wait_until(lambda: primary.psql("postgres", "SELECT sync_state FROM pg_stat_replication "
                                                    "WHERE state = 'streaming'") == wanted,
                   f"the standby to stream ({wanted})", 30)
        url = (f"postgresql://postgres@/{db}?host={primary.root},{standby.root}&port={primary.port},{standby.port}"
               "&target_session_attrs=read-write")
        log(f"  database URL: {url}")
        receiver = Receiver(ctx, f"drill6-{wanted}", url, ctx.jwks_url).start()
        receiver_pid = receiver.process.pid
        worker_log = open(os.path.join(ctx.workdir, f"drill6-{wanted}-worker.log"), "a")
        worker, worker_listeners = start_listening(
            [ctx.binaries["siwa-worker"], "--database-url", url + "&application_name=drill6-worker",
             "--concurrency", "2", "--poll-interval", "0.2", "--retry-base-delay", "0.1",
             "--jwks-url", ctx.jwks_url, "--audience", AUDIENCE,
             "--metrics-listen", "127.0.0.1:0", "--log-level", "warning"],
            f"drill6-{wanted}-worker", timeout=30, stdout=worker_log, stderr=worker_log)
        metrics_port = port_of(worker_listeners["metrics"])
        wait_until(lambda: metric_or_none(metrics_port, "siwa_worker_connected_lanes") == 2, "the worker's lanes", 30)
        prober = Prober(f"http://127.0.0.1:{receiver.port}/readyz")
        answers = Answers()
        load = Load(lambda: receiver.port, ctx.bodies, answers, threads=ctx.threads, pause=0.02).start()
        try:
            time.sleep(ctx.warmup)
            walsender = next(pid for pid in bench.children_of(primary.postmaster_pid())
                             if "walsender" in process_name(pid))
            os.kill(walsender, signal.SIGSTOP)
            lag_at = time.monotonic()
            time.sleep(ctx.lag_seconds)
            crashed_at = time.monotonic()
            primary.crashed = True
            crash(primary)
            dead_at = time.monotonic()  # every process of the primary gone
            log(f"  primary killed -9 (its WAL sender stopped {crashed_at - lag_at:.1f} s before)")
            time.sleep(ctx.detect_seconds)
            promote_at = time.monotonic()
            standby.promote()
            promoted_at = time.monotonic()
            log(f"  standby promoted in {promoted_at - promote_at:.2f} s")
            wait_until(lambda: answered_after(answers, promoted_at, 200), "200s after the promotion", 60)
            first_200 = min(a[2] + a[3] for a in answers.all() if a[1] == 200 and a[2] >= promoted_at)
            wait_until(lambda: metric_or_none(metrics_port, "siwa_worker_connected_lanes") == 2,
                       "the worker's lanes to reconnect", 60)
            lanes_back = time.monotonic()
            time.sleep(ctx.warmup)
        finally:
            load.stop()
        answered_503 = answered_between(answers, crashed_at, first_200, 503)
        # From the last primary process's death to the promotion command: there is no primary at all.
        without_primary = prober.between(dead_at, promote_at)
        not_ready = [s for s in without_primary if s != 200]
        ready_again = next((at for at, s in prober.seen if at >= promoted_at and s == 200), None)
        lag_200 = sum(1 for a in answers.all() if a[1] == 200 and lag_at <= a[2] + a[3] < crashed_at)
        log(f"  answers: 200 within the {ctx.lag_seconds} s of lag {lag_200}; 503 from the crash to the first 200 "
            f"after promotion {answered_503}; first 200 {first_200 - crashed_at:.2f} s after the crash "
            f"({first_200 - promoted_at:.2f} s after the promotion); worker lanes connected again "
            f"{lanes_back - promoted_at:.2f} s after it")
        reconnects = metric(metrics_port, "siwa_worker_reconnects_total")
        acknowledged_first = set(answers.acknowledged())
        lost_first = acknowledged_first - set(standby.stored_jtis(db))
        resent, unanswered = resend_until_stored(answers, receiver.port, ctx.bodies, timeout=60)
        log(f"  Apple's retries: {resent} notifications not answered 200 were sent again; {unanswered} still not 200")
        result.counts["retried"] = resent
        wait_until(lambda: standby.psql(db, "SELECT count(*) FROM siwa.notification_queue") == "0",
                   "the worker to drain the queue on the new primary", ctx.worker_timeout)
        prober.stop()
        ready_text = f"{ready_again - promoted_at:.2f} s" if ready_again else "never"
        if synchronous:
            check_invariant(result, standby, db, answers)
            result.check(not lost_first, f"every jti answered 200 before Apple's retries is on the new primary "
                                         f"({len(acknowledged_first)} acknowledged, {len(lost_first)} lost)")
            result.check(answered_503 > 0, f"503 while there was no primary ({answered_503} answers)")
            result.check(bool(not_ready) and len(not_ready) == len(without_primary),
                         f"/readyz answered 503 on every probe while there was no primary ({len(not_ready)} of "
                         f"{len(without_primary)} probes)")
            result.check(ready_again is not None, f"/readyz answered 200 again after the promotion ({ready_text})")
            result.check(receiver.alive() and receiver.process.pid == receiver_pid, "the receiver was never restarted")
            result.check(worker.poll() is None, "the worker was never restarted")
            result.check(reconnects > 0, f"the worker's lanes reconnected ({reconnects:.0f} reconnects counted)")
            result.check(unanswered == 0, "every notification was answered 200 after Apple's retries")
            sent = {jti for jti in answers.by_jti}
            stored = standby.stored_jtis(db)
            result.check(sent <= set(stored) and len(stored) == len(set(stored)),
                         f"after Apple's retries every jti sent is stored, once ({len(sent)} sent, {len(stored)} rows)")
        else:
            every = answers.all()
            stored = set(standby.stored_jtis(db))
            result.counts.update({"sent": len(every), "200": sum(1 for a in every if a[1] == 200),
                                  "503": sum(1 for a in every if a[1] == 503),
                                  "conn errors": sum(1 for a in every if a[1] == "error"), "other": 0,
                                  "stored": len(stored), "lost": len(lost_first), "dup rows": 0})
            log(f"  asynchronous replication: {len(lost_first)} of the {len(acknowledged_first)} notifications "
                f"answered 200 are NOT on the new primary (committed on the old primary during the "
                f"{ctx.lag_seconds} s of lag, answered 200, never replicated); Apple does not retry a 200")
            result.notes.append(f"async lost {len(lost_first)} acknowledged: why the drill uses synchronous replication")
        row = standby.psql(db, """
            SELECT count(*) FILTER (WHERE state = 'applied'), count(*) FILTER (WHERE state <> 'applied'),
                   count(*), (SELECT count(*) FROM drill.hook_effects),
                   (SELECT count(DISTINCT jti) FROM drill.hook_effects),
                   (SELECT count(*) FROM drill.hook_effects h
                     WHERE NOT EXISTS (SELECT 1 FROM siwa.notifications n WHERE n.jti = h.jti))
              FROM siwa.notifications""").split("|")
        applied, unapplied, events, hooks, distinct_hooks, stray = map(int, row)
        log(f"  worker on the new primary: {events} events, applied {applied}, other {unapplied}; hook effects "
            f"{hooks} ({distinct_hooks} distinct jtis, {stray} for no stored event)")
        result.check(applied == events and unapplied == 0, f"every stored event is applied ({applied}/{events})")
        result.check(hooks == distinct_hooks == events and stray == 0,
                     f"each event's effect exactly once on the new primary ({hooks} effects for {events} events, "
                     f"{hooks - distinct_hooks} applied twice)")
        result.counts["dup rows"] = result.counts.get("dup rows", 0) + hooks - distinct_hooks
        result.notes.append(f"recovered {first_200 - crashed_at:.1f} s after the crash, "
                            f"{first_200 - promoted_at:.2f} s after promotion; {answered_503} 503s")
    finally:
        if prober:
            prober.stop()
        if worker and worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
        if worker_log:
            worker_log.close()
        if receiver:
            receiver.stop()
        # The crashed primary is not stopped again: its postmaster.pid names a process that is gone.
        for cluster in (standby, primary if primary and not getattr(primary, "crashed", False) else None):
            if cluster is None:
                continue
            try:
                cluster.stop("immediate")
            except subprocess.CalledProcessError:
                pass
        if not ctx.keep:
            for root in roots:
                shutil.rmtree(root, ignore_errors=True)
    return result


# ---------------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------------

# ---------------------------------------------------------------------------------------------------
# Drill 7: the ESP suppression outbox against a fake SendGrid
# ---------------------------------------------------------------------------------------------------


class FakeESP:
    """SendGrid's global suppressions on loopback (GET/POST/DELETE, Bearer key), recording per address
    the changes it made to its list in the order it made them. Can answer slowly (kills land mid-call)
    and be stopped and started again on the same port."""

    def __init__(self, key, delay=0.0):
        self.key, self.delay = key, delay
        self.lock = threading.Lock()
        self.listed, self.changes, self.calls, self.in_flight = set(), {}, 0, 0
        self.in_flight_methods = []
        self.down = False
        self.port = 0  # the kernel's choice on the first start; a restart binds it again
        self.server = None
        self.start()

    def start(self):
        esp = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def setup(self):
                super().setup()
                # http.server writes the headers and the body apart: without this, Nagle's algorithm and
                # the client's delayed ACK hold every answer ~40 ms, and the fake, not the outbox, is measured.
                self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def answer(self, status, body=b""):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the worker was killed mid-call: its answer has no one to go to

            def handle_call(self):
                if esp.down:  # a connection kept alive from before the stop: closed without an answer
                    self.close_connection = True
                    return
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if self.headers.get("Authorization") != f"Bearer {esp.key}":
                    return self.answer(401, b'{"errors":[]}')
                prefix = "/v3/asm/suppressions/global"
                with esp.lock:
                    esp.calls += 1
                    esp.in_flight += 1
                    esp.in_flight_methods.append(self.command)
                try:
                    if esp.delay:
                        time.sleep(esp.delay)
                    address = urllib.parse.unquote(self.path[len(prefix) + 1:]) if self.path != prefix else None
                    with esp.lock:
                        if self.command == "GET":
                            listed = address in esp.listed
                            return self.answer(200, json.dumps({"recipient_email": address} if listed else {}).encode())
                        if self.command == "POST" and self.path == prefix:
                            address = json.loads(body)["recipient_emails"][0]
                            if address not in esp.listed:
                                esp.listed.add(address)
                                esp.changes.setdefault(address, []).append("add")
                            return self.answer(201, body)
                        if self.command == "DELETE" and address:
                            if address not in esp.listed:
                                return self.answer(404, b'{"errors":[]}')
                            esp.listed.discard(address)
                            esp.changes.setdefault(address, []).append("remove")
                            return self.answer(204)
                    return self.answer(404, b"{}")
                finally:
                    with esp.lock:
                        esp.in_flight -= 1
                        esp.in_flight_methods.remove(self.command)

            do_GET = do_POST = do_DELETE = handle_call

        self.down = False
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self.server.server_address[1]
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.down = True
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"


def suppression_worker(ctx, db, esp, key_file, name):
    arguments = [ctx.binaries["siwa-worker"], "--database-url", ctx.cluster.url(db) + f"&application_name={name}",
                 "--jwks-url", ctx.jwks_url, "--audience", AUDIENCE, "--log-level", "warning",
                 "--suppressions", "sendgrid", "--sendgrid-key-file", key_file, "--sendgrid-api-url", esp.url,
                 "--suppression-timeout", "2"]
    out = open(os.path.join(ctx.workdir, f"{db}-{name}.log"), "a")
    return subprocess.Popen(arguments, stdout=out, stderr=out)


def stop_process(process):
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def suppression_database(ctx, db, addresses):
    cluster = ctx.cluster
    cluster.create_database(db)
    cluster.psql(db, f"""
        INSERT INTO siwa.suppression_providers (name, kind) VALUES ('sendgrid', 'sendgrid');
        INSERT INTO siwa.accounts (sub, email, is_private_email, email_status)
        SELECT 'drill7-' || g, 'user' || g || '@privaterelay.appleid.com', true, 'enabled'
          FROM generate_series(1, {addresses}) g""")


def drill_suppressions(ctx):
    """The outbox's throughput against a fast fake, then kill -9 mid-call and the ESP down for a while."""
    result = Result("7 suppression outbox")
    key = "drill7-" + base64.b16encode(os.urandom(8)).decode()
    key_file = os.path.join(ctx.workdir, "sendgrid.key")
    with open(key_file, "w") as f:
        f.write(key)
    os.chmod(key_file, 0o600)
    cluster = ctx.cluster
    done = lambda db: int(cluster.psql(db, "SELECT count(*) FROM siwa.suppression_outbox WHERE state <> 'pending'"))

    # Throughput: one email-disabled per address (a lookup and an add each), a fake answering at once.
    rows = ctx.suppression_rows
    log(f"drill {result.name}: throughput, {rows:,} adds against a fast fake ESP, one worker")
    suppression_database(ctx, "drill7a", rows)
    cluster.psql("drill7a", "UPDATE siwa.accounts SET email_status = 'disabled'")
    cluster.psql("drill7a", "VACUUM ANALYZE")
    esp = FakeESP(key)
    worker = suppression_worker(ctx, "drill7a", esp, key_file, "throughput")
    started = time.monotonic()
    try:
        wait_until(lambda: done("drill7a") == rows, "every row finished", timeout=ctx.worker_timeout * 5)
        seconds = time.monotonic() - started
    finally:
        stop_process(worker)
        esp.stop()
    rate = rows / seconds
    log(f"  {rows:,} rows in {seconds:.1f} s: {rate:.0f} rows/s, {esp.calls:,} calls ({esp.calls / rows:.2f} a row)")
    result.notes.append(f"{rate:.0f} rows/s")
    result.check(len(esp.listed) == rows, f"every address listed ({len(esp.listed):,}/{rows:,})")

    # Faults: rounds of email-disabled / email-enabled over the same addresses, a slow ESP (kills land
    # mid-call), the worker killed -9 repeatedly and the ESP stopped for a while, then started again.
    addresses, rounds = ctx.suppression_addresses, 5
    log(f"drill {result.name}: {addresses} addresses x {rounds} alternating events; worker killed -9 mid-call; "
        f"ESP down {ctx.esp_down_seconds:.0f} s")
    suppression_database(ctx, "drill7b", addresses)
    for round_number in range(rounds):
        status = "disabled" if round_number % 2 == 0 else "enabled"
        cluster.psql("drill7b", f"UPDATE siwa.accounts SET email_status = '{status}'")
    total = addresses * rounds
    esp = FakeESP(key, delay=0.02)
    worker = suppression_worker(ctx, "drill7b", esp, key_file, "faults")
    kills, mid_call, mid_add, outage = 0, 0, 0, False
    started = time.monotonic()
    try:
        while done("drill7b") < total and time.monotonic() - started < ctx.worker_timeout * 3:
            time.sleep(random.uniform(0.3, 0.6))
            if not outage and done("drill7b") > total // 3:
                esp.stop()
                log(f"  ESP stopped at {done('drill7b')}/{total} rows finished")
                time.sleep(ctx.esp_down_seconds)
                esp.start()
                outage = True
                log(f"  ESP started again at {done('drill7b')}/{total}")
                continue
            if kills < ctx.suppression_kills:
                # Mid-call: wait for the restarted worker to be calling, then for one of its calls (a random
                # one, an add every other kill: the call whose lost answer tests ownership) to be in the fake.
                want = "POST" if kills % 2 == 0 else None
                deadline = time.monotonic() + 10
                while esp.in_flight == 0 and time.monotonic() < deadline:
                    time.sleep(0.002)
                time.sleep(random.uniform(0, 0.3))
                while time.monotonic() < deadline and not (
                        esp.in_flight_methods and (want is None or want in esp.in_flight_methods)):
                    time.sleep(0.001)
                methods = list(esp.in_flight_methods)
                mid_call += 1 if methods else 0
                mid_add += 1 if "POST" in methods else 0
                worker.send_signal(signal.SIGKILL)
                worker.wait()
                kills += 1
                worker = suppression_worker(ctx, "drill7b", esp, key_file, "faults")
        wait_until(lambda: done("drill7b") == total, "every row finished", timeout=ctx.worker_timeout * 3)
    finally:
        stop_process(worker)
        esp.stop()
    states = cluster.psql("drill7b", """
        SELECT count(*) FILTER (WHERE state = 'dead'), count(*) FILTER (WHERE outcome = 'not_ours'),
               count(*) FILTER (WHERE outcome = 'already_there'), count(*) FILTER (WHERE outcome = 'not_there'),
               coalesce(max(attempts), 0)
          FROM siwa.suppression_outbox""").split("|")
    dead, not_ours, already, not_there, max_attempts = map(int, states)
    expected = ["add", "remove"] * (rounds // 2) + (["add"] if rounds % 2 else [])
    wrong = [a for a in (f"user{g}@privaterelay.appleid.com" for g in range(1, addresses + 1))
             if esp.changes.get(a, []) != expected]
    log(f"  {kills} kill -9s ({mid_call} with a call in flight, {mid_add} of them an add), outage {'done' if outage else 'not reached'}; "
        f"{esp.calls} calls; dead {dead}, not_ours {not_ours}, already_there {already}, not_there {not_there}, "
        f"max attempts {max_attempts}")
    result.counts.update({"sent": total, "stored": total - dead, "lost": len(wrong)})
    result.notes.append(f"{kills} kills, {mid_call} mid-call, {mid_add} mid-add")
    result.check(kills >= 3 and mid_call > 0 and mid_add > 0,
                 f"the worker was killed mid-call ({mid_call} of {kills} kills, {mid_add} during an add)")
    result.check(outage, "the ESP was stopped and started again while rows were pending")
    result.check(dead == 0, f"no row is dead ({dead})")
    result.check(not wrong, f"every address's list changes are {expected}, once each, in order "
                            f"({len(wrong)} differ{': ' + str(esp.changes.get(wrong[0])) if wrong else ''})")
    return result


def auth_adapter_worker(ctx, db, name):
    arguments = [ctx.binaries["siwa-worker"], "--database-url", ctx.cluster.url(db) + f"&application_name={name}",
                 "--jwks-url", ctx.jwks_url, "--audience", AUDIENCE, "--log-level", "warning",
                 "--webhook-concurrency", "0", "--auth-adapters", "on", "--auth-adapter-timeout", "3"]
    out = open(os.path.join(ctx.workdir, f"{db}-{name}.log"), "a")
    return subprocess.Popen(arguments, stdout=out, stderr=out)


def drill_auth_adapters(ctx):
    """Supabase Auth through its adapter: each user's events in order (consent revoked, a team transfer for
    every third, the account's deletion for every other), the worker killed -9 repeatedly while rows are
    pending; the auth database ends as the events say, each event applied once."""
    result = Result("8 auth adapters")
    cluster, users = ctx.cluster, ctx.adapter_users
    log(f"drill {result.name}: {users} Supabase users, their events through the adapter; worker killed -9 "
        f"{ctx.adapter_kills} times")
    cluster.create_database("drill8")
    cluster.psql("postgres", "DROP DATABASE IF EXISTS drill8auth")
    cluster.psql("postgres", "CREATE DATABASE drill8auth")
    cluster.psql("drill8auth", "DO $$ BEGIN CREATE ROLE supabase_auth_admin NOLOGIN NOINHERIT; "
                               "EXCEPTION WHEN duplicate_object THEN NULL; END $$")
    subprocess.run(cluster.psql_command("drill8auth") + ["-f", os.path.join(
        bench.ROOT, "Tests", "Fixtures", "auth-platforms", "supabase-auth.sql")], check=True,
        stdout=subprocess.DEVNULL)
    cluster.psql("drill8auth", f"""
        INSERT INTO auth.users (id, aud, role, email, encrypted_password, raw_app_meta_data, created_at, updated_at)
        SELECT ('00000000-0000-4000-8000-' || lpad(g::text, 12, '0'))::uuid, 'authenticated', 'authenticated',
               'u' || g || '@privaterelay.appleid.com', '', '{{}}', now(), now()
          FROM generate_series(1, {users}) g;
        INSERT INTO auth.identities (provider_id, user_id, identity_data, provider, created_at, updated_at)
        SELECT 'drill8-' || g, ('00000000-0000-4000-8000-' || lpad(g::text, 12, '0'))::uuid,
               jsonb_build_object('sub', 'drill8-' || g), 'apple', now(), now()
          FROM generate_series(1, {users}) g;
        INSERT INTO auth.sessions (id, user_id, created_at)
        SELECT gen_random_uuid(), ('00000000-0000-4000-8000-' || lpad(g::text, 12, '0'))::uuid, now()
          FROM generate_series(1, {users}) g, generate_series(1, 2)""")
    connection_file = os.path.join(ctx.workdir, "drill8-auth-url")
    with open(os.open(connection_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(cluster.url("drill8auth") + "\n")
    cluster.psql("drill8", f"SELECT siwa.add_auth_adapter('drill8', 'supabase', 'apple', 'file:{connection_file}')")
    # Each user's events in order, as the worker writes them: consent revoked; every third a transfer to
    # drill8n-G; every other the account's deletion under its sub of the moment.
    cluster.psql("drill8", f"""
        INSERT INTO siwa.changes (type, sub, old_sub, event_time, applied_at, jti)
        SELECT e.type, e.sub, e.old_sub, now(), now(), 'drill8-' || g || '-' || e.n
          FROM generate_series(1, {users}) g
         CROSS JOIN LATERAL (VALUES
               (1, 'siwa.consent_revoked', 'drill8-' || g, NULL),
               (2, CASE WHEN g % 3 = 0 THEN 'siwa.sub_transferred' END, 'drill8n-' || g, 'drill8-' || g),
               (3, CASE WHEN g % 2 = 0 THEN 'siwa.account_deleted' END,
                   CASE WHEN g % 3 = 0 THEN 'drill8n-' ELSE 'drill8-' END || g, NULL)) AS e(n, type, sub, old_sub)
         WHERE e.type IS NOT NULL
         ORDER BY g, e.n""")
    total = int(cluster.psql("drill8", "SELECT count(*) FROM siwa.auth_adapter_events"))
    finished = lambda: int(cluster.psql("drill8", "SELECT count(*) FROM siwa.auth_adapter_events WHERE state <> 'pending'"))
    worker = auth_adapter_worker(ctx, "drill8", "adapters")
    kills, mid_run = 0, 0
    started = time.monotonic()
    try:
        while kills < ctx.adapter_kills and finished() < total:
            time.sleep(random.uniform(0.05, 0.3))
            mid_run += 1 if 0 < finished() < total else 0
            worker.send_signal(signal.SIGKILL)
            worker.wait()
            kills += 1
            worker = auth_adapter_worker(ctx, "drill8", "adapters")
        wait_until(lambda: finished() == total, "every adapter row finished", timeout=ctx.worker_timeout * 3)
        seconds = time.monotonic() - started
    finally:
        stop_process(worker)
    states = cluster.psql("drill8", """
        SELECT count(*) FILTER (WHERE state = 'done'), count(*) FILTER (WHERE state = 'dead'),
               count(*) FILTER (WHERE state = 'no_user'), count(*) FILTER (WHERE state = 'no_user' AND attempts = 1),
               coalesce(max(attempts), 0)
          FROM siwa.auth_adapter_events""").split("|")
    done, dead, no_user, first_no_user, max_attempts = map(int, states)
    # The event-time state: no session left; deleted accounts unlinked (and banned: Apple was their only
    # login); transferred ones linked under the new sub only; the rest under the old one.
    wrong = cluster.psql("drill8auth", f"""
        SELECT count(*) FROM generate_series(1, {users}) g
          LEFT JOIN auth.identities i ON i.user_id = ('00000000-0000-4000-8000-' || lpad(g::text, 12, '0'))::uuid
                                     AND i.provider = 'apple'
          LEFT JOIN auth.users u ON u.id = ('00000000-0000-4000-8000-' || lpad(g::text, 12, '0'))::uuid
         WHERE CASE WHEN g % 2 = 0 THEN i.provider_id IS NOT NULL OR NOT (u.banned_until > now())
                    WHEN g % 3 = 0 THEN i.provider_id IS DISTINCT FROM 'drill8n-' || g
                    ELSE i.provider_id IS DISTINCT FROM 'drill8-' || g END""")
    sessions = int(cluster.psql("drill8auth", "SELECT count(*) FROM auth.sessions"))
    log(f"  {total} rows in {seconds:.1f} s through {kills} kill -9s ({mid_run} with rows finished and pending); "
        f"done {done}, no_user {no_user}, dead {dead}, max attempts {max_attempts}")
    result.counts.update({"sent": total, "stored": done + no_user, "lost": total - done - no_user})
    result.notes.append(f"{kills} kills, {total / seconds:.0f} rows/s")
    result.check(kills >= 2 and mid_run >= 1, f"the worker was killed while rows were pending ({mid_run} of {kills})")
    result.check(done + no_user == total and dead == 0, f"every row finished ({done} done, {no_user} no_user), none dead")
    # A row applied in the auth database whose record the kill lost is applied again: a transfer or an
    # unlink then finds no user under its sub (already moved or unlinked): no_user, never on a first attempt.
    result.check(first_no_user == 0, f"no_user only on a row applied again after a kill ({no_user - first_no_user} of {no_user})")
    result.check(int(wrong) == 0, f"every user's identity as its events say ({wrong} differ)")
    result.check(sessions == 0, f"no session left ({sessions})")
    return result


def drill_hosted_adapters(ctx):
    """Each hosted platform through its adapter against its fake: drill 8's events per user, 429s at the
    start, the worker killed -9 repeatedly; each user ends as the platform's policy table says (Auth0 and
    Clerk record a transfer in metadata; Clerk cannot find the user by it)."""
    result = Result("9 hosted adapters")
    cluster, users = ctx.cluster, ctx.hosted_users
    log(f"drill {result.name}: {users} users on each of {len(bench.HOSTED_PLATFORMS)} fake platforms; worker "
        f"killed -9 {ctx.adapter_kills} times")
    cluster.create_database("drill9")
    venv_python = os.path.join(bench.ROOT, ".build", "platforms-venv", "bin", "python")
    fakes = {}
    try:
        for platform, provider in bench.HOSTED_PLATFORMS:
            process = subprocess.Popen(
                [venv_python if os.path.exists(venv_python) else sys.executable,
                 os.path.join(bench.ROOT, "Tests", "Fixtures", "hosted-platforms", "serve.py"), platform],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            started = json.loads(process.stdout.readline())
            fakes[platform] = (process, started["url"])
            for g in range(1, users + 1):
                hosted_control(started["url"], "users", {"email": f"{platform}{g}@example.com",
                                                         "apple_sub": f"{platform}-{g}", "sessions": 1})
            path = os.path.join(ctx.workdir, f"drill9-{platform}")
            with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                json.dump(bench.hosted_credentials(platform, started), f)
            cluster.psql("drill9", f"SELECT siwa.add_auth_adapter('{platform}', '{platform}', '{provider}', 'file:{path}')")
            hosted_control(started["url"], "faults", {"rate_limit": 5})
        cluster.psql("drill9", f"""
            INSERT INTO siwa.changes (type, sub, old_sub, event_time, applied_at, jti)
            SELECT e.type, e.sub, e.old_sub, now(), now(), 'drill9-' || p || '-' || g || '-' || e.n
              FROM unnest(ARRAY['{"','".join(fakes)}']) p, generate_series(1, {users}) g
             CROSS JOIN LATERAL (VALUES
                   (1, 'siwa.consent_revoked', p || '-' || g, NULL),
                   (2, CASE WHEN g % 3 = 0 THEN 'siwa.sub_transferred' END, p || '-n' || g, p || '-' || g),
                   (3, CASE WHEN g % 2 = 0 THEN 'siwa.account_deleted' END,
                       CASE WHEN g % 3 = 0 THEN p || '-n' ELSE p || '-' END || g, NULL)) AS e(n, type, sub, old_sub)
             WHERE e.type IS NOT NULL
             ORDER BY g, p, e.n""")
        # Each change fans out to every adapter: only the rows of the adapter whose platform named the sub
        # find a user; the others end no_user at once.
        mine = "split_part(e.sub, '-', 1) = a.platform"
        total = int(cluster.psql("drill9", "SELECT count(*) FROM siwa.auth_adapter_events"))
        finished = lambda: int(cluster.psql(
            "drill9", "SELECT count(*) FROM siwa.auth_adapter_events WHERE state <> 'pending'"))
        worker = auth_adapter_worker(ctx, "drill9", "adapters")
        kills, mid_run = 0, 0
        started_at = time.monotonic()
        try:
            while kills < ctx.adapter_kills and finished() < total:
                # Each worker makes progress before it is killed, a moment after (mid-batch, mid-call).
                before = finished()
                wait_until(lambda: finished() > before, "the restarted worker finishes rows",
                           timeout=ctx.worker_timeout)
                time.sleep(random.uniform(0, 0.3))
                mid_run += 1 if 0 < finished() < total else 0
                worker.send_signal(signal.SIGKILL)
                worker.wait()
                kills += 1
                worker = auth_adapter_worker(ctx, "drill9", "adapters")
            wait_until(lambda: finished() == total, "every hosted adapter row finished", timeout=ctx.worker_timeout * 3)
            seconds = time.monotonic() - started_at
        finally:
            stop_process(worker)
        dead, own_done, own_no_user = map(int, cluster.psql("drill9", f"""
            SELECT count(*) FILTER (WHERE e.state = 'dead'),
                   count(*) FILTER (WHERE e.state = 'done' AND {mine}),
                   count(*) FILTER (WHERE e.state = 'no_user' AND {mine})
              FROM siwa.auth_adapter_events e JOIN siwa.auth_adapters a ON a.id = e.adapter_id""").split("|"))
        wrong = {}
        for platform, (_, url) in fakes.items():
            apple = dict(bench.HOSTED_PLATFORMS)[platform]
            state = {u["email"]: u for u in hosted_control(url, "state")["users"]}
            for g in range(1, users + 1):
                user = state[f"{platform}{g}@example.com"]
                subs = sorted(i["user_id"] for i in user["identities"] if i["provider"] == apple)
                if hosted_expected(platform, g) != (subs, user["disabled"], user["sessions"]):
                    wrong.setdefault(platform, []).append(g)
        log(f"  {total} rows ({own_done} done and {own_no_user} no_user of their own platform) in {seconds:.1f} s "
            f"through {kills} kill -9s; dead {dead}; users not as expected: {sum(map(len, wrong.values()))}")
        result.counts.update({"sent": total, "stored": total - dead, "lost": dead})
        result.notes.append(f"{kills} kills, {total / seconds:.0f} rows/s")
        result.check(kills >= 2 and mid_run >= 1, f"the worker was killed while rows were pending ({mid_run} of {kills})")
        result.check(dead == 0, f"every row finished, none dead ({dead})")
        result.check(not wrong, "every user as the platform's policy table says "
                                f"({', '.join(f'{p}: {g[:5]}' for p, g in wrong.items()) or 'all'})")
    finally:
        for process, _ in fakes.values():
            process.terminate()
            process.wait()
    return result


def hosted_control(url, path, body=None):
    """A fake platform's control API (fakebase.py)."""
    request = urllib.request.Request(f"{url}/_fake/{path}", data=None if body is None else json.dumps(body).encode(),
                                     method="GET" if body is None else "POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def hosted_expected(platform, g):
    """User g's (Apple subs, disabled, sessions) after drill 9's events (consent revoked; every third moved
    to -nG; every other deleted, unlink policy, Apple its only login: disabled)."""
    old, new = f"{platform}-{g}", f"{platform}-n{g}"
    deleted, moved = g % 2 == 0, g % 3 == 0
    if platform in ("keycloak", "firebase"):
        return ([] if deleted else [new] if moved else [old]), deleted, 0
    if platform == "auth0":  # the primary Apple identity cannot be unlinked nor renamed: blocked instead
        return [old], deleted, 0
    # Clerk: a moved user's deletion (under the new sub) finds no user.
    return ([old] if moved or not deleted else []), deleted and not moved, 0


class Context:
    pass


def keygen(ctx, name, kid):
    """bench.keygen into the work directory; returns the key directory and its jwks.json."""
    keys = os.path.join(ctx.workdir, name)
    bench.keygen(ctx.binaries["siwactl"], keys, kid)
    with open(os.path.join(keys, "jwks.json")) as f:
        return keys, f.read()


def sign(ctx, keys, kid, count, name):
    """bench.sign into the work directory; returns the bodies with their jtis."""
    path = os.path.join(ctx.workdir, name)
    bench.sign(ctx.binaries["siwa-bench"], keys, kid, AUDIENCE, count, path)
    return load_bodies(path)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CI-sized: shorter phases, fewer events")
    parser.add_argument("--build", default=None, help="directory of the binaries (default: .build/release, "
                                                      "else .build/debug)")
    parser.add_argument("--only", default="", help="comma-separated drill numbers to run, e.g. 1,4")
    parser.add_argument("--threads", type=int, default=16, help="load generator clients")
    parser.add_argument("--strict", action="store_true", help="treat findings (known limitations) as violations")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs) afterwards")
    args = parser.parse_args()

    build = args.build
    if build is None:
        build = next((os.path.join(ROOT, ".build", c) for c in ("release", "debug")
                      if os.access(os.path.join(ROOT, ".build", c, "siwa-receiver"), os.X_OK)),
                     os.path.join(ROOT, ".build", "release"))
    ctx = Context()
    ctx.binaries = bench.binaries_in(build)
    if not shutil.which("psql"):
        sys.exit("missing psql: apt-get install postgresql-client")
    ctx.threads = args.threads
    STRICT[0] = args.strict
    ctx.warmup = 1.0 if args.quick else 2.0
    ctx.down_seconds = 2.0 if args.quick else 3.0
    ctx.kills = 2 if args.quick else 3
    ctx.worker_events = 3000 if args.quick else 10000
    ctx.hook_sleep = 0.001
    ctx.worker_timeout = 180
    ctx.lag_seconds = 1.0
    ctx.detect_seconds = 1.0 if args.quick else 2.0
    ctx.keep = args.keep
    ctx.suppression_rows = 3000 if args.quick else 10000
    ctx.suppression_addresses = 100 if args.quick else 300
    ctx.suppression_kills = 3 if args.quick else 5
    ctx.esp_down_seconds = 3.0 if args.quick else 5.0
    ctx.adapter_users = 300 if args.quick else 1000
    ctx.adapter_kills = 3 if args.quick else 5
    ctx.hosted_users = 60 if args.quick else 200
    only = {s.strip() for s in args.only.split(",") if s.strip()}

    ctx.workdir = tempfile.mkdtemp(prefix="siwa-drills-")
    os.chmod(ctx.workdir, 0o755)
    log(f"binaries {build}; work directory {ctx.workdir}")
    ctx.cluster = None
    fake_apple = None
    results = []
    try:
        ctx.cluster = Cluster(tempfile.mkdtemp(prefix="siwa-drills-pg-"))
        keys_a, ctx.jwks_a = keygen(ctx, "keys-a", "drill-key-a")
        ctx.keys_a = keys_a
        keys_b, ctx.jwks_b = keygen(ctx, "keys-b", "drill-key-b")
        count = 8000 if args.quick else 16000
        log(f"pre-signing {count:,} distinct notifications with key A and 200 with key B")
        ctx.bodies = sign(ctx, keys_a, "drill-key-a", count, "bodies-a.jsonl")
        ctx.bodies_b = sign(ctx, keys_b, "drill-key-b", 200, "bodies-b.jsonl")
        fake_apple, ctx.jwks_url = bench.start_fake_apple(ctx.binaries["siwactl"], keys_a)

        drills = [
            ("1", lambda: drill_postgres_restart(ctx, "fast")),
            ("1", lambda: drill_postgres_restart(ctx, "immediate")),
            ("2", lambda: drill_receiver_kill(ctx)),
            ("3", lambda: drill_worker_kill(ctx)),
            ("4", lambda: drill_jwks(ctx)),
            ("5", lambda: drill_table_lock(ctx)),
            ("5", lambda: drill_head_of_line(ctx)),
            ("5", lambda: drill_connection_limit(ctx)),
            ("5", lambda: drill_disk_full(ctx)),
            ("6", lambda: drill_failover(ctx, synchronous=True)),
            ("6", lambda: drill_failover(ctx, synchronous=False)),
            ("7", lambda: drill_suppressions(ctx)),
            ("8", lambda: drill_auth_adapters(ctx)),
            ("9", lambda: drill_hosted_adapters(ctx)),
        ]
        for number, drill in drills:
            if only and number not in only:
                continue
            started = time.monotonic()
            try:
                result = drill()
            except ABORTS as error:
                result = Result(f"{number} (aborted)")
                result.check(False, str(error))
            except Exception as error:  # noqa: BLE001 - report and keep going with the other drills
                result = Result(f"{number} (crashed)")
                result.check(False, f"{type(error).__name__}: {error}")
            result.seconds = time.monotonic() - started
            results.append(result)
            log(f"  -> {'PASS' if result.passed else 'FAIL'} in {result.seconds:.1f} s")
    finally:
        if fake_apple:
            fake_apple.terminate()
            fake_apple.wait()
        if ctx.cluster:
            try:
                ctx.cluster.stop("fast")
            except subprocess.CalledProcessError:
                pass
            if not args.keep:
                shutil.rmtree(ctx.cluster.root, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(ctx.workdir, ignore_errors=True)

    print_summary(results)
    sys.exit(0 if results and all(r.passed for r in results) else 1)


def print_summary(results):
    columns = ["sent", "200", "503", "conn errors", "other", "stored", "lost", "dup rows"]
    print()
    print(f"{'drill':<38}" + "".join(f"{c:>12}" for c in columns) + f"{'seconds':>9}  result")
    for r in results:
        cells = "".join(f"{r.counts.get(c, '-')!s:>12}" for c in columns)
        skipped = getattr(r, "skipped", None)
        verdict = "SKIPPED" if skipped else ("PASS" if r.passed else "FAIL")
        print(f"{r.name:<38}{cells}{getattr(r, 'seconds', 0):>9.1f}  {verdict}"
              + (f"  ({'; '.join(r.notes)})" if r.notes else ""))
    print()
    print("other = any other status (401 in drill 4). Drill 3: sent = events queued, stored = events, "
          "lost = events not applied, dup rows = hook effects beyond one per event.")
    for r in results:
        for finding in r.findings:
            print(f"FINDING (not met, known limitation) in {r.name}: {finding}")
    failed = [r for r in results if not r.passed]
    for r in failed:
        for violation in r.violations:
            print(f"VIOLATION in {r.name}: {violation}")
    print("all drills passed" if results and not failed else f"{len(failed)} drill(s) failed")


if __name__ == "__main__":
    main()
