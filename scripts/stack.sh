# Shared by scripts/demo and scripts/run (sourced, not executed): a local stack of PostgreSQL (an
# embedded cluster under .siwa/ unless SIWA_DATABASE_URL points elsewhere), a stand-in for Apple's key
# endpoint (siwactl fake-apple), siwa-receiver and siwa-worker. Everything started is stopped on exit.
#
# The state (cluster, keys, logs) lives in $SIWA_STATE_DIR if set, else in .siwa/ of the checkout. As
# root the cluster runs as the postgres user, who often cannot reach a checkout under a private home
# (/root is mode 700); then the state lives in /var/tmp/siwa-demo-<hash of the checkout's path>, owned by
# postgres and mode 700, and .siwa is a symbolic link to it, so every path below .siwa/ still works.

: "${BIN:?BIN must name the directory holding the built executables}"

fail() {
  echo "$*" >&2
  exit 1
}

# A state directory outside the checkout must be ours: a real directory (not a link) owned by postgres
# and writable by nobody else, so another local user cannot have planted it in the shared /var/tmp.
check_private_state() {
  local dir=$1
  [[ -d $dir && ! -L $dir ]] || fail "$dir is not a directory; remove it or set SIWA_STATE_DIR"
  [[ $(stat -c %U "$dir") == postgres ]] ||
    fail "$dir belongs to $(stat -c %U "$dir"), not postgres; remove it or set SIWA_STATE_DIR"
  [[ $(stat -c %a "$dir") == 700 ]] || fail "$dir is not mode 700; remove it or set SIWA_STATE_DIR"
}

choose_state_dir() {
  STATE_NOTE=
  if [[ -n ${SIWA_STATE_DIR:-} ]]; then
    STATE=$SIWA_STATE_DIR
    return
  fi
  STATE=$PWD/.siwa
  [[ $(id -u) -eq 0 && -z ${SIWA_DATABASE_URL:-} ]] || return 0
  if [[ -L $STATE ]]; then # set up by an earlier run
    STATE=$(readlink "$STATE")
    check_private_state "$STATE"
    STATE_NOTE="(.siwa links there: the postgres user cannot reach $PWD)"
    return
  fi
  runuser -u postgres -- test -x "$PWD" 2>/dev/null && return 0
  local private
  private=/var/tmp/siwa-demo-$(printf '%s' "$PWD" | sha256sum | cut -c1-12)
  if [[ ! -e $private && ! -L $private ]]; then
    mkdir -m 700 "$private" # fails if someone else created it meanwhile
    chown postgres:postgres "$private"
  fi
  check_private_state "$private"
  if [[ -d $STATE ]]; then # left by an earlier run that stopped at the postgres user's access
    [[ ! -e $STATE/pgdata ]] || fail "$STATE holds a cluster the postgres user cannot reach; set SIWA_STATE_DIR"
    find "$STATE" -mindepth 1 -maxdepth 1 -exec mv -t "$private" {} +
    rmdir "$STATE"
  fi
  ln -s "$private" "$STATE"
  STATE=$private
  STATE_NOTE="(.siwa links there: the postgres user cannot reach $PWD)"
}

choose_state_dir
AUDIENCE=${SIWA_DEMO_AUDIENCE:-com.example.siwa.demo}
TEAM_ID=DEMOTEAM01
KEY_ID=DEMOKEY001
# No port is chosen here: every listener binds port 0 and the address it got is read back from its
# --listen-address-file (one 'NAME HOST:PORT' line per listener, written once all listen). PostgreSQL
# cannot do that, so the local cluster has no TCP listener at all: a unix socket in $STATE only.
STARTED_PIDS=()
STARTED_CLUSTER=

bold() { printf '\n\033[1m%s\033[0m\n' "$*"; }

stack_stop() {
  local pid
  for pid in "${STARTED_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${STARTED_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  STARTED_PIDS=()
  if [[ -n $STARTED_CLUSTER ]]; then pg_tool pg_ctl -D "$STATE/pgdata" -m fast -w stop >/dev/null || true; fi
  STARTED_CLUSTER=
}

# Runs a PostgreSQL server tool, as the postgres user when we are root (PostgreSQL refuses root).
pg_tool() {
  local tool=$1
  shift
  local bindir
  bindir=$(pg_config --bindir 2>/dev/null)
  [[ -x $bindir/$tool ]] || bindir=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
  if [[ $(id -u) -eq 0 ]]; then
    (cd / && runuser -u postgres -- "$bindir/$tool" "$@")
  else
    "$bindir/$tool" "$@"
  fi
}

stack_database() {
  if [[ -n ${SIWA_DATABASE_URL:-} ]]; then
    echo "database: SIWA_DATABASE_URL (not managed here)"
    return
  fi
  mkdir -p "$STATE"
  echo "state (cluster, keys, logs): $STATE $STATE_NOTE"
  if [[ $(id -u) -eq 0 ]]; then
    chown postgres "$STATE"
    runuser -u postgres -- test -w "$STATE" 2>/dev/null ||
      fail "the postgres user cannot write $STATE (a parent directory is private); set SIWA_STATE_DIR"
  fi
  if [[ ! -f $STATE/pgdata/PG_VERSION ]]; then
    echo "creating a local PostgreSQL cluster in $STATE/pgdata"
    pg_tool initdb -D "$STATE/pgdata" -U postgres -A trust -E UTF8 --locale=C >/dev/null
  fi
  if ! pg_tool pg_ctl -D "$STATE/pgdata" status >/dev/null 2>&1; then
    # No TCP (listen_addresses=''): the socket in $STATE, a directory of our own, under PostgreSQL's
    # default number.
    pg_tool pg_ctl -D "$STATE/pgdata" -l "$STATE/postgresql.log" -w \
      -o "-c listen_addresses='' -k $STATE" start >/dev/null
    STARTED_CLUSTER=1
  fi
  # The socket's number as the running server reports it (postmaster.pid's fourth line): also right for
  # a cluster left running by an earlier run, whatever it was started with.
  PG_PORT=$(sed -n 4p "$STATE/pgdata/postmaster.pid")
  [[ $PG_PORT =~ ^[0-9]+$ ]] || fail "cannot read the cluster's port from $STATE/pgdata/postmaster.pid"
  export SIWA_DATABASE_URL="postgresql://postgres@/postgres?host=$STATE&port=$PG_PORT"
  echo "database: local cluster in $STATE (socket), $SIWA_DATABASE_URL"
}

# Waits until the process PID has written its --listen-address-file FILE; fails if it exits first.
wait_listening() {
  local file=$1 pid=$2 what=$3 i
  for i in $(seq 1 400); do
    [[ -s $file ]] && return 0
    kill -0 "$pid" 2>/dev/null || fail "$what exited before listening; see its log in $STATE"
    sleep 0.05
  done
  fail "timed out waiting for $what to listen"
}

# The address (HOST:PORT) listener NAME bound, from a --listen-address-file.
listen_address() {
  local file=$1 name=$2 address
  address=$(awk -v name="$name" '$1 == name { print $2 }' "$file")
  [[ -n $address ]] || fail "$file names no '$name' listener"
  printf '%s\n' "$address"
}

# Starts the command after "--" in the background (its listeners on port 0) with --listen-address-file
# $STATE/NAME.addresses and stderr to $STATE/NAME.log, and waits until it listens; LAST_PID is its pid.
start_listening() {
  local name=$1
  shift 2
  rm -f "$STATE/$name.addresses"
  "$@" --listen-address-file "$STATE/$name.addresses" 2>"$STATE/$name.log" &
  LAST_PID=$!
  STARTED_PIDS+=("$LAST_PID")
  wait_listening "$STATE/$name.addresses" "$LAST_PID" "$name"
}

# Stops one process started here (SIGTERM, then waits for it).
stop_started() {
  local pid=$1 kept=() other
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  for other in "${STARTED_PIDS[@]}"; do [[ $other == "$pid" ]] || kept+=("$other"); done
  STARTED_PIDS=("${kept[@]}")
}

wait_http() {
  local url=$1 i
  for i in $(seq 1 200); do
    if curl -fsS -o /dev/null "$url" 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  echo "timed out waiting for $url" >&2
  return 1
}

stack_start() {
  trap stack_stop EXIT
  stack_database
  "$BIN/siwactl" migrate
  if [[ ! -f $STATE/keys/jwks.json ]]; then
    mkdir -p "$STATE"
    "$BIN/siwactl" keygen --out "$STATE/keys" >/dev/null
  fi
  KID=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["keys"][0]["kid"])' "$STATE/keys/jwks.json")
  # The other half of the lifecycle: a team key (.p8) for client secrets, the refresh-token encryption
  # keys and the sign-in API's bearer token, each owner-only.
  (
    umask 077
    [[ -f $STATE/AuthKey_$KEY_ID.p8 ]] ||
      openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$STATE/AuthKey_$KEY_ID.p8" 2>/dev/null
    openssl pkey -in "$STATE/AuthKey_$KEY_ID.p8" -pubout -out "$STATE/team-public.pem" 2>/dev/null
    [[ -f $STATE/token-keys ]] || printf 'demo1 %s\n' "$(head -c 32 /dev/urandom | base64)" >"$STATE/token-keys"
    [[ -f $STATE/signin-token ]] || head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$STATE/signin-token"
  )
  # Apple and the receiver each need the other's address: fake Apple starts first (port 0) without
  # --notify-url, the receiver (port 0) with Apple's address, then fake Apple again on the port the kernel
  # gave it, now told where to POST its consent-revoked notifications.
  local fake_apple=("$BIN/siwactl" fake-apple --keys "$STATE/keys" --team-id "$TEAM_ID" --key-id "$KEY_ID"
    --team-key "$STATE/team-public.pem" --client-id "$AUDIENCE")
  start_listening fake-apple -- "${fake_apple[@]}" --listen 127.0.0.1:0 >/dev/null
  local apple_pid=$LAST_PID apple_address
  apple_address=$(listen_address "$STATE/fake-apple.addresses" apple)
  APPLE_URL="http://$apple_address"
  local apple=(--apple-team-id "$TEAM_ID" --apple-key-id "$KEY_ID" --apple-key-file "$STATE/AuthKey_$KEY_ID.p8"
    --apple-url "$APPLE_URL" --token-key-file "$STATE/token-keys")
  # The demo connects everything as the database's owner; a deployment gives the receiver and its
  # sign-in API a login each (siwa_receiver, siwa_signin; docs/operations.md § 3).
  start_listening receiver -- "$BIN/siwa-receiver" --listen 127.0.0.1:0 --audience "$AUDIENCE" \
    --jwks-url "$APPLE_URL/auth/keys" --signin-listen 127.0.0.1:0 \
    --signin-database-url "$SIWA_DATABASE_URL" \
    --signin-token-file "$STATE/signin-token" "${apple[@]}"
  RECEIVER_URL="http://$(listen_address "$STATE/receiver.addresses" notifications)"
  NOTIFY_URL="$RECEIVER_URL/apple/notifications"
  SIGNIN_URL="http://$(listen_address "$STATE/receiver.addresses" signin)"
  stop_started "$apple_pid"
  start_listening fake-apple -- "${fake_apple[@]}" --listen "$apple_address" --notify-url "$NOTIFY_URL" \
    >/dev/null
  wait_http "$APPLE_URL/auth/keys"
  "$BIN/siwa-worker" "${apple[@]}" --client-id "$AUDIENCE" --jwks-url "$APPLE_URL/auth/keys" \
    --revocation-poll-interval 0.5 2>"$STATE/worker.log" &
  STARTED_PIDS+=($!)
  wait_http "$RECEIVER_URL/readyz"
  echo "fake Apple:      $APPLE_URL (keys, token, revoke; kid $KID)"
  echo "receiver:        $NOTIFY_URL (audience $AUDIENCE); logs in $STATE/*.log"
  echo "sign-in API:     $SIGNIN_URL (bearer token in $STATE/signin-token)"
}

sql() { psql "$SIWA_DATABASE_URL" -v ON_ERROR_STOP=1 -qX "$@"; }
