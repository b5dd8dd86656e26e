# shellcheck shell=bash
# Shared plumbing of the end-to-end scripts (scripts/container-image.sh,
# scripts/systemd-e2e.sh) and the rule and dashboard checks
# (scripts/check-prometheus-rules.sh, scripts/check-dashboard.sh): messages,
# the check counters, polling, free loopback ports, a StatsD listener on
# loopback and a test CA made with openssl. Sourced, never run; it defines
# functions and the counters only, starts nothing by itself, and owns no
# check: each script says what it proves. It does not start PostgreSQL: one
# script runs it with pg_ctl, the other as a transient unit inside its
# systemd, which share no steps.

say() { printf '==> %s\n' "$*"; }
die() { printf 'ERROR: %s\n' "$*" >&2; exit 2; }

# The newest PostgreSQL server binaries' directory, or empty.
pg_bin_dir() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }

# ---- checks -----------------------------------------------------------------------
PASSED=0
FAILED=0
ok() { PASSED=$((PASSED + 1)); printf 'ok    %s\n' "$*"; }
bad() { FAILED=$((FAILED + 1)); printf 'FAIL  %s\n' "$*"; }
# expect NAME ACTUAL WANTED
expect() {
    if [ "$2" = "$3" ]; then ok "$1: $2"; else bad "$1: got '$2', want '$3'"; fi
}
# summary: prints the verdict; returns 0 when every check passed, else 1 (the
# caller may print what explains a failure before it exits).
summary() {
    if [ "$FAILED" = 0 ]; then
        say "PASS: $PASSED checks passed, 0 failed"
        return 0
    fi
    say "FAILED: $FAILED of $((PASSED + FAILED)) checks failed"
    return 1
}

# wait_for SECONDS COMMAND...: polls until COMMAND succeeds; 1 on timeout.
wait_for() {
    local deadline=$(($(date +%s) + $1))
    shift
    until "$@"; do
        [ "$(date +%s)" -lt "$deadline" ] || return 1
        sleep 0.2
    done
}

free_port() { # $1: tcp or udp
    python3 - "$1" <<'PY'
import socket, sys
kind = socket.SOCK_STREAM if sys.argv[1] == "tcp" else socket.SOCK_DGRAM
s = socket.socket(socket.AF_INET, kind)
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
PY
}

# ---- a StatsD listener on loopback ------------------------------------------------
# start_statsd PORT FILE: appends every line received on 127.0.0.1:PORT/udp
# to FILE (created at once); sets STATSD_PID and STATSD_FILE. The caller's
# clean-up calls stop_statsd.
start_statsd() {
    STATSD_FILE=$2
    python3 -u - "$1" "$STATSD_FILE" <<'PY' &
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", int(sys.argv[1])))
with open(sys.argv[2], "a", buffering=1) as out:
    while True:
        data, _ = s.recvfrom(65535)
        out.write(data.decode("utf-8", "replace").rstrip("\n") + "\n")
PY
    STATSD_PID=$!
    touch "$STATSD_FILE"
}
stop_statsd() {
    [ -n "${STATSD_PID:-}" ] && kill "$STATSD_PID" 2>/dev/null && wait "$STATSD_PID" 2>/dev/null
}
# Sum of lock.lease.expired counts received so far.
statsd_expired() {
    awk -F'[:|]' '$1 == "lock.lease.expired" && $3 == "c" { n += $2 } END { print n + 0 }' "$STATSD_FILE"
}

# ---- a test CA and a server certificate for `localhost` ---------------------------
# make_test_ca DIR CN: in DIR, ca.pem (0644, CN=CN) and server.crt/server.key
# that it signed for DNS:localhost only (RSA 2048, 2 days).
make_test_ca() {
    (
        cd "$1"
        openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=$2" \
            -addext 'basicConstraints=critical,CA:TRUE' -addext 'keyUsage=critical,keyCertSign,cRLSign' \
            -keyout ca.key -out ca.pem 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -subj '/CN=localhost' -keyout server.key -out server.csr 2>/dev/null
        printf '%s\n' 'subjectAltName=DNS:localhost' 'basicConstraints=critical,CA:FALSE' \
            'keyUsage=critical,digitalSignature,keyEncipherment' 'extendedKeyUsage=serverAuth' >server.ext
        openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
            -extfile server.ext -out server.crt 2>/dev/null
        chmod 0644 ca.pem
    )
}
