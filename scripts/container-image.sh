#!/usr/bin/env bash
# Builds the container image lease-sweeper:<version> without any registry and
# proves it under a real Docker engine. Not part of CI; run it as root after
# changing anything the image depends on:
#
#   scripts/container-image.sh
#
# The image: the static musl binary that scripts/static-binary.sh builds with
# cargo on this host (`--build-only`), copied into `FROM scratch` through a
# generated two-line context. Nothing is pulled: no base image, no Rust image.
# (The repository's multi-stage Dockerfile builds the same image on a
# builder that can pull rust:1.94-bookworm; this script does not need it.)
#
# The proof, against a throwaway PostgreSQL 15 on loopback with TLS
# (sslmode=verify-full, the CA file mounted read-only) and a StatsD listener
# on loopback, each container with --read-only, no capabilities,
# no-new-privileges and --network host:
#   - `migrate` as the owner role (as a Kubernetes Job would), uid 65534;
#   - `check` as the LOGIN member role the docs create, the image's own user;
#   - `run` as uid 65534: exactly N lease_expired lines in `docker logs` for
#     N abandoned leases, N lock.lease.expired counts on the listener;
#   - `docker stop` ends it with exit code 0 (`docker inspect`), well inside
#     the 10 s stop timeout, after sweeper_stopped.
# It prints each check, the image size and a summary, exits 0 only when every
# check passed, and removes everything it started except the image.
#
# dockerd: used when running; otherwise started here with
#   dockerd --bridge=none --iptables=false --ip6tables=false --ip-forward=false
# and stopped on exit. The containers use the host's network, so they need
# no bridge, no NAT rules and no IP forwarding; with its defaults dockerd
# also works here, but it would leave a docker0 bridge, DOCKER iptables
# chains, a FORWARD policy of DROP and net.ipv4.ip_forward=1 on the host
# after it stops. These flags change nothing outside /var/lib/docker. `docker build` uses the classic builder (DOCKER_BUILDKIT=0): buildx
# is not needed for a context of two files.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"

N=4 # leases abandoned while the container runs
VERSION=$(awk -F'"' '/^version *=/ {print $2; exit}' Cargo.toml)
IMAGE="lease-sweeper:$VERSION"
PG_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
PSQL=$(command -v psql || echo "$PG_BIN/psql")
export DOCKER_BUILDKIT=0

say() { printf '==> %s\n' "$*"; }
die() { printf 'ERROR: %s\n' "$*" >&2; exit 2; }

[ "$(id -u)" = 0 ] || die "run as root (it may start dockerd and starts PostgreSQL as postgres)"
for tool in docker openssl python3 runuser; do
    command -v "$tool" >/dev/null || die "$tool is missing"
done
[ -n "$PG_BIN" ] && [ -x "$PG_BIN/postgres" ] || die "PostgreSQL server binaries missing (apt-get install postgresql)"

WORK=$(mktemp -d /tmp/lease-sweeper-image.XXXXXX)
chmod 0755 "$WORK" # PostgreSQL (user postgres) keeps its cluster in here
DOCKERD_PID=""
STATSD_PID=""
PG_STARTED=""
CONTAINERS=()
cleanup() {
    set +e
    for c in "${CONTAINERS[@]}"; do docker rm -f "$c" >/dev/null 2>&1; done
    [ -n "$PG_STARTED" ] && runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$WORK/pgdata" -m immediate stop >/dev/null 2>&1
    [ -n "$STATSD_PID" ] && kill "$STATSD_PID" 2>/dev/null && wait "$STATSD_PID" 2>/dev/null
    if [ -n "$DOCKERD_PID" ]; then
        kill -TERM "$DOCKERD_PID" 2>/dev/null
        for _ in $(seq 1 50); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.2; done
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

PASSED=0
FAILED=0
ok() { PASSED=$((PASSED + 1)); printf 'ok    %s\n' "$*"; }
bad() { FAILED=$((FAILED + 1)); printf 'FAIL  %s\n' "$*"; }
expect() { if [ "$2" = "$3" ]; then ok "$1: $2"; else bad "$1: got '$2', want '$3'"; fi; }
wait_for() {
    local deadline=$(($(date +%s) + $1))
    shift
    until "$@"; do
        [ "$(date +%s)" -lt "$deadline" ] || return 1
        sleep 0.2
    done
}
free_port() {
    python3 - "$1" <<'PY'
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM if sys.argv[1] == "tcp" else socket.SOCK_DGRAM)
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
PY
}

# ---- 1. the static binary ------------------------------------------------------------
say "static musl binary (scripts/static-binary.sh --build-only)"
scripts/static-binary.sh --build-only
BIN="$(realpath -m "${CARGO_TARGET_DIR:-target}")/x86_64-unknown-linux-musl/release/lease-sweeper"
[ -x "$BIN" ] || die "no binary at $BIN"

# ---- 2. dockerd ----------------------------------------------------------------------
if docker info >/dev/null 2>&1; then
    say "dockerd is running"
else
    say "starting dockerd --bridge=none --iptables=false --ip6tables=false --ip-forward=false"
    dockerd --bridge=none --iptables=false --ip6tables=false --ip-forward=false >"$WORK/dockerd.log" 2>&1 &
    DOCKERD_PID=$!
    docker_up() { docker info >/dev/null 2>&1; }
    wait_for 60 docker_up || die "dockerd did not come up: $(tail -n 20 "$WORK/dockerd.log")"
fi
say "docker: client $(docker version -f '{{.Client.Version}}'), engine $(docker version -f '{{.Server.Version}}')"

# ---- 3. the image --------------------------------------------------------------------
mkdir "$WORK/context"
cp "$BIN" "$WORK/context/lease-sweeper"
cat >"$WORK/context/Dockerfile" <<EOF
# Generated by scripts/container-image.sh: the final stage of the repository's
# Dockerfile, with the binary built on the host instead of in a build stage.
FROM scratch
COPY lease-sweeper /lease-sweeper
# 65532: the conventional "nonroot" uid/gid (distroless); no home, no shell.
USER 65532:65532
STOPSIGNAL SIGTERM
LABEL org.opencontainers.image.title="lease-sweeper" \\
      org.opencontainers.image.version="$VERSION" \\
      org.opencontainers.image.licenses="MIT OR Apache-2.0"
ENTRYPOINT ["/lease-sweeper", "run"]
EOF
say "docker build -t $IMAGE"
docker build -q -t "$IMAGE" "$WORK/context" >/dev/null
size=$(docker image inspect -f '{{.Size}}' "$IMAGE")
ok "image $IMAGE built: $size bytes ($((size / 1024)) KiB, $(awk -v s="$size" 'BEGIN {printf "%.1f", s / 1048576}') MiB)"
expect "layers" "$(docker image inspect -f '{{len .RootFS.Layers}}' "$IMAGE")" 1
expect "entrypoint" "$(docker image inspect -f '{{json .Config.Entrypoint}}' "$IMAGE")" '["/lease-sweeper","run"]'
expect "user" "$(docker image inspect -f '{{.Config.User}}' "$IMAGE")" 65532:65532
expect "--version in the image" "$(docker run --rm --read-only --network none --entrypoint /lease-sweeper "$IMAGE" --version)" "lease-sweeper $VERSION"

# ---- 4. a throwaway PostgreSQL with TLS, and a StatsD listener ---------------------------
PG_PORT=$(free_port tcp)
STATSD_PORT=$(free_port udp)
say "PostgreSQL on localhost:$PG_PORT (TLS only), StatsD listener on 127.0.0.1:$STATSD_PORT"
(
    cd "$WORK"
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj '/CN=lease-sweeper image test CA' \
        -addext 'basicConstraints=critical,CA:TRUE' -addext 'keyUsage=critical,keyCertSign,cRLSign' \
        -keyout ca.key -out ca.pem 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj '/CN=localhost' -keyout server.key -out server.csr 2>/dev/null
    printf '%s\n' 'subjectAltName=DNS:localhost' 'basicConstraints=critical,CA:FALSE' \
        'keyUsage=critical,digitalSignature,keyEncipherment' 'extendedKeyUsage=serverAuth' >server.ext
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
        -extfile server.ext -out server.crt 2>/dev/null
    chmod 0644 ca.pem
)
install -d -o postgres -g postgres -m 0700 "$WORK/pgdata"
install -d -o postgres -g postgres -m 0755 "$WORK/pgsock"
runuser -u postgres -- "$PG_BIN/initdb" -D "$WORK/pgdata" -U postgres -A peer >"$WORK/initdb.log" 2>&1 \
    || { cat "$WORK/initdb.log"; die "initdb failed"; }
install -o postgres -g postgres -m 0600 "$WORK/server.key" "$WORK/pgdata/server.key"
install -o postgres -g postgres -m 0644 "$WORK/server.crt" "$WORK/pgdata/server.crt"
cat >"$WORK/pgdata/pg_hba.conf" <<'HBA'
local   all  postgres                peer
hostssl all  all       127.0.0.1/32  scram-sha-256
hostssl all  all       ::1/128       scram-sha-256
HBA
chown postgres:postgres "$WORK/pgdata/pg_hba.conf"
runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$WORK/pgdata" -l "$WORK/pgdata/postgres.log" -w -t 60 \
    -o "-p $PG_PORT -k $WORK/pgsock -c listen_addresses=localhost -c ssl=on -c ssl_cert_file=server.crt -c ssl_key_file=server.key" \
    start >/dev/null || die "PostgreSQL did not start: $(tail -n 20 "$WORK/pgdata/postgres.log")"
PG_STARTED=yes
psql_admin() { runuser -u postgres -- "$PSQL" -h "$WORK/pgsock" -p "$PG_PORT" -X -q -v ON_ERROR_STOP=1 "$@"; }
OWNER_PW='owner-pw'
SWEEPER_PW='sweeper-pw'
psql_admin -d postgres <<SQL
CREATE ROLE locks_owner LOGIN CREATEROLE PASSWORD '$OWNER_PW';
CREATE DATABASE locks OWNER locks_owner;
SQL

python3 -u - "$STATSD_PORT" "$WORK/statsd.txt" <<'PY' &
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", int(sys.argv[1])))
with open(sys.argv[2], "a", buffering=1) as out:
    while True:
        data, _ = s.recvfrom(65535)
        out.write(data.decode("utf-8", "replace").rstrip("\n") + "\n")
PY
STATSD_PID=$!
touch "$WORK/statsd.txt"
statsd_expired() {
    awk -F'[:|]' '$1 == "lock.lease.expired" && $3 == "c" { n += $2 } END { print n + 0 }' "$WORK/statsd.txt"
}

TLS_QUERY="sslmode=verify-full&sslrootcert=/etc/lease-sweeper/db-ca.pem"
# What every container gets: read-only root, no capabilities, no privilege
# gain, the host's network (loopback PostgreSQL and StatsD), the CA read-only.
SANDBOX=(--read-only --cap-drop ALL --security-opt no-new-privileges --network host
    -v "$WORK/ca.pem:/etc/lease-sweeper/db-ca.pem:ro")

# ---- 5. migrate and check through the image -------------------------------------------
say "docker run … migrate (owner role, uid 65534)"
docker run --rm "${SANDBOX[@]}" --user 65534:65534 --entrypoint /lease-sweeper \
    -e LOCKDB_URL="postgres://locks_owner:$OWNER_PW@localhost:$PG_PORT/locks?$TLS_QUERY" \
    "$IMAGE" migrate >"$WORK/migrate.log" 2>&1 && code=0 || code=$?
expect "migrate exit status" "$code" 0
[ "$code" = 0 ] || cat "$WORK/migrate.log"
psql_admin -d locks -c "CREATE ROLE sweeper_lock_server LOGIN PASSWORD '$SWEEPER_PW' IN ROLE lease_sweeper"
SWEEPER_URL="postgres://sweeper_lock_server:$SWEEPER_PW@localhost:$PG_PORT/locks?$TLS_QUERY"

say "docker run … check (LOGIN member of lease_sweeper, the image's user 65532)"
docker run --rm "${SANDBOX[@]}" --entrypoint /lease-sweeper \
    -e LOCKDB_URL="$SWEEPER_URL" -e STATSD_HOST=127.0.0.1 -e STATSD_PORT="$STATSD_PORT" \
    "$IMAGE" check >"$WORK/check.log" 2>&1 && code=0 || code=$?
expect "check exit status" "$code" 0
expect "check verdict" "$(grep -c '^check passed: all' "$WORK/check.log")" 1
[ "$code" = 0 ] || cat "$WORK/check.log"

# ---- 6. run, sweep, stop ---------------------------------------------------------------
NAME="lease-sweeper-image-test-$$"
say "docker run -d --read-only --user 65534:65534 --network host $IMAGE"
docker run -d --name "$NAME" "${SANDBOX[@]}" --user 65534:65534 --stop-timeout 10 \
    -e LOCKDB_URL="$SWEEPER_URL" -e STATSD_HOST=127.0.0.1 -e STATSD_PORT="$STATSD_PORT" \
    "$IMAGE" >/dev/null
CONTAINERS+=("$NAME")
logs_count() { docker logs "$NAME" 2>&1 | grep -c -- "$1" || true; }
started() { [ "$(logs_count 'message=sweeper_started')" -ge 1 ]; }
wait_for 30 started || bad "no sweeper_started within 30 s"
host_pid=$(docker inspect -f '{{.State.Pid}}' "$NAME")
expect "the daemon's uid and gid" "$(awk '/^Uid:/ {u=$2} /^Gid:/ {g=$2} END {print u ":" g}' "/proc/$host_pid/status")" 65534:65534
expect "the daemon is PID 1 in its container" "$(awk '/^NSpid:/ {print $NF}' "/proc/$host_pid/status")" 1

say "abandoning $N leases (lock_acquire, TTL 300 ms)"
sql=""
for i in $(seq 1 "$N"); do sql+="SELECT lock_acquire('image:$i', 'image-worker-$i', 300);"; done
PGPASSWORD="$OWNER_PW" "$PSQL" -X -q -v ON_ERROR_STOP=1 -o /dev/null \
    "postgres://locks_owner@localhost:$PG_PORT/locks?sslmode=verify-full&sslrootcert=$WORK/ca.pem" -c "$sql"
leases_left() { psql_admin -d locks -At -c "SELECT count(*) FROM lock_entry"; }
swept() { [ "$(logs_count 'level=warn message=lease_expired')" -ge "$N" ] && [ "$(leases_left)" = 0 ]; }
wait_for 30 swept || true
expect "lease_expired lines in docker logs" "$(logs_count 'level=warn message=lease_expired')" "$N"
expect "leases left" "$(leases_left)" 0
counted() { [ "$(statsd_expired)" -ge "$N" ]; }
wait_for 10 counted || true
expect "lock.lease.expired counted by the StatsD listener" "$(statsd_expired)" "$N"
expect "sweep_failed lines" "$(logs_count 'message=sweep_failed')" 0
expect "state before stop" "$(docker inspect -f '{{.State.Status}}' "$NAME")" running
ok "resident memory after the sweep: $(awk '/^VmRSS:/ {printf "%.1f MiB", $2 / 1024}' "/proc/$host_pid/status")"

say "docker stop"
t0=$(date +%s%N)
docker stop "$NAME" >/dev/null
took=$((($(date +%s%N) - t0) / 1000000))
expect "exit code after docker stop" "$(docker inspect -f '{{.State.ExitCode}}' "$NAME")" 0
expect "OOM-killed" "$(docker inspect -f '{{.State.OOMKilled}}' "$NAME")" false
if [ "$took" -lt 10000 ]; then ok "docker stop took $took ms (SIGTERM handled; SIGKILL comes at 10 s)"; else bad "docker stop took $took ms: SIGKILL, not a drain"; fi
expect "shutdown_requested signal=SIGTERM" "$(logs_count 'message=shutdown_requested signal=SIGTERM')" 1
expect "sweeper_stopped" "$(logs_count 'message=sweeper_stopped')" 1
echo "--- docker logs $NAME (signal lines and lifecycle) ---"
docker logs "$NAME" 2>&1 | grep -E 'message=(starting|sweeper_started|lease_expired|shutdown_requested|sweeper_stopped)' | sed 's/^/    /'

echo
say "image $IMAGE: $size bytes ($(awk -v s="$size" 'BEGIN {printf "%.1f", s / 1048576}') MiB)"
if [ "$FAILED" = 0 ]; then
    say "PASS: $PASSED checks passed, 0 failed"
    exit 0
fi
say "FAILED: $FAILED of $((PASSED + FAILED)) checks failed"
exit 1
