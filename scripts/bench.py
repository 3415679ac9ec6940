#!/usr/bin/env python3
"""make bench: measures, side by side in one run on this machine,

  - the references: one RSA-2048 verification (`openssl speed rsa2048`); pgbench at the receiver's
    concurrency into a plain `(jti text primary key, payload text)` table, one row per transaction
    (`INSERT … ON CONFLICT DO NOTHING`, the "lean" ceiling) and 64 rows per statement (the lean batch); our
    own store, siwa.store_notifications, with 1 and 64 rows per call; PgQueuer (PyPI, .build/bench-venv)
    draining no-op jobs with 2 processes in batches of 64;
  - the receiver: wrk posting distinct pre-signed Apple-shaped notifications (rows counted in the database);
  - the worker: how fast one siwa-worker process with 1 and 2 lanes drains 100k queued notifications;
  - idle end-to-end latency, receive → applied;
  - signed webhooks: deliveries per second to a fast local endpoint (`siwactl webhooks listen`), and idle
    lag change → webhook acknowledged (and Apple's POST → webhook once the worker writes the changefeed);
  - the relay-mail gate (siwa-mailgate): policy decisions per second and p99 at 200 concurrent Postfix-style
    connections, and the HTTP bulk check's addresses per second (10,000 per call), each beside a plain
    indexed lookup of the same addresses in one query;

and prints tables with the CPU each process spent per notification, read from /proc (utime + stime of the
receiver, of every process of this benchmark's PostgreSQL cluster, of the load generator and of the worker,
sampled just before and just after each measured window, divided by the rows stored or events applied in
it), and last the targets: each measure as a ratio to its reference from the same run. Everything runs
against a throwaway PostgreSQL cluster (fsync on) and only on loopback. Standard library only (PgQueuer runs
in its own venv, scripts/bench-pgqueuer.py).
"""

import argparse
import atexit
import base64
import http.client
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AUDIENCE = "com.example.bench"


BINARIES = ("siwa-receiver", "siwa-worker", "siwactl", "siwa-bench", "siwa-mailgate")


def log(message, tag="bench", stream=None):
    print(f"[{tag}] {message}", file=stream or sys.stderr, flush=True)


def binaries_in(build):
    """The path of each of BINARIES in the build directory `build`; exits when one is not built."""
    binaries = {name: os.path.join(build, name) for name in BINARIES}
    for path in binaries.values():
        if not os.access(path, os.X_OK):
            sys.exit(f"missing {path}: build it first (make bench builds as make dist does; make drills "
                     "runs `swift build -c release`)")
    return binaries


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid):
    """The fields of /proc/PID/stat from field 3 (state) on; None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            # The command name (field 2) may hold spaces and parentheses: split after its closing one.
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_cpu_seconds(pid, children=False):
    """utime + stime of the process `pid` (all its threads), from /proc/PID/stat, in seconds; with
    `children`, also cutime + cstime (what its waited-for, exited children spent). 0 when it is gone."""
    fields = _stat_fields(pid)
    if fields is None:
        return 0.0
    # fields[0] is field 3 (state): utime, stime, cutime, cstime are fields 14..17.
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / CLOCK_TICKS


def reaped_children_cpu_seconds(pid):
    """cutime + cstime of the process `pid`: what the exited children it waited for spent (with theirs)."""
    fields = _stat_fields(pid)
    return (int(fields[13]) + int(fields[14])) / CLOCK_TICKS if fields else 0.0


def children_of(pid):
    """The pids whose parent (field 4 of /proc/PID/stat) is `pid`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return found


def children_cpu_seconds():
    """CPU seconds of this script's waited-for children (resource.getrusage RUSAGE_CHILDREN): the delta
    around one subprocess.run is that process's own user + system time, however short-lived it is."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# Never a port chosen for someone else: every service here binds port 0 and tells the kernel's choice
# through --listen-address-file (Sources/ServiceSupport/ListenAddressFile.swift: one `NAME HOST:PORT` line
# per listener, written atomically once all listen, removed on a clean stop). Shared with drills/drills.py.
LISTEN_ADDRESS_DIR = None


def listen_address_path(name):
    """A path for a --listen-address-file named after `name`, in a private directory removed at exit."""
    global LISTEN_ADDRESS_DIR
    if LISTEN_ADDRESS_DIR is None:
        LISTEN_ADDRESS_DIR = tempfile.mkdtemp(prefix="siwa-listen-")
        atexit.register(shutil.rmtree, LISTEN_ADDRESS_DIR, True)
    return os.path.join(LISTEN_ADDRESS_DIR, f"{name}.addresses")


def read_listen_addresses(path):
    """The listeners in a --listen-address-file, name → HOST:PORT; None while the file is not there."""
    try:
        with open(path) as f:
            return dict(line.split() for line in f if line.strip())
    except FileNotFoundError:
        return None


def start_listening(command, name, timeout=60.0, **popen):
    """Starts `command` (its listeners on port 0) with `--listen-address-file` appended, waits for the
    file and returns (process, name → HOST:PORT). A file left by an earlier run of the same name is removed
    first, so a restarted process is never taken for listening before it does."""
    path = listen_address_path(name)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    process = subprocess.Popen([*command, "--listen-address-file", path], **popen)
    listeners = {}

    def ready():
        found = read_listen_addresses(path)
        if found is not None:
            listeners.update(found)
            return True
        return process.poll() is not None

    try:
        wait_until(ready, f"{name} to listen", timeout=timeout)
    except BaseException:
        process.kill()
        process.wait()
        raise
    if not listeners:
        raise RuntimeError(f"{name} exited with {process.returncode} before listening")
    return process, listeners


def port_of(address):
    """The port of `HOST:PORT`."""
    return int(address.rsplit(":", 1)[1])


def pg_bindir():
    try:
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True).stdout.strip()
        if os.path.exists(os.path.join(out, "initdb")):
            return out
    except (OSError, subprocess.CalledProcessError):
        pass
    versions = sorted((int(v) for v in os.listdir("/usr/lib/postgresql") if v.isdigit()), reverse=True)
    for v in versions:
        path = f"/usr/lib/postgresql/{v}/bin"
        if os.path.exists(os.path.join(path, "initdb")):
            return path
    sys.exit("PostgreSQL server binaries not found (apt-get install postgresql)")


class Cluster:
    """A throwaway PostgreSQL cluster with fsync on, run as `postgres` when we are root; it can be
    stopped (fast or immediate) and started again. Shared with drills/drills.py. No TCP port (PostgreSQL
    cannot bind port 0 and tell which it got): a unix socket only, in `root`, which is the cluster's own
    directory, so the socket's number is PostgreSQL's default and nobody else's."""

    PORT = 5432  # names the socket file in `root` (.s.PGSQL.5432); no TCP listener

    SETTINGS = ("-c max_connections=400 -c shared_buffers=512MB -c max_wal_size=4GB "
                "-c checkpoint_timeout=30min")

    def __init__(self, root, settings=None):
        self.bindir = pg_bindir()
        self.root = root
        self.data = os.path.join(root, "data")
        self.port = self.PORT
        self.as_postgres = os.geteuid() == 0
        if self.as_postgres:
            shutil.chown(root, "postgres")
        self._tool("initdb", "-D", self.data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C")
        self.options = (f"-c listen_addresses='' -k {root} -p {self.port} -c fsync=on -c synchronous_commit=on "
                        + (settings if settings is not None else self.SETTINGS))
        self.start()

    def _tool(self, name, *args):
        command = [os.path.join(self.bindir, name), *args]
        if self.as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, cwd=self.root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def start(self):
        self._tool("pg_ctl", "-D", self.data, "-o", self.options, "-l", os.path.join(self.root, "server.log"),
                   "-w", "-t", "60", "start")

    def url(self, db, user="postgres"):
        return f"postgresql://{user}@/{db}?host={self.root}&port={self.port}"

    def psql_command(self, db, user="postgres"):
        return ["psql", "-h", self.root, "-p", str(self.port), "-U", user, "-d", db, "-v", "ON_ERROR_STOP=1",
                "-qAtX"]

    def psql(self, db, sql):
        out = subprocess.run(self.psql_command(db) + ["-c", sql], capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"psql failed: {out.stderr.strip()}")
        return out.stdout.strip()

    def create_database(self, name, rows_already_stored=0):
        """A database with schema.sql; with `rows_already_stored`, a copy of one prefilled with that many
        applied notifications (the copy is made once per size and copied as files: a 10-million-row
        database takes minutes to fill, seconds to copy)."""
        self.psql("postgres", f"DROP DATABASE IF EXISTS {name}")
        if rows_already_stored:
            template = self.prefilled(rows_already_stored)
            self.psql("postgres", f"CREATE DATABASE {name} TEMPLATE {template} STRATEGY = FILE_COPY")
            return
        self.psql("postgres", f"CREATE DATABASE {name}")
        subprocess.run(self.psql_command(name) + ["-f", os.path.join(ROOT, "schema.sql")], check=True,
                       stdout=subprocess.DEVNULL)

    def prefilled(self, rows):
        """The name of a database with schema.sql and `rows` applied notifications (700-byte tokens, 100,000
        users), filled by one set-based INSERT (the log and its dedupe keys in one statement), then
        VACUUM ANALYZE: all-visible, hint bits set, statistics current, as a long-running table is."""
        name = f"prefilled_{rows}"
        if self.psql("postgres", f"SELECT 1 FROM pg_database WHERE datname = '{name}'") == "1":
            return name
        self.create_database(name)
        log(f"pre-filling {rows:,} applied notifications")
        started = time.monotonic()
        self.psql(name, f"""
            WITH stored AS (
                INSERT INTO siwa.notification_log (jti, event_type, sub, audience, event_time, issued_at,
                    expires_at, raw_token, state, attempts, applied_at)
                SELECT 'old-' || g, 'consent-revoked', 'old-sub-' || (g % 100000), '{AUDIENCE}', now(), now(),
                    now(), repeat('x', 700), 'applied', 1, now()
                FROM generate_series(1, {rows}) g
                RETURNING jti, issued_at, expires_at)
            INSERT INTO siwa.notification_jtis (jti, issued_at, expires_at) SELECT * FROM stored""")
        self.psql(name, "VACUUM ANALYZE siwa.notification_log")
        self.psql(name, "VACUUM ANALYZE siwa.notification_jtis")
        self.psql(name, "CHECKPOINT")  # no checkpoint of the fill's writes left to run during a measurement
        log(f"pre-filled {rows:,} rows in {time.monotonic() - started:.0f} s")
        return name

    def drop_prefilled(self):
        for name in self.psql("postgres", "SELECT datname FROM pg_database WHERE datname LIKE 'prefilled\\_%'").split():
            self.psql("postgres", f"DROP DATABASE {name}")

    def settle(self, timeout=60):
        """Lets the work the previous measurement left behind finish before the next window opens: a
        checkpoint, then until no autovacuum worker runs (up to `timeout`), so that a window's CPU is its
        own workload's (e.g. the receiver's was measured while autovacuum processed pgbench's tables)."""
        self.psql("postgres", "CHECKPOINT")
        try:
            wait_until(lambda: self.psql("postgres", "SELECT count(*) FROM pg_stat_activity "
                                                     "WHERE backend_type = 'autovacuum worker'") == "0",
                       "autovacuum idle", timeout=timeout, interval=0.5)
        except WaitTimeout:
            log(f"warning: autovacuum still running after {timeout} s; measuring anyway")

    def postmaster_pid(self):
        with open(os.path.join(self.data, "postmaster.pid")) as f:
            return int(f.readline())

    def cpu_seconds(self, settle_to=None):
        """CPU seconds of the whole cluster so far: the postmaster (with its exited, reaped children's
        time) and every live child — backends, WAL writer, checkpointer, background writer, autovacuum.
        With `settle_to`, first waits (up to 10 s) until at most that many children are left, so that the
        backends of a client that just disconnected have exited and been reaped into the postmaster's
        cutime: an exiting backend's time would otherwise be missed or land in the next window."""
        postmaster = self.postmaster_pid()
        if settle_to is not None:
            try:
                wait_until(lambda: len(children_of(postmaster)) <= settle_to, "backends exited", timeout=10)
            except WaitTimeout:
                pass  # an autovacuum worker may come and go; sample anyway
        # Only this cluster: the postmaster of our data directory and its children (other clusters on the
        # machine have postmasters of their own). A child that exits is a zombie, still listed with its
        # times, until the postmaster reaps it into its cutime; one reaped while the children are being
        # read would be counted twice (or not at all), so read again until the postmaster's own figure
        # did not move across the read.
        for _ in range(20):
            reaped = reaped_children_cpu_seconds(postmaster)
            children = sum(process_cpu_seconds(pid) for pid in children_of(postmaster))
            if reaped_children_cpu_seconds(postmaster) == reaped:
                break
        return process_cpu_seconds(postmaster) + reaped + children

    def child_count(self):
        return len(children_of(self.postmaster_pid()))

    def count(self, db):
        return int(self.psql(db, "SELECT count(*) FROM siwa.notification_log"))

    def stop(self, mode="fast"):
        self._tool("pg_ctl", "-D", self.data, "-m", mode, "-w", "-t", "60", "stop")


class Receiver:
    def __init__(self, binary, database_url, jwks_url, connections):
        # The default handler threads: a notification waiting for its commit holds none.
        self.process, listeners = start_listening(
            [binary, "--listen", "127.0.0.1:0", "--database-url", database_url, "--audience", AUDIENCE,
             "--jwks-url", jwks_url, "--max-connections", "4096", "--log-level", "error"],
            "siwa-receiver", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.port = port_of(listeners["notifications"])
        self.url = f"http://127.0.0.1:{self.port}"
        wait_until(lambda: http_status(self.url + "/readyz") == 200, "receiver ready")

    def peak_rss_kib(self):
        with open(f"/proc/{self.process.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        return 0

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=30)


def commit_batches(url):
    """(rows, transactions) committed so far by a receiver, from its `siwa_commit_batch_size` histogram.
    Its /metrics also reads the database's health gauges (at most every 5 s), which on a prefilled log
    whose rows all arrived within the hour reads every block the received_at BRIN cannot rule out: a long
    timeout, and the scrapes are made outside the measured window."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=300)  # no proxy
    try:
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
    finally:
        connection.close()
    values = {}
    for line in text.splitlines():
        for suffix in ("_sum", "_count"):
            if line.startswith("siwa_commit_batch_size" + suffix + " "):
                values[suffix] = float(line.split()[1])
    return values.get("_sum", 0.0), values.get("_count", 0.0)


def http_status(url, timeout=2.0):
    """The status of GET `url` (any status, no redirects, no proxy), or None when nothing answered."""
    parts = urllib.parse.urlsplit(url)
    try:
        connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
        try:
            connection.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""))
            return connection.getresponse().status
        finally:
            connection.close()
    except (OSError, http.client.HTTPException):
        return None


class WaitTimeout(Exception):
    """A condition did not become true in time."""


def wait_until(condition, what, timeout=60.0, interval=0.05):
    """Polls `condition` every `interval` seconds; raises WaitTimeout after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    raise WaitTimeout(f"timed out after {timeout:.0f} s waiting for {what}")


def keygen(siwactl, out, kid=None):
    """`siwactl keygen` into the directory `out`; returns the key ID."""
    command = [siwactl, "keygen", "--out", out] + (["--kid", kid] if kid else [])
    printed = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return kid or printed.strip().split()[-1]


def sign(siwa_bench, keys, kid, audience, count, out):
    """`siwa-bench sign`: `count` distinct notification bodies, one JSON line each, into `out`."""
    subprocess.run([siwa_bench, "sign", "--key", os.path.join(keys, "private-key.pem"), "--kid", kid,
                    "--audience", audience, "--count", str(count), "--out", out], check=True)


def start_fake_apple(siwactl, keys):
    """`siwactl fake-apple` serving KEYS/jwks.json on loopback (port 0: the kernel's choice, read back),
    once it answers; returns the process and the key set's URL."""
    process, listeners = start_listening([siwactl, "fake-apple", "--listen", "127.0.0.1:0", "--keys", keys],
                                         "fake-apple", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://{listeners['apple']}/auth/keys"
    try:
        wait_until(lambda: http_status(url) == 200, "fake-apple")
    except BaseException:
        process.terminate()
        process.wait()
        raise
    return process, url


WRK_SCRIPT = r"""
local bodies, next_index = {}, 0
local created = 0
function setup(thread)
  thread:set("tid", created)
  created = created + 1
end
function init(args)
  local threads, line = tonumber(args[2]), 0
  for body in io.lines(args[1]) do
    if line % threads == tid then bodies[#bodies + 1] = body end
    line = line + 1
  end
end
function request()
  next_index = next_index + 1
  if next_index > #bodies then next_index = 1 end
  return wrk.format("POST", "/apple/notifications", {["Content-Type"] = "application/json"}, bodies[next_index])
end
"""


def parse_duration_ms(text):
    value, unit = re.match(r"([\d.]+)(us|ms|s|m)", text).groups()
    return float(value) * {"us": 0.001, "ms": 1, "s": 1000, "m": 60000}[unit]


def run_wrk(url, connections, seconds, bodies, workdir):
    script = os.path.join(workdir, "post.lua")
    with open(script, "w") as f:
        f.write(WRK_SCRIPT)
    threads = min(2, connections)
    out = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency", "--timeout", "10s",
         "-s", script, url + "/apple/notifications", "--", bodies, str(threads)],
        capture_output=True, text=True, check=True).stdout
    latency = dict(re.findall(r"^\s+(50|99)%\s+(\S+)", out, re.M))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return {
        "requests_per_second": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
        "p50_ms": parse_duration_ms(latency["50"]),
        "p99_ms": parse_duration_ms(latency["99"]),
        "non_2xx": int(non2xx.group(1)) if non2xx else 0,
        "socket_errors": sum(int(x) for x in errors.groups()) if errors else 0,
    }


TOKEN = "x" * 700
BATCH = 64

# The references, pgbench at the receiver's concurrency with a random (unique) jti per row:
# - the lean single-row ceiling: one `INSERT … ON CONFLICT DO NOTHING` per transaction into a plain
#   (jti text primary key, payload text) table;
# - the lean 64-row batch: one statement per transaction inserting 64 rows into the same table, the
#   700-byte payloads sent by the client as one text array parameter (as the receiver sends its batches);
# - our own table shape, the receiver's store siwa.store_notifications, with one row per call (the same
#   dedupe key, log row, join to siwa.accounts, queue row and NOTIFY as the receiver's batches) and with
#   64 rows per call (the receiver's batch, its tokens sent as one text array parameter).
LEAN_TABLE = "CREATE TABLE lean (jti text PRIMARY KEY, payload text)"
LEAN_INSERT = (f"INSERT INTO lean (jti, payload) VALUES (gen_random_uuid()::text, '{TOKEN}') "
               "ON CONFLICT (jti) DO NOTHING;\n")
LEAN_BATCH_INSERT = ("INSERT INTO lean (jti, payload) SELECT gen_random_uuid()::text, t FROM unnest(:tokens::text[]) t "
                     "ON CONFLICT (jti) DO NOTHING;\n")
OWN_INSERT = (
    "SELECT siwa.store_notifications(ARRAY[gen_random_uuid()::text], ARRAY['consent-revoked'], "
    f"ARRAY['001234.bench'], ARRAY['{AUDIENCE}'], ARRAY[NULL::text], ARRAY[NULL::boolean], ARRAY[now()], "
    f"ARRAY[now()], ARRAY[now() + interval '1 day'], ARRAY['{TOKEN}'], ARRAY[NULL::timestamptz]);\n")


def _filled(value, type_name):
    return f"array_fill({value}::{type_name}, ARRAY[{BATCH}])"


OWN_BATCH_INSERT = (
    "SELECT count(*) FROM siwa.store_notifications("
    f"ARRAY(SELECT gen_random_uuid()::text FROM generate_series(1, {BATCH})), "
    + ", ".join(_filled(value, type_name) for value, type_name in (
        ("'consent-revoked'", "text"), ("'001234.bench'", "text"), (f"'{AUDIENCE}'", "text"), ("NULL", "text"),
        ("NULL", "boolean"), ("now()", "timestamptz"), ("now()", "timestamptz"),
        ("(now() + interval '1 day')", "timestamptz")))
    + f", :tokens::text[], {_filled('NULL', 'timestamptz')});\n")
BATCH_TOKENS = "tokens={" + ",".join([TOKEN] * BATCH) + "}"


def run_pgbench(cluster, db, connections, seconds, workdir, statement=OWN_INSERT, table="siwa.notification_log",
                rows_per_transaction=1, warmup=2):
    """pgbench running `statement` (`rows_per_transaction` rows per transaction) into `table` for `warmup` +
    `seconds`; measured over the last `seconds` only (every connection open and its plans made, as the
    receiver's are): transactions per second, latency percentiles (whole run), the PostgreSQL CPU per row
    stored in the window (from /proc) and pgbench's own per row of the whole run (its rusage)."""
    script = os.path.join(workdir, "insert.sql")
    with open(script, "w") as f:
        f.write(statement)
    logdir = tempfile.mkdtemp(dir=workdir)
    os.chmod(logdir, 0o777)
    count = f"SELECT count(*) FROM {table}"
    rows_at_start = int(cluster.psql(db, count))
    cluster.settle()
    load_before = children_cpu_seconds()
    process = subprocess.Popen(
        ["pgbench", "-h", cluster.root, "-p", str(cluster.port), "-U", "postgres", "-n", "-M", "prepared",
         "-c", str(connections), "-j", str(min(2, connections)), "-T", str(seconds + warmup), "-f", script,
         "-D", BATCH_TOKENS, "--log", "--log-prefix", os.path.join(logdir, "tx"), db],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(warmup)
    pg_before, rows_before, window_started = cluster.cpu_seconds(), int(cluster.psql(db, count)), time.monotonic()
    time.sleep(seconds)
    pg_cpu = cluster.cpu_seconds() - pg_before
    rows = int(cluster.psql(db, count)) - rows_before
    window = time.monotonic() - window_started
    out, err = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"pgbench failed: {err.strip()[-500:]}")
    load_cpu = children_cpu_seconds() - load_before
    rows_in_run = int(cluster.psql(db, count)) - rows_at_start
    latencies = []
    for name in os.listdir(logdir):
        with open(os.path.join(logdir, name)) as f:
            latencies += [int(line.split()[2]) / 1000.0 for line in f]
    latencies.sort()
    return {
        "transactions_per_second": rows / rows_per_transaction / window,
        "rows_per_second": rows / window,
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "rows": rows,
        "postgres_us_per_row": per_row_us(pg_cpu, rows),
        "pgbench_us_per_row": per_row_us(load_cpu, rows_in_run),
    }


def per_row_us(cpu_seconds, rows):
    return cpu_seconds * 1e6 / rows if rows else float("nan")


def percentile(sorted_values, p):
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(p / 100 * (len(sorted_values) - 1))))
    return sorted_values[index]


def create_lean_database(cluster, rows_already_stored=0):
    cluster.psql("postgres", "DROP DATABASE IF EXISTS lean")
    cluster.psql("postgres", "CREATE DATABASE lean")
    cluster.psql("lean", LEAN_TABLE)
    if rows_already_stored:
        log(f"pre-filling lean with {rows_already_stored:,} rows")
        started = time.monotonic()
        cluster.psql("lean", f"INSERT INTO lean SELECT 'old-' || g, repeat('x', 700) "
                             f"FROM generate_series(1, {rows_already_stored}) g")
        cluster.psql("lean", "VACUUM ANALYZE lean")
        log(f"pre-filled lean in {time.monotonic() - started:.0f} s")


def ingest(cluster, binaries, jwks_url, bodies, workdir, connections, seconds, prefill=0):
    """The pgbench references (lean single-row, then the lean 64-row batch into the same table; our own
    shape with one, then with 64 rows per call) and the receiver at the same concurrency, on fresh databases,
    with the CPU per stored row of the receiver, of PostgreSQL and of wrk over the measured window."""
    create_lean_database(cluster, prefill)
    lean = run_pgbench(cluster, "lean", connections, seconds, workdir, LEAN_INSERT, "lean")
    lean_batch = run_pgbench(cluster, "lean", connections, seconds, workdir, LEAN_BATCH_INSERT, "lean",
                             rows_per_transaction=BATCH)
    cluster.create_database("ceiling", prefill)
    ceiling = run_pgbench(cluster, "ceiling", connections, seconds, workdir)
    own_batch = run_pgbench(cluster, "ceiling", connections, seconds, workdir, OWN_BATCH_INSERT,
                            rows_per_transaction=BATCH)
    cluster.create_database("ingest", prefill)
    if prefill:
        cluster.drop_prefilled()  # its two copies are made: free the disk (10 million rows: ~10 GB)
    for name in ("lean", "ceiling"):  # measured: no autovacuum of theirs during the receiver's window
        cluster.psql("postgres", f"DROP DATABASE {name}")
    result = receiver_ingest(cluster, binaries, jwks_url, bodies, workdir, connections, seconds, "ingest")
    result["ceiling_tps"] = ceiling["transactions_per_second"]
    result["ceiling_p50_ms"] = ceiling["p50_ms"]
    result["ceiling_p99_ms"] = ceiling["p99_ms"]
    result["ceiling_postgres_us_per_row"] = ceiling["postgres_us_per_row"]
    result["ratio"] = result["rows_per_second"] / ceiling["transactions_per_second"]
    result["lean_tps"] = lean["transactions_per_second"]
    result["lean_p50_ms"] = lean["p50_ms"]
    result["lean_p99_ms"] = lean["p99_ms"]
    result["lean_postgres_us_per_row"] = lean["postgres_us_per_row"]
    result["lean_ratio"] = result["rows_per_second"] / lean["transactions_per_second"]
    result["lean_batch_rows_per_second"] = lean_batch["rows_per_second"]
    result["lean_batch_postgres_us_per_row"] = lean_batch["postgres_us_per_row"]
    result["own_batch_rows_per_second"] = own_batch["rows_per_second"]
    result["own_batch_postgres_us_per_row"] = own_batch["postgres_us_per_row"]
    return result


def receiver_ingest(cluster, binaries, jwks_url, bodies, workdir, connections, seconds, db):
    """The receiver at `connections` under wrk, storing into database `db`: rows/s counted in the database,
    latency, peak RSS, and the CPU per stored row of the receiver, of PostgreSQL and of wrk over the window."""
    receiver = Receiver(binaries["siwa-receiver"], cluster.url(db), jwks_url, connections)
    before = cluster.count(db)
    committed_before = commit_batches(receiver.url)  # also waits for the receiver's first health reading
    cluster.settle()
    receiver_before = process_cpu_seconds(receiver.process.pid)
    connected = cluster.child_count()
    pg_before, wrk_before = cluster.cpu_seconds(settle_to=connected), children_cpu_seconds()
    started = time.monotonic()
    result = run_wrk(receiver.url, connections, seconds, bodies, workdir)
    elapsed = time.monotonic() - started
    receiver_cpu = process_cpu_seconds(receiver.process.pid) - receiver_before
    pg_cpu, wrk_cpu = cluster.cpu_seconds(settle_to=connected) - pg_before, children_cpu_seconds() - wrk_before
    committed_after = commit_batches(receiver.url)
    rows = cluster.count(db) - before
    with open(bodies) as f:
        distinct = sum(1 for _ in f)
    if rows >= distinct:
        log(f"warning: all {distinct:,} pre-signed notifications were stored, so wrk re-sent duplicates that store "
            "nothing: rows/s is understated and CPU per row overstated; raise --tokens")
    result["rows"] = rows
    result["rows_per_second"] = rows / elapsed
    result["receiver_us_per_row"] = per_row_us(receiver_cpu, rows)
    result["postgres_us_per_row"] = per_row_us(pg_cpu, rows)
    result["wrk_us_per_row"] = per_row_us(wrk_cpu, rows)
    result["peak_rss_mib"] = receiver.peak_rss_kib() / 1024
    commits = committed_after[1] - committed_before[1]
    result["rows_per_commit"] = (committed_after[0] - committed_before[0]) / commits if commits else 0.0
    receiver.stop()
    return result


def prefilled_ingest(cluster, binaries, jwks_url, bodies, workdir, rows_stored, seconds, connections=64):
    """The receiver at `connections` on an empty database, on one with `rows_stored` applied notifications
    already stored, then on an empty one again (the same bodies each time, none of them stored before), so
    that a drift of the machine's speed between runs shows as a difference between the two empty runs. The
    ratio is the stored run's rows/s over the empty runs' mean."""
    if rows_stored <= 0:
        sys.exit("--only prefilled needs --prefill-rows N (e.g. 10000000)")
    stored_db = cluster.prefilled(rows_stored)
    runs = {}
    for label in ("empty", "stored", "empty again"):
        db = stored_db
        if label != "stored":
            cluster.create_database("ingest")
            db = "ingest"
        log(f"receiver at {connections} connections, {label}"
            + (f" ({rows_stored:,} rows)" if label == "stored" else ""))
        runs[label] = receiver_ingest(cluster, binaries, jwks_url, bodies, workdir, connections, seconds, db)
    empty = (runs["empty"]["rows_per_second"] + runs["empty again"]["rows_per_second"]) / 2
    return {"rows_stored": rows_stored, "connections": connections, "runs": runs,
            "ratio": runs["stored"]["rows_per_second"] / empty}


def print_prefilled(p):
    print()
    print(f"Ingest with {p['rows_stored']:,} rows already stored, against an empty database before and after "
          f"({p['connections']} connections; CPU µs per stored notification)")
    print(f"{'database':>22} {'rows/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'receiver':>9} {'PostgreSQL':>11} "
          f"{'non-2xx':>8} {'rows/commit':>12}")
    for label, r in p["runs"].items():
        print(f"{label:>22} {r['rows_per_second']:>9.0f} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} "
              f"{r['receiver_us_per_row']:>9.1f} {r['postgres_us_per_row']:>11.1f} "
              f"{r['non_2xx'] + r['socket_errors']:>8} {r['rows_per_commit']:>12.1f}")


def drain_rows(siwa_bench, keys, kid, audience, count, out, subs=20000, jti_prefix="drain-",
               sub_prefix="drain-sub-"):
    """`siwa-bench rows`: the drain's `count` notifications with their signed tokens, as COPY text rows
    (readable by the cluster's server process)."""
    subprocess.run([siwa_bench, "rows", "--key", os.path.join(keys, "private-key.pem"), "--kid", kid,
                    "--audience", audience, "--count", str(count), "--out", out, "--subs", str(subs),
                    "--jti-prefix", jti_prefix, "--sub-prefix", sub_prefix], check=True)
    os.chmod(out, 0o644)


def load_drain_rows(cluster, db, rows):
    """Stores drain_rows' file as the receiver stores notifications: log rows and their queue rows."""
    cluster.psql(db, f"""
        CREATE TABLE public.drain_rows (g integer, jti text, event_type text, sub text, audience text,
            email text, is_private_email boolean, event_time float8, issued_at float8, expires_at float8,
            raw_token text);
        COPY public.drain_rows FROM '{rows}';
        WITH stored AS (
            INSERT INTO siwa.notification_log (jti, event_type, sub, audience, email, is_private_email,
                event_time, issued_at, expires_at, raw_token)
            SELECT jti, event_type, sub, audience, email, is_private_email, to_timestamp(event_time),
                to_timestamp(issued_at), to_timestamp(expires_at), raw_token
            FROM public.drain_rows ORDER BY g
            RETURNING id, jti, issued_at)
        INSERT INTO siwa.notification_queue (id, jti, issued_at) SELECT id, jti, issued_at FROM stored;
        DROP TABLE public.drain_rows""")


def rsa_verify_us():
    """The reference: one RS256-sized verification (`openssl speed rsa2048`, one core), in µs."""
    out = subprocess.run(["openssl", "speed", "-seconds", "3", "rsa2048"], capture_output=True, text=True)
    match = re.search(r"rsa\s+2048 bits\s+[\d.]+s\s+([\d.]+)s", out.stdout)
    return float(match.group(1)) * 1e6 if match else None


def drain(cluster, binaries, workers, events=100_000, rows=None, jwks_url=None):
    """Drains `events` queued notifications with one `siwa-worker --once` process of `workers` lanes
    (`--concurrency`); with `rows` (drain_rows' file) each carries a token signed with its claims, which the
    worker verifies against `jwks_url` (a worker from before that verification applies them all the same)."""
    db = f"drain{workers}"
    cluster.create_database(db)
    if rows:
        cluster.psql(db, """
            INSERT INTO siwa.sessions (sub, created_at)
            SELECT 'drain-sub-' || g, now() - interval '1 day' FROM generate_series(1, 20000) g""")
        load_drain_rows(cluster, db, rows)
    else:
        cluster.psql(db, f"""
        INSERT INTO siwa.sessions (sub, created_at)
        SELECT 'drain-sub-' || g, now() - interval '1 day' FROM generate_series(1, 20000) g;
        WITH stored AS (
            INSERT INTO siwa.notification_log (jti, event_type, sub, audience, email, is_private_email, event_time,
                issued_at, raw_token)
            SELECT 'drain-' || g, (ARRAY['email-disabled','email-enabled','consent-revoked','account-delete'])[1 + g % 4],
                'drain-sub-' || (g % 20000), '{AUDIENCE}',
                CASE WHEN g % 4 < 2 THEN 'd' || g || '@privaterelay.appleid.com' END, CASE WHEN g % 4 < 2 THEN true END,
                now() - (g || ' ms')::interval, now(), repeat('x', 700)
            FROM generate_series(1, {events}) g
            RETURNING id, jti, issued_at)
        INSERT INTO siwa.notification_queue (id, jti, issued_at) SELECT id, jti, issued_at FROM stored""")
    # Statistics for the tables just filled only: analysing the still-empty siwa.accounts would record
    # "0 rows" and make the worker's cached plans scan it sequentially as it grows (a fresh deployment's
    # never-analysed table does not have that problem; autovacuum analyses it as it fills).
    cluster.psql(db, "VACUUM ANALYZE siwa.notification_log")
    cluster.psql(db, "VACUUM ANALYZE siwa.notification_queue")
    cluster.psql(db, "VACUUM ANALYZE siwa.sessions")
    applied_before = int(cluster.psql(db, "SELECT count(*) FROM siwa.notification_log WHERE state <> 'pending'"))
    cluster.settle()
    idle_children = cluster.child_count()
    pg_before, worker_before = cluster.cpu_seconds(settle_to=idle_children), children_cpu_seconds()
    started = time.monotonic()
    keys = ["--jwks-url", jwks_url, "--audience", AUDIENCE] if jwks_url else []
    subprocess.run(
        [binaries["siwa-worker"], "--database-url", cluster.url(db), "--once", "--concurrency", str(workers),
         "--log-level", "error"] + keys,
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    elapsed = time.monotonic() - started
    pg_cpu = cluster.cpu_seconds(settle_to=idle_children) - pg_before
    worker_cpu = children_cpu_seconds() - worker_before
    remaining = int(cluster.psql(db, "SELECT count(*) FROM siwa.notification_queue"))
    applied = int(cluster.psql(db, "SELECT count(*) FROM siwa.notification_log WHERE state <> 'pending'")) \
        - applied_before
    # Updates of the queue (retries, busy) and of the log (outcomes), and how many of them were HOT.
    time.sleep(1)  # the statistics collector's last report
    hot = cluster.psql(db, """
        SELECT coalesce(sum(n_tup_upd) FILTER (WHERE relname = 'notification_queue'), 0) || ' '
            || coalesce(sum(n_tup_hot_upd) FILTER (WHERE relname = 'notification_queue'), 0) || ' '
            || coalesce(sum(n_tup_del) FILTER (WHERE relname = 'notification_queue'), 0) || ' '
            || coalesce(sum(n_tup_upd) FILTER (WHERE relname LIKE 'notification_log_%'), 0) || ' '
            || coalesce(sum(n_tup_hot_upd) FILTER (WHERE relname LIKE 'notification_log_%'), 0)
          FROM pg_stat_user_tables WHERE schemaname = 'siwa'""").split()
    return {"lanes": workers, "processes": 1, "events": events, "seconds": elapsed,
            "events_per_second": events / elapsed, "left_pending": remaining,
            "applied": applied, "worker_us_per_event": per_row_us(worker_cpu, applied),
            "postgres_us_per_event": per_row_us(pg_cpu, applied),
            "queue_updates": int(hot[0]), "queue_hot_updates": int(hot[1]), "queue_deletes": int(hot[2]),
            "log_updates": int(hot[3]), "log_hot_updates": int(hot[4])}


BENCH_VENV_PYTHON = os.path.join(ROOT, ".build", "bench-venv", "bin", "python")


def pgqueuer_drain(cluster, jobs, processes=2, batch=BATCH):
    """The generic queue's reference: PgQueuer (PyPI `pgqueuer`, in .build/bench-venv, made by
    scripts/bench-venv) draining `jobs` queued no-op jobs with `processes` consumer processes, `batch` jobs
    per dequeue, in a database of the benchmark's own cluster. events/s over the span from the first job
    picked to the last completion logged (PgQueuer's own log table: the interpreters' start-up is not
    counted against it); PostgreSQL CPU per job over the consumers' whole run, and theirs (rusage)."""
    subprocess.run([os.path.join(ROOT, "scripts", "bench-venv")], check=True)
    script = os.path.join(ROOT, "scripts", "bench-pgqueuer.py")
    db = "pgqueuer"
    cluster.psql("postgres", f"DROP DATABASE IF EXISTS {db}")
    cluster.psql("postgres", f"CREATE DATABASE {db}")
    url = cluster.url(db)
    subprocess.run([BENCH_VENV_PYTHON, script, "install", url], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([BENCH_VENV_PYTHON, script, "enqueue", url, str(jobs)], check=True)
    cluster.psql(db, "VACUUM ANALYZE pgqueuer")
    cluster.settle()
    idle_children = cluster.child_count()
    pg_before, consumers_before = cluster.cpu_seconds(settle_to=idle_children), children_cpu_seconds()
    started = time.monotonic()
    consumers = [subprocess.Popen([BENCH_VENV_PYTHON, script, "drain", url, str(batch)], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True) for _ in range(processes)]
    for consumer in consumers:
        _, err = consumer.communicate(timeout=1800)
        if consumer.returncode != 0:
            raise RuntimeError(f"PgQueuer consumer failed: {err.strip()[-1000:]}")
    elapsed = time.monotonic() - started
    pg_cpu = cluster.cpu_seconds(settle_to=idle_children) - pg_before
    consumers_cpu = children_cpu_seconds() - consumers_before
    left, done, span = cluster.psql(db, """
        SELECT (SELECT count(*) FROM pgqueuer) || ' '
            || (SELECT count(*) FROM pgqueuer_log WHERE status = 'successful') || ' '
            || extract(epoch FROM (SELECT max(created) FROM pgqueuer_log WHERE status = 'successful')
                                - (SELECT min(created) FROM pgqueuer_log WHERE status = 'picked'))""").split()
    done, span = int(done), float(span)
    # PgQueuer's default durability: its tables are logged (WAL, fsync'd commits) as ours are.
    logged = cluster.psql(db, "SELECT bool_and(relpersistence = 'p') FROM pg_class "
                              "WHERE relname IN ('pgqueuer', 'pgqueuer_log')") == "t"
    return {"jobs": jobs, "processes": processes, "batch": batch, "done": done, "left": int(left), "logged": logged,
            "seconds": span, "seconds_with_startup": elapsed, "events_per_second": done / span,
            "postgres_us_per_event": per_row_us(pg_cpu, done), "consumers_us_per_event": per_row_us(consumers_cpu, done)}


def idle_latency(cluster, binaries, jwks_url, bodies, count=200):
    cluster.create_database("idle")
    receiver = Receiver(binaries["siwa-receiver"], cluster.url("idle"), jwks_url, 1)
    worker = subprocess.Popen(
        [binaries["siwa-worker"], "--database-url", cluster.url("idle"), "--poll-interval", "1",
         "--jwks-url", jwks_url, "--log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)  # let the worker connect and LISTEN before the first notification
    client_ms = []
    with open(bodies) as f:
        lines = [next(f) for _ in range(count)]
    for body in lines:
        request = urllib.request.Request(
            receiver.url + "/apple/notifications", data=body.strip().encode(),
            headers={"Content-Type": "application/json"})
        started = time.monotonic()
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
        client_ms.append((time.monotonic() - started) * 1000)
        time.sleep(0.02)  # idle: one notification at a time
    wait_until(lambda: cluster.psql("idle", "SELECT count(*) FROM siwa.notification_log WHERE applied_at IS NULL")
               == "0", "all applied", timeout=60)
    lags = sorted(float(x) for x in cluster.psql(
        "idle", "SELECT extract(epoch FROM applied_at - received_at) * 1000 FROM siwa.notification_log").split())
    worker.send_signal(signal.SIGTERM)
    worker.wait(timeout=30)
    receiver.stop()
    client_ms.sort()
    return {"applied_p50_ms": percentile(lags, 50), "applied_p99_ms": percentile(lags, 99),
            "http_p50_ms": percentile(client_ms, 50), "http_p99_ms": percentile(client_ms, 99)}


def webhooks(cluster, binaries, jwks_url, bodies, changes=20_000, subs=2_000, idle_count=200):
    """Webhook throughput to a fast local endpoint (`siwactl webhooks listen`, which verifies every
    signature) with one worker process, and idle lag: change applied → webhook acknowledged, and, when the
    worker writes siwa.changes (the changefeed), Apple's POST → webhook acknowledged."""
    db = "webhooks"
    cluster.create_database(db)
    secret = "whsec_" + base64.b64encode(os.urandom(32)).decode()
    listener, listeners = start_listening(
        [binaries["siwactl"], "webhooks", "listen", "--port", "0"], "webhooks-listen",
        env={**os.environ, "SIWA_WEBHOOK_SECRET": secret},  # never on the command line (ps shows it)
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://{listeners['webhooks']}/"
    worker = None
    receiver = None
    try:
        wait_until(lambda: http_status(endpoint) == 405, "webhooks listen")
        cluster.psql(db, f"SELECT siwa.add_webhook_endpoint('{endpoint}', '{secret}', NULL, 16)")
        cluster.psql(db, f"""
            INSERT INTO siwa.changes (type, sub, event_time, applied_at, jti, audience, sessions_revoked)
            SELECT 'siwa.consent_revoked', 'wh-sub-' || (g % {subs}), now(), now(), 'wh-' || g, '{AUDIENCE}', 1
              FROM generate_series(1, {changes}) g""")
        cluster.psql(db, "VACUUM ANALYZE siwa.webhook_deliveries")
        idle_children = cluster.child_count()
        pg_before = cluster.cpu_seconds(settle_to=idle_children)
        started = time.monotonic()
        worker, worker_listeners = start_listening(
            [binaries["siwa-worker"], "--database-url", cluster.url(db), "--webhook-concurrency", "8",
             "--metrics-listen", "127.0.0.1:0", "--log-level", "error"],
            "siwa-worker", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        metrics_port = port_of(worker_listeners["metrics"])
        wait_until(lambda: cluster.psql(db, "SELECT count(*) FROM siwa.webhook_deliveries WHERE state = 'pending'")
                   == "0", "every webhook delivered", timeout=600, interval=0.1)
        elapsed = time.monotonic() - started
        worker_cpu = process_cpu_seconds(worker.pid)
        listener_cpu = process_cpu_seconds(listener.pid)
        pg_cpu = cluster.cpu_seconds(settle_to=idle_children) - pg_before
        delivered = int(cluster.psql(db, "SELECT count(*) FROM siwa.webhook_deliveries WHERE state = 'delivered'"))
        connections = webhook_connections_opened(metrics_port)
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)

        # Idle lag, one notification at a time, through the whole pipeline.
        receiver = Receiver(binaries["siwa-receiver"], cluster.url(db), jwks_url, 1)
        worker = subprocess.Popen(
            [binaries["siwa-worker"], "--database-url", cluster.url(db), "--jwks-url", jwks_url,
             "--log-level", "error"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)  # LISTEN before the first one
        with open(bodies) as f:
            lines = [next(f) for _ in range(idle_count)]
        for body in lines:
            request = urllib.request.Request(
                receiver.url + "/apple/notifications", data=body.strip().encode(),
                headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as response:
                response.read()
            time.sleep(0.02)
        wait_until(lambda: cluster.psql(db, "SELECT count(*) FROM siwa.webhook_deliveries WHERE state = 'pending'")
                   == "0", "idle webhooks delivered", timeout=60)
        lags = sorted(float(x) for x in cluster.psql(db, f"""
            SELECT extract(epoch FROM d.delivered_at - c.applied_at) * 1000
              FROM siwa.webhook_deliveries d JOIN siwa.changes c ON c.id = d.change_id
             WHERE c.id > {changes}""").split())
        end_to_end = sorted(float(x) for x in cluster.psql(db, """
            SELECT extract(epoch FROM d.delivered_at - l.received_at) * 1000
              FROM siwa.webhook_deliveries d JOIN siwa.changes c ON c.id = d.change_id
              JOIN siwa.notification_log l ON l.jti = c.jti""").split())
    finally:
        for process in (worker, listener):
            if process and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=30)
        if receiver:
            receiver.stop()
    return {"changes": changes, "subs": subs, "delivered": delivered, "seconds": elapsed,
            "per_second": delivered / elapsed, "worker_us": per_row_us(worker_cpu, delivered),
            "connections_opened": connections,
            "postgres_us": per_row_us(pg_cpu, delivered), "listener_us": per_row_us(listener_cpu, delivered),
            "lag_p50_ms": percentile(lags, 50), "lag_p99_ms": percentile(lags, 99),
            "end_to_end_p50_ms": percentile(end_to_end, 50) if end_to_end else None,
            "end_to_end_p99_ms": percentile(end_to_end, 99) if end_to_end else None}


# The hosted platforms the outbox bench runs against their fakes, with their names for Apple.
HOSTED_PLATFORMS = [("keycloak", "apple"), ("firebase", "apple.com"), ("auth0", "apple"), ("clerk", "oauth_apple")]


def hosted_credentials(platform, started):
    """The credentials file of an adapter on a fake platform (what serve.py printed, as the adapter reads it)."""
    credentials = started["credentials"]
    if platform == "firebase":
        return dict(json.loads(credentials["service_account_json"]), api_url=started["url"])
    if platform == "auth0":
        return dict(credentials, base_url=started["url"])
    return credentials


def outbox(cluster, binaries, workdir, events=20_000, subs=2_000, suppressions=10_000, adapter_users=2_000,
           hosted_users=500):
    """Each outbox consumer of siwa-worker alone against the same fast keep-alive endpoint
    (scripts/bench-endpoint.py): webhook lanes and Shared Signals push (8 lanes each, `events` changes of
    `subs` users), the SendGrid suppression outbox (its one lane per provider, `suppressions` addresses),
    a Supabase Auth adapter (its one lane, a consent revoked for each of `adapter_users` users), and an
    adapter of each hosted platform against its fake (Tests/Fixtures/hosted-platforms; `hosted_users`
    users each, a consent revoked for each);
    the time from the worker's start to the last row finished."""
    db = "outbox"
    cluster.create_database(db)
    endpoint = subprocess.Popen([sys.executable, os.path.join(ROOT, "scripts", "bench-endpoint.py")],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    base = f"http://127.0.0.1:{endpoint.stdout.readline().strip()}"
    ssf_key = os.path.join(workdir, "ssf-key.pem")
    subprocess.run([binaries["siwactl"], "ssf", "keygen", "--out", ssf_key], check=True, stdout=subprocess.DEVNULL)
    sendgrid_key = os.path.join(workdir, "sendgrid-key")
    with open(os.open(sendgrid_key, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write("SG.bench")
    secret = "whsec_" + base64.b64encode(os.urandom(32)).decode()
    # Supabase Auth's tables (the test fixture) in a database of their own, a user with an Apple identity
    # and two sessions per adapter event; the adapter's login is the cluster's owner.
    cluster.psql("postgres", "DROP DATABASE IF EXISTS outbox_auth")
    cluster.psql("postgres", "CREATE DATABASE outbox_auth")
    cluster.psql("outbox_auth", "DO $$ BEGIN CREATE ROLE supabase_auth_admin NOLOGIN NOINHERIT; "
                                "EXCEPTION WHEN duplicate_object THEN NULL; END $$")
    subprocess.run(cluster.psql_command("outbox_auth") + ["-f", os.path.join(
        ROOT, "Tests", "Fixtures", "auth-platforms", "supabase-auth.sql")], check=True, stdout=subprocess.DEVNULL)
    cluster.psql("outbox_auth", f"""
        INSERT INTO auth.users (id, aud, role, email, encrypted_password, raw_app_meta_data, created_at, updated_at)
        SELECT ('00000000-0000-4000-8000-' || lpad(g::text, 12, '0'))::uuid, 'authenticated', 'authenticated',
               'u' || g || '@privaterelay.appleid.com', '', '{{}}', now(), now()
          FROM generate_series(1, {adapter_users}) g;
        INSERT INTO auth.identities (provider_id, user_id, identity_data, provider, created_at, updated_at)
        SELECT 'ad-sub-' || g, ('00000000-0000-4000-8000-' || lpad(g::text, 12, '0'))::uuid,
               jsonb_build_object('sub', 'ad-sub-' || g), 'apple', now(), now()
          FROM generate_series(1, {adapter_users}) g;
        INSERT INTO auth.sessions (id, user_id, created_at)
        SELECT gen_random_uuid(), ('00000000-0000-4000-8000-' || lpad(g::text, 12, '0'))::uuid, now()
          FROM generate_series(1, {adapter_users}) g, generate_series(1, 2)""")
    cluster.psql("outbox_auth", "VACUUM ANALYZE")
    # The fake hosted platforms (Tests/Fixtures/hosted-platforms; Firebase's verifies RS256 with the
    # platforms venv's cryptography), each with a user linked to Apple and one session per hosted event.
    venv_python = os.path.join(ROOT, ".build", "platforms-venv", "bin", "python")
    hosted = {}
    for platform, provider in HOSTED_PLATFORMS:
        process = subprocess.Popen(
            [venv_python if os.path.exists(venv_python) else sys.executable,
             os.path.join(ROOT, "Tests", "Fixtures", "hosted-platforms", "serve.py"), platform],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        started = json.loads(process.stdout.readline())
        for g in range(1, hosted_users + 1):
            urllib.request.urlopen(urllib.request.Request(
                started["url"] + "/_fake/users", method="POST",
                data=json.dumps({"email": f"{platform}{g}@example.com", "apple_sub": f"{platform}-sub-{g}",
                                 "sessions": 1}).encode())).read()
        credentials = hosted_credentials(platform, started)
        path = os.path.join(workdir, f"{platform}-credentials")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            json.dump(credentials, f)
        hosted[platform] = (process, provider, path)
    adapter_url_file = os.path.join(workdir, "auth-adapter-url")
    with open(os.open(adapter_url_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(cluster.url("outbox_auth") + "\n")
    changes = f"""
        INSERT INTO siwa.changes (type, sub, event_time, applied_at, jti, audience, sessions_revoked)
        SELECT 'siwa.consent_revoked', 'ob-sub-' || (g % {subs}), now(), now(), 'ob-' || g || '-TAG', '{AUDIENCE}', 1
          FROM generate_series(1, {events}) g"""
    consumers = [
        ("webhooks", events, ["--webhook-concurrency", "8"],
         f"SELECT siwa.add_webhook_endpoint('{base}/hooks', '{secret}', NULL, 16)",
         changes.replace("TAG", "w"), "SELECT count(*) FROM siwa.webhook_deliveries WHERE state = 'pending'",
         "SELECT siwa.set_webhook_endpoint_enabled(1, false)"),
        ("Shared Signals push", events, ["--ssf-key-file", ssf_key, "--ssf-issuer", "https://bench.example",
                                 "--ssf-concurrency", "8"],
         f"SELECT siwa.add_ssf_stream('bench', 'https://rp.example', '{base}/ssf'); "
         "UPDATE siwa.ssf_streams SET max_in_flight = 16",
         changes.replace("TAG", "s"), "SELECT count(*) FROM siwa.ssf_events WHERE state = 'pending'",
         "SELECT siwa.set_ssf_stream_status(1, 'disabled')"),
        ("suppression outbox (SendGrid)", suppressions, ["--suppressions", "sendgrid", "--sendgrid-key-file", sendgrid_key,
                                           "--sendgrid-api-url", base],
         "INSERT INTO siwa.suppression_providers (name, kind) VALUES ('sendgrid', 'sendgrid')",
         f"""INSERT INTO siwa.suppression_outbox (provider, sub, event, action, address, address_key)
             SELECT 'sendgrid', 'ob-sup-' || g, 'email-disabled', 'add', a, siwa.mail_address_key(a)
               FROM generate_series(1, {suppressions}) g, LATERAL (SELECT 'ob' || g || '@privaterelay.appleid.com' AS a) x""",
         "SELECT count(*) FROM siwa.suppression_outbox WHERE state = 'pending'", None),
        ("auth adapter (Supabase)", adapter_users, ["--auth-adapters", "on"],
         f"SELECT siwa.add_auth_adapter('bench', 'supabase', 'apple', 'file:{adapter_url_file}')",
         f"""INSERT INTO siwa.changes (type, sub, event_time, applied_at, jti, audience, sessions_revoked)
             SELECT 'siwa.consent_revoked', 'ad-sub-' || g, now(), now(), 'ad-' || g, '{AUDIENCE}', 1
               FROM generate_series(1, {adapter_users}) g""",
         "SELECT count(*) FROM siwa.auth_adapter_events WHERE state = 'pending'",
         "SELECT siwa.remove_auth_adapter('bench')"),
    ] + [
        (f"auth adapter ({platform}, fake)", hosted_users, ["--auth-adapters", "on"],
         f"SELECT siwa.add_auth_adapter('bench-{platform}', '{platform}', '{provider}', 'file:{path}')",
         f"""INSERT INTO siwa.changes (type, sub, event_time, applied_at, jti, audience, sessions_revoked)
             SELECT 'siwa.consent_revoked', '{platform}-sub-' || g, now(), now(), '{platform}-' || g,
                    '{AUDIENCE}', 1
               FROM generate_series(1, {hosted_users}) g""",
         "SELECT count(*) FROM siwa.auth_adapter_events WHERE state = 'pending'",
         f"SELECT siwa.remove_auth_adapter('bench-{platform}')")
        for platform, (_, provider, path) in hosted.items()
    ]
    found = {}
    try:
        for name, rows, flags, setup, seed, pending, teardown in consumers:
            peer = next((process for platform, (process, _, _) in hosted.items() if f"({platform}," in name),
                        endpoint)
            cluster.psql(db, setup)
            cluster.psql(db, seed)
            cluster.psql(db, "VACUUM ANALYZE")
            idle_children = cluster.child_count()
            pg_before = cluster.cpu_seconds(settle_to=idle_children)
            endpoint_before = process_cpu_seconds(peer.pid)
            started = time.monotonic()
            worker = subprocess.Popen(
                [binaries["siwa-worker"], "--database-url", cluster.url(db), "--log-level", "error"] + flags,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                wait_until(lambda: cluster.psql(db, pending) == "0", f"{name}: every row finished", timeout=900,
                           interval=0.1)
                elapsed = time.monotonic() - started
                worker_cpu = process_cpu_seconds(worker.pid)
            finally:
                worker.send_signal(signal.SIGTERM)
                worker.wait(timeout=30)
            pg_cpu = cluster.cpu_seconds(settle_to=idle_children) - pg_before
            found[name] = {"rows": rows, "seconds": elapsed, "per_second": rows / elapsed,
                           "worker_us": per_row_us(worker_cpu, rows), "postgres_us": per_row_us(pg_cpu, rows),
                           "endpoint_us": per_row_us(process_cpu_seconds(peer.pid) - endpoint_before, rows)}
            if teardown:
                cluster.psql(db, teardown)
    finally:
        for process in [endpoint] + [process for process, _, _ in hosted.values()]:
            process.terminate()
            process.wait()
    return found


def print_outbox(found, pgq):
    if not found:
        return
    print("Outboxes (each consumer of one siwa-worker alone against the same fast keep-alive endpoint: webhooks "
          "and Shared Signals 8 lanes, suppressions one lane per provider; each auth adapter's one lane against "
          "Supabase Auth's tables in the same cluster, or a hosted platform's fake, whose CPU is the endpoint's; CPU µs per "
          "row from /proc)")
    for name, r in found.items():
        ratio = f" = {r['postgres_us'] / pgq['postgres_us_per_event']:.1f}× PgQueuer's per job" if pgq else ""
        print(f"  {name:<30} {r['per_second']:>7.0f} rows/s ({r['rows']:,} in {r['seconds']:.1f} s); worker "
              f"{r['worker_us']:.0f} µs, PostgreSQL {r['postgres_us']:.0f} µs{ratio}, endpoint {r['endpoint_us']:.0f} µs")
    if pgq:
        print(f"  PgQueuer (reference): {pgq['events_per_second']:.0f} no-op jobs/s, {pgq['processes']} processes, "
              f"PostgreSQL {pgq['postgres_us_per_event']:.1f} µs/job")


def webhook_connections_opened(metrics_port):
    """The worker's siwa_webhook_connections_opened_total (None from a worker without it)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    match = re.search(r"^siwa_webhook_connections_opened_total (\d+)$", text, re.MULTILINE)
    return int(match.group(1)) if match else None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=8, help="duration of each load run")
    parser.add_argument("--tokens", type=int, default=60000, help="distinct pre-signed notifications")
    parser.add_argument("--sweep", default="1,8,64,256", help="connection counts for the sweep")
    parser.add_argument("--prefill-rows", "--prefill", dest="prefill", type=int, default=1_000_000,
                        help="rows already stored for the table-size run (not with --quick; 0 skips it), "
                             "e.g. 10000000 for the 10-million-row measurement")
    parser.add_argument("--quick", action="store_true", help="only the 64-connection runs (no sweep, no prefill)")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--only", choices=["ingest", "drain", "webhooks", "idle", "prefilled", "mailgate", "outbox"],
                        help="run only this part (ingest: at 64 connections, with its references; idle: the "
                        "idle receive → applied latency; prefilled: the receiver at 64 connections on an empty "
                        "database, on one with --prefill-rows stored, and on an empty one again)")
    parser.add_argument("--drain-events", type=int, default=100_000, help="notifications each drain applies")
    parser.add_argument("--worker-before", help="with --only drain: also drain the same signed rows with this "
                        "siwa-worker binary from before stored-token verification (given no key options)")
    parser.add_argument("--repeat", type=int, default=1, help="with --only drain: drains per lane count")
    parser.add_argument("--pgqueuer-jobs", type=int, help="no-op jobs PgQueuer drains (default: --drain-events)")
    parser.add_argument("--no-pgqueuer", action="store_true", help="skip the PgQueuer reference")
    parser.add_argument("--bin-path", default=os.path.join(ROOT, ".build", "release"),
                        help="the directory of the binaries to measure (make bench: those built as make dist "
                        "builds them, --static-swift-stdlib)")
    args = parser.parse_args()
    # Stopped by SIGTERM (kill, timeout), still stop the cluster and remove the directories (`finally`).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    binaries = binaries_in(args.bin_path)
    for tool in ("psql",) if args.only == "mailgate" else ("wrk", "pgbench", "psql"):
        if not shutil.which(tool):
            sys.exit(f"missing {tool}: apt-get install wrk postgresql-client")

    workdir = tempfile.mkdtemp(prefix="siwa-bench-")
    os.chmod(workdir, 0o755)
    cluster = Cluster(tempfile.mkdtemp(prefix="siwa-bench-pg-"))
    fake_apple = None
    results = {"machine": {"cores": os.cpu_count()}, "ingest": {}, "drain": {}, "idle": {}, "webhooks": {}}
    try:
        if args.only == "mailgate":  # needs no keys, tokens or Apple
            log("relay-mail gate: policy at 200 connections, HTTP bulk")
            results["mailgate"] = mailgate(cluster, binaries, workdir)
            finish(results, args.json, lambda: print_mailgate(results["mailgate"]))
            return
        keys = os.path.join(workdir, "keys")
        kid = keygen(binaries["siwactl"], keys)
        fake_apple, jwks_url = start_fake_apple(binaries["siwactl"], keys)
        bodies = os.path.join(workdir, "bodies.jsonl")
        log(f"pre-signing {args.tokens:,} distinct notifications")
        sign(binaries["siwa-bench"], keys, kid, AUDIENCE, args.tokens, bodies)

        rows = os.path.join(workdir, "drain-rows.tsv")
        if args.only in (None, "drain"):
            log(f"signing the drain's {args.drain_events:,} notifications")
            drain_rows(binaries["siwa-bench"], keys, kid, AUDIENCE, args.drain_events, rows)
        results["rsa_verify_us"] = rsa_verify_us()
        if args.only == "drain":
            before = dict(binaries, **{"siwa-worker": args.worker_before}) if args.worker_before else None
            for run in range(1, args.repeat + 1):
                for workers in (1, 2):
                    if before:
                        log(f"drain {args.drain_events:,} signed events, {workers} lane(s), before (run {run})")
                        results["drain"][f"{workers} before #{run}"] = drain(
                            cluster, before, workers, events=args.drain_events, rows=rows)
                    log(f"drain {args.drain_events:,} signed events, {workers} lane(s), verifying (run {run})")
                    results["drain"][f"{workers} verifying #{run}"] = drain(
                        cluster, binaries, workers, events=args.drain_events, rows=rows, jwks_url=jwks_url)
            if not args.no_pgqueuer:
                results["pgqueuer"] = run_pgqueuer(cluster, args)
            finish(results, args.json, lambda: print_drain(results))
            return
        if args.only == "webhooks":
            log("webhooks: throughput and lag")
            results["webhooks"] = webhooks(cluster, binaries, jwks_url, bodies)
            print_webhooks(results["webhooks"])
            return
        if args.only == "outbox":
            log("outboxes: each consumer against the same fast endpoint")
            results["outbox"] = outbox(cluster, binaries, workdir)
            if not args.no_pgqueuer:
                results["pgqueuer"] = run_pgqueuer(cluster, args)
            finish(results, args.json, lambda: print_outbox(results["outbox"], results.get("pgqueuer")))
            return
        if args.only == "idle":
            log("idle end-to-end latency")
            results["idle"] = idle_latency(cluster, binaries, jwks_url, bodies)
            finish(results, args.json, lambda: print_idle(results["idle"]), with_targets=False)
            return
        if args.only == "prefilled":
            results["prefilled"] = prefilled_ingest(cluster, binaries, jwks_url, bodies, workdir, args.prefill,
                                                    args.seconds)
            finish(results, args.json, lambda: print_prefilled(results["prefilled"]))
            return
        if args.only == "ingest":
            log("ingest at 64 connections")
            results["ingest"]["64"] = ingest(cluster, binaries, jwks_url, bodies, workdir, 64, args.seconds)
            finish(results, args.json, lambda: print_ingest(results))
            return
        sweep = [64] if args.quick else [int(c) for c in args.sweep.split(",")]
        for connections in sweep:
            log(f"ingest at {connections} connections")
            results["ingest"][str(connections)] = ingest(cluster, binaries, jwks_url, bodies, workdir, connections,
                                                         args.seconds)
        if not args.quick and args.prefill:
            log(f"ingest at 64 connections with {args.prefill:,} rows already stored")
            results["prefill_rows"] = args.prefill
            results["ingest"]["64, table prefilled"] = ingest(
                cluster, binaries, jwks_url, bodies, workdir, 64, args.seconds, prefill=args.prefill)
        for workers in (1, 2):
            log(f"drain {args.drain_events:,} events with {workers} lane(s), one siwa-worker process")
            results["drain"][str(workers)] = drain(cluster, binaries, workers, events=args.drain_events, rows=rows,
                                                   jwks_url=jwks_url)
        if not args.no_pgqueuer:
            results["pgqueuer"] = run_pgqueuer(cluster, args)
        log("idle end-to-end latency")
        results["idle"] = idle_latency(cluster, binaries, jwks_url, bodies)
        log("webhooks: throughput and lag")
        results["webhooks"] = webhooks(cluster, binaries, jwks_url, bodies)
        log("relay-mail gate: policy at 200 connections, HTTP bulk")
        results["mailgate"] = mailgate(cluster, binaries, workdir)
    finally:
        if fake_apple:
            fake_apple.terminate()
            fake_apple.wait()
        try:
            cluster.stop()
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(cluster.root, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)

    results["targets"] = targets(results)
    print_table(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


def finish(results, json_path, print_part, with_targets=True):
    """Ends a `--only` run: the targets it measured, the part's table, the targets' table, the JSON."""
    if with_targets:
        results["targets"] = targets(results)
    print_part()
    if with_targets:
        print()
        print_targets(results["targets"])
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=2)


def run_pgqueuer(cluster, args):
    jobs = args.pgqueuer_jobs or args.drain_events
    log(f"PgQueuer: drain {jobs:,} no-op jobs, 2 processes, batches of {BATCH}")
    return pgqueuer_drain(cluster, jobs)


def print_drain(results):
    rsa = results.get("rsa_verify_us")
    pgq = results.get("pgqueuer")
    print()
    print(f"Drain of signed notifications, one siwa-worker process with 1 or 2 lanes; RSA-2048 verify reference "
          f"(openssl speed, one core): {rsa:.1f} µs" if rsa else
          "Drain of signed notifications (no openssl speed reference)")
    print(f"{'lanes':>18} {'events/s':>9} {'÷ PgQueuer':>11} {'worker µs/event':>16} {'÷ RSA verify':>13} "
          f"{'PostgreSQL µs/event':>20} {'applied':>8} {'left':>6}")
    for name, r in results["drain"].items():
        ratio = r["worker_us_per_event"] / rsa if rsa else float("nan")
        vs_pgq = r["events_per_second"] / pgq["events_per_second"] if pgq else float("nan")
        print(f"{name:>18} {r['events_per_second']:>9.0f} {vs_pgq:>11.2f} {r['worker_us_per_event']:>16.1f} "
              f"{ratio:>13.2f} {r['postgres_us_per_event']:>20.1f} {r['applied']:>8} {r['left_pending']:>6}")
    print_pgqueuer(pgq)


def print_pgqueuer(pgq):
    if not pgq:
        return
    print(f"  PgQueuer (reference): {pgq['events_per_second']:.0f} no-op jobs/s, {pgq['processes']} processes, "
          f"batches of {pgq['batch']} ({pgq['done']:,} in {pgq['seconds']:.1f} s from the first pick to the last "
          f"completion, {pgq['seconds_with_startup']:.1f} s with the interpreters' start-up; {pgq['left']} left; "
          f"tables {'logged' if pgq['logged'] else 'NOT logged'}); "
          f"PostgreSQL {pgq['postgres_us_per_event']:.1f} µs/job, consumers {pgq['consumers_us_per_event']:.1f} µs/job")


def print_ingest(results):
    print()
    print("Ingest: the receiver (wrk, distinct pre-signed notifications) and the pgbench references at the same "
          "concurrency")
    print("  lean = INSERT … ON CONFLICT DO NOTHING of one row per transaction into a plain (jti text primary key, "
          "payload text) table;")
    print(f"  lean×{BATCH} = {BATCH} rows per statement into the same table (700-byte payloads sent as one array); "
          f"own, own×{BATCH} = siwa.store_notifications with 1 and {BATCH} rows per call")
    print(f"{'connections':>22} {'lean tx/s':>10} {f'lean×{BATCH} rows/s':>16} {'own tx/s':>9} "
          f"{f'own×{BATCH} rows/s':>15} {'receiver rows/s':>16} {'vs lean':>8} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'non-2xx':>8} {'peak RSS MiB':>13} {'rows/commit':>12}")
    for name, r in results["ingest"].items():
        print(f"{name:>22} {r['lean_tps']:>10.0f} {r['lean_batch_rows_per_second']:>16.0f} {r['ceiling_tps']:>9.0f} "
              f"{r['own_batch_rows_per_second']:>15.0f} {r['rows_per_second']:>16.0f} {r['lean_ratio']:>8.2f} "
              f"{r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['non_2xx'] + r['socket_errors']:>8} "
              f"{r['peak_rss_mib']:>13.1f} {r.get('rows_per_commit', 0):>12.1f}")
    print()
    print("CPU per stored notification, µs (/proc utime+stime over the measured window ÷ rows stored in it; "
          "PostgreSQL: this cluster's processes only)")
    print(f"{'connections':>22} {'receiver':>9} {'PostgreSQL':>11} {'wrk':>7} {'PG lean':>8} {f'PG lean×{BATCH}':>11} "
          f"{'PG own':>8} {f'PG own×{BATCH}':>10}")
    for name, r in results["ingest"].items():
        print(f"{name:>22} {r['receiver_us_per_row']:>9.1f} {r['postgres_us_per_row']:>11.1f} "
              f"{r['wrk_us_per_row']:>7.1f} {r['lean_postgres_us_per_row']:>8.1f} "
              f"{r['lean_batch_postgres_us_per_row']:>11.1f} {r['ceiling_postgres_us_per_row']:>8.1f} "
              f"{r['own_batch_postgres_us_per_row']:>10.1f}")


def targets(results):
    """The issue's targets, each a ratio to a reference measured in this run (or an absolute bound), as
    dicts: what, the value, the comparison and target, whether it is met, and from which figures."""
    found = []

    def add(name, value, comparison, target, unit, basis):
        met = value <= target if comparison == "≤" else value >= target
        found.append({"measure": name, "value": value, "comparison": comparison, "target": target, "unit": unit,
                      "met": met, "basis": basis})

    gate = results.get("mailgate")
    if gate:
        add("HTTP bulk check, 10,000 addresses per call", gate["bulk_addresses_per_second"], "≥", 50_000,
            " addresses/s", f"÷ plain indexed lookup {gate['plain_addresses_per_second']:,.0f} addresses/s = "
            f"{gate['bulk_ratio']:.2f}×")
    rsa = results.get("rsa_verify_us")
    r64 = results["ingest"].get("64")
    if r64 and rsa:
        add("receiver CPU per notification ÷ one RSA-2048 verification", r64["receiver_us_per_row"] / rsa, "≤", 3, "×",
            f"{r64['receiver_us_per_row']:.1f} µs ÷ {rsa:.1f} µs (openssl speed rsa2048)")
    if r64:
        add(f"PostgreSQL CPU per stored notification ÷ per row of the lean {BATCH}-row batch",
            r64["postgres_us_per_row"] / r64["lean_batch_postgres_us_per_row"], "≤", 2, "×",
            f"{r64['postgres_us_per_row']:.1f} µs ÷ {r64['lean_batch_postgres_us_per_row']:.1f} µs")
        add("ingest at 64 connections ÷ the lean single-row INSERT … ON CONFLICT ceiling", r64["lean_ratio"], "≥", 1.5,
            "×", f"{r64['rows_per_second']:,.0f} rows/s ÷ {r64['lean_tps']:,.0f} tx/s")
    pgq = results.get("pgqueuer")
    two = [r for name, r in results["drain"].items() if r.get("lanes") == 2 and "before" not in name]
    if pgq and two:
        rate = two[0]["events_per_second"]
        add(f"worker drain, real effects, 2 lanes ÷ PgQueuer no-op drain, 2 processes, batches of {BATCH}",
            rate / pgq["events_per_second"], "≥", 3, "×",
            f"{rate:,.0f} events/s (one siwa-worker, --concurrency 2) ÷ {pgq['events_per_second']:,.0f} jobs/s")
    hooks = results.get("webhooks")
    if hooks and pgq:
        add("PostgreSQL CPU per webhook delivery ÷ PgQueuer's per no-op job", hooks["postgres_us"]
            / pgq["postgres_us_per_event"], "≤", 3, "×",
            f"{hooks['postgres_us']:.0f} µs ÷ {pgq['postgres_us_per_event']:.1f} µs")
        per_process = pgq["events_per_second"] / pgq["processes"]
        add("webhook deliveries/s (8 lanes) ÷ PgQueuer's no-op jobs/s per process", hooks["per_second"] / per_process,
            "≥", 2, "×", f"{hooks['per_second']:,.0f} deliveries/s ÷ {per_process:,.0f} jobs/s")
    if hooks:
        add("webhook deliveries/s to one fast keep-alive endpoint, 8 lanes", hooks["per_second"], "≥", 3000,
            " deliveries/s", f"{hooks['delivered']:,} in {hooks['seconds']:.1f} s")
    if r64:
        add("p99 at 64 connections", r64["p99_ms"], "≤", 15, " ms", "wrk --latency")
        add("receiver peak RSS at 64 connections", r64["peak_rss_mib"], "≤", 32, " MiB", "VmHWM")
        add("non-2xx answers and socket errors at 64 connections", r64["non_2xx"] + r64["socket_errors"], "≤", 0, "",
            "wrk")
    stored = results["ingest"].get("64, table prefilled")
    if r64 and stored:
        add(f"ingest at 64 connections with {results['prefill_rows']:,} rows stored ÷ empty",
            stored["rows_per_second"] / r64["rows_per_second"], "≥", 0.9, "×",
            f"{stored['rows_per_second']:,.0f} ÷ {r64['rows_per_second']:,.0f} rows/s")
    prefilled = results.get("prefilled")
    if prefilled:
        runs = prefilled["runs"]
        add(f"ingest at {prefilled['connections']} connections with {prefilled['rows_stored']:,} rows stored ÷ empty",
            prefilled["ratio"], "≥", 0.9, "×",
            f"{runs['stored']['rows_per_second']:,.0f} ÷ mean of {runs['empty']['rows_per_second']:,.0f} and "
            f"{runs['empty again']['rows_per_second']:,.0f} rows/s")
    idle = results.get("idle")
    if idle:
        add("idle receive → applied p50", idle["applied_p50_ms"], "≤", 5, " ms", "applied_at − received_at")
    return found


def print_targets(found):
    if not found:
        return
    print("Targets (each reference measured in this run)")
    width = max(len(t["measure"]) for t in found)
    print(f"  {'measure':<{width}} {'value':>9} {'target':>9}  status  from")
    for t in found:
        value = (f"{t['value']:.2f}×" if t["unit"] == "×" else f"{t['value']:.0f}" if not t["unit"]
                 else f"{t['value']:.1f}{t['unit']}")
        target = f"{t['comparison']} {t['target']}{t['unit']}"
        print(f"  {t['measure']:<{width}} {value:>9} {target:>9}  {'met' if t['met'] else 'MISSED':<6}  {t['basis']}")


def print_table(results):
    print_ingest(results)
    print()
    print("Worker drain (queued events, one siwa-worker --once process with 1 or 2 lanes; CPU µs per applied event "
          "from /proc and the worker's rusage)")
    for workers, r in results["drain"].items():
        print(f"{workers:>3} lane(s): {r['events_per_second']:>9.0f} events/s  ({r['seconds']:.1f} s, "
              f"{r['left_pending']} left pending)  worker {r['worker_us_per_event']:.1f} µs/event, "
              f"PostgreSQL {r['postgres_us_per_event']:.1f} µs/event")
        print(f"{'':>12}queue: {r['queue_updates']} updates, {r['queue_hot_updates']} HOT, "
              f"{r['queue_deletes']} deletes; log: {r['log_updates']} updates, {r['log_hot_updates']} HOT")
    print_pgqueuer(results.get("pgqueuer"))
    print()
    print_idle(results["idle"])
    print()
    print_webhooks(results["webhooks"])
    print()
    print_mailgate(results.get("mailgate"))
    print()
    print_targets(results["targets"])


GATE_ACCOUNTS = 100_000
GATE_TOKEN = "bench-token-0123456789abcdefghijklmnopqrstuvwxyz"


def mailgate(cluster, binaries, workdir, connections=200, seconds=5, bulk_calls=20):
    """siwa-mailgate on a database of GATE_ACCOUNTS relay addresses (a quarter forwarding off): policy
    decisions/s and latency at `connections` concurrent connections (cache off, then the default 5 s), the
    HTTP bulk check's addresses/s at 10,000 per call, and the plain reference: the same 10,000 addresses
    looked up in one query on the same index (siwa.mail_address_key), no decision made."""
    import random
    import threading
    db = "mailgate"
    cluster.create_database(db)
    cluster.psql(db, f"""
        INSERT INTO siwa.accounts (sub, email, is_private_email, email_status, email_status_at)
        SELECT 'bench.' || g, 'u' || g || '@privaterelay.appleid.com', true,
               CASE WHEN g % 4 = 0 THEN 'disabled' ELSE 'enabled' END, now() - interval '1 day'
          FROM generate_series(1, {GATE_ACCOUNTS}) g;
        DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'bench_mail') THEN
            CREATE ROLE bench_mail LOGIN IN ROLE siwa_mail; END IF; END $$;""")
    cluster.psql(db, "VACUUM ANALYZE siwa.accounts")
    rng = random.Random(33)
    pool = [f"u{rng.randint(1, GATE_ACCOUNTS * 5 // 4)}@privaterelay.appleid.com" for _ in range(10_000)]
    token_file = os.path.join(workdir, "mailgate-token")
    with open(token_file, "w") as handle:
        handle.write(GATE_TOKEN)
    os.chmod(token_file, 0o600)
    # The reference: one query looking the 10,000 addresses up on the index the gate's function uses.
    literal = "'{" + ",".join(pool) + "}'::text[]"  # one array value, as the gate sends its parameter
    plain = (f"SELECT count(a.email_status) FROM unnest({literal}) WITH ORDINALITY AS u(address, ord) "
             "LEFT JOIN LATERAL (SELECT email_status FROM siwa.accounts WHERE siwa.mail_address_key(email) = "
             "siwa.mail_address_key(u.address) LIMIT 1) a ON true;\n")
    script = os.path.join(workdir, "plain.sql")
    with open(script, "w") as handle:
        # Without JIT, as the gate's function runs: compiling costs more than the lookup itself.
        handle.write("SET jit = off;\n" + plain * (bulk_calls + 1))
    started = time.monotonic()
    subprocess.run(cluster.psql_command(db) + ["-f", script], check=True, stdout=subprocess.DEVNULL)
    plain_rate = 10_000 * (bulk_calls + 1) / (time.monotonic() - started)
    # The decision function alone, in psql (what of the gate's time is the database's).
    with open(script, "w") as handle:
        handle.write(f"SELECT count(decision) FROM siwa.relay_mail_decisions({literal});\n" * (bulk_calls + 1))
    started = time.monotonic()
    subprocess.run(cluster.psql_command(db) + ["-f", script], check=True, stdout=subprocess.DEVNULL)
    function_rate = 10_000 * (bulk_calls + 1) / (time.monotonic() - started)

    results = {"accounts": GATE_ACCOUNTS, "connections": connections, "plain_addresses_per_second": plain_rate,
               "function_addresses_per_second": function_rate}
    for ttl in ("0", "5"):
        addresses_file = os.path.join(workdir, f"mailgate-{ttl}.addresses")
        process = subprocess.Popen(
            [binaries["siwa-mailgate"], "--policy-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
             "--http-token-file", token_file, "--cache-ttl", ttl, "--log-level", "warning",
             "--listen-address-file", addresses_file],
            env=dict(os.environ, SIWA_MAILGATE_DATABASE_URL=cluster.url(db, "bench_mail")),
            stderr=subprocess.DEVNULL)
        try:
            wait_until(lambda: os.path.exists(addresses_file), "siwa-mailgate's listen address file")
            with open(addresses_file) as handle:
                listeners = dict(line.split() for line in handle if line.strip())
            host, port = listeners["policy"].rsplit(":", 1)
            latencies, errors, lock = [], [0], threading.Lock()
            barrier = threading.Barrier(connections + 1)
            deadline = [0.0]

            def client(index):
                mine = []
                sock = socket.create_connection((host, int(port)))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                reader = sock.makefile("rb")
                barrier.wait()
                n = index
                while time.monotonic() < deadline[0]:
                    address = pool[n % len(pool)]
                    n += 7
                    began = time.monotonic()
                    sock.sendall(f"request=smtpd_access_policy\nprotocol_state=RCPT\nrecipient={address}\n\n"
                                 .encode())
                    line = reader.readline()
                    reader.readline()
                    mine.append(time.monotonic() - began)
                    if not line.startswith(b"action="):
                        with lock:
                            errors[0] += 1
                sock.close()
                with lock:
                    latencies.extend(mine)

            threads = [threading.Thread(target=client, args=(i,)) for i in range(connections)]
            for thread in threads:
                thread.start()
            deadline[0] = time.monotonic() + seconds
            began = time.monotonic()
            barrier.wait()
            for thread in threads:
                thread.join()
            elapsed = time.monotonic() - began
            latencies.sort()
            results[f"policy_ttl_{ttl}"] = {
                "decisions_per_second": len(latencies) / elapsed, "p50_ms": percentile(latencies, 50) * 1000,
                "p99_ms": percentile(latencies, 99) * 1000, "errors": errors[0]}
            if ttl == "0":
                body = json.dumps({"addresses": pool}).encode()
                url = f"http://{listeners['http']}/v1/relay-mail/decisions"
                headers = {"Authorization": f"Bearer {GATE_TOKEN}", "Content-Type": "application/json"}

                def call():
                    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
                    with urllib.request.urlopen(request, timeout=30) as answer:
                        rows = json.loads(answer.read())["decisions"]
                    assert len(rows) == 10_000 and rows[0]["address"] == pool[0]
                call()
                started = time.monotonic()
                for _ in range(bulk_calls):
                    call()
                results["bulk_addresses_per_second"] = 10_000 * bulk_calls / (time.monotonic() - started)
        finally:
            process.terminate()
            process.wait(timeout=30)
    results["bulk_ratio"] = results["bulk_addresses_per_second"] / plain_rate
    results["policy_ratio"] = results["policy_ttl_0"]["decisions_per_second"] / plain_rate
    return results


def print_mailgate(gate):
    if not gate:
        return
    print(f"Relay-mail gate ({gate['accounts']:,} relay addresses, a quarter forwarding off; Python clients)")
    for ttl in ("0", "5"):
        p = gate[f"policy_ttl_{ttl}"]
        print(f"  policy, {gate['connections']} connections, --cache-ttl {ttl}: {p['decisions_per_second']:,.0f} "
              f"decisions/s, p50 {p['p50_ms']:.2f} ms, p99 {p['p99_ms']:.2f} ms, {p['errors']} errors")
    print(f"  HTTP bulk, 10,000 per call: {gate['bulk_addresses_per_second']:,.0f} addresses/s = "
          f"{gate['bulk_ratio']:.2f}× the plain indexed lookup ({gate['plain_addresses_per_second']:,.0f} addresses/s "
          f"in one query); policy without cache = {gate['policy_ratio']:.2f}× it")
    print(f"  siwa.relay_mail_decisions alone, in psql: {gate['function_addresses_per_second']:,.0f} addresses/s")


def print_idle(idle):
    print("Idle end-to-end latency (200 notifications, one at a time)")
    print(f"  receive → applied: p50 {idle['applied_p50_ms']:.2f} ms, p99 {idle['applied_p99_ms']:.2f} ms")
    print(f"  HTTP round trip:   p50 {idle['http_p50_ms']:.2f} ms, p99 {idle['http_p99_ms']:.2f} ms")


def print_webhooks(w):
    if not w:
        return
    print(f"Webhooks ({w['changes']:,} changes of {w['subs']:,} users, one worker with 8 webhook lanes, endpoint "
          "max_in_flight 16, siwactl webhooks listen verifying each)")
    print(f"  throughput: {w['per_second']:.0f} deliveries/s ({w['delivered']:,} in {w['seconds']:.1f} s); CPU per "
          f"delivery: worker {w['worker_us']:.0f} µs, PostgreSQL {w['postgres_us']:.0f} µs, listener "
          f"{w['listener_us']:.0f} µs")
    if w.get("connections_opened") is not None:
        print(f"  connections opened by the worker: {w['connections_opened']:,} "
              f"({w['connections_opened'] / max(1, w['delivered']):.4f} per delivery)")
    print(f"  idle lag, change applied → webhook acknowledged: p50 {w['lag_p50_ms']:.2f} ms, "
          f"p99 {w['lag_p99_ms']:.2f} ms")
    if w["end_to_end_p50_ms"] is not None:
        print(f"  idle lag, Apple's POST received → webhook acknowledged: p50 {w['end_to_end_p50_ms']:.2f} ms, "
              f"p99 {w['end_to_end_p99_ms']:.2f} ms")
    else:
        print("  Apple's POST → webhook: not measured (the worker does not write siwa.changes on this branch)")


if __name__ == "__main__":
    try:
        main()
    except WaitTimeout as error:
        sys.exit(str(error))
