#!/usr/bin/env bash
# The Debian package's unit under a real systemd, against a real PostgreSQL.
# Not part of CI (it boots a service manager and installs a package); run it
# as root on Debian 12 after changing the unit, the package metadata or
# anything the daemon does at start or stop:
#
#   scripts/systemd-e2e.sh [path/to/lease-sweeper_*.deb]
#
# Without an argument it builds the package with `cargo deb` (crates.io:
# `cargo install cargo-deb --locked`).
#
# How: systemd runs as PID 1 of its own PID, mount, UTS and IPC namespaces
# (`unshare --pid --mount --uts --ipc --fork --mount-proc`, `container=other`),
# booted into a minimal target (journald and the D-Bus socket, which
# `systemd-run --pipe` needs as on any Debian host; the host's
# multi-user.target would start its PostgreSQL, Docker and so on). The file system is the
# host's, so before systemd starts, private tmpfs are mounted on /tmp,
# /var/tmp and /run (systemd-tmpfiles empties /tmp at boot) and on
# /etc/lease-sweeper and /etc/systemd/system (the env file, `systemctl enable`
# and drop-ins written here must not land on the host).
# The network is the host's loopback. Inside, the script installs the .deb
# with dpkg (its maintainer scripts talk to this systemd), starts a throwaway
# PostgreSQL 15 as a transient unit (user postgres, TLS with a certificate
# from a test CA made here, socket in /run/postgresql), migrates it and
# creates a LOGIN role exactly as docs/operations.md tells an operator, and
# proves, printing one line per check:
#
#   - the package installs the unit neither enabled nor started, and the unit
#     refuses to start without /etc/lease-sweeper/env;
#   - the preflight command of docs/operations.md (step 4) passes;
#   - Type=notify reaches active/running, as a dynamic (non-root) user;
#   - the watchdog is fed (WatchdogTimestamp advances; NRestarts stays 0 over
#     more than WatchdogSec, shortened to 3 s by a drop-in);
#   - N abandoned leases give exactly N lease_expired lines in the journal and
#     N lock.lease.expired counts on a StatsD listener on loopback, through
#     TLS (sslmode=verify-full, the CA file read by the dynamic user), DNS
#     (the database named `localhost`) and then through the Unix socket;
#   - 100,000 leases expiring at once give exactly 100,000 lease_expired lines
#     in the journal under journald's stock rate limit (the unit's
#     LogRateLimit* settings), and journald suppresses no message of the unit
#     in the whole run;
#   - `systemctl stop` ends in Result=success, exit status 0;
#   - a SIGKILLed daemon is restarted (NRestarts increments);
#   - a wedged daemon (SIGSTOP: no more WATCHDOG=1) is killed by the watchdog
#     and restarted;
#   - a CA file under a 0700 directory is unreadable for the dynamic user
#     (sweep_failed: Permission denied), which is why /etc/lease-sweeper is 0755;
#   - exit status 2 (a malformed LOCKDB_URL) is not restarted;
#   - reinstalling the package restarts a running daemon (try-restart);
#   - purging the package stops the daemon and removes the unit.
#
# It exits 0 only when every check passed. On exit it kills the namespace
# (systemd, PostgreSQL and the daemon with it), removes its temp dirs and the
# cgroups systemd made, and purges the package unless it was installed before.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"

UNIT=lease-sweeper.service
N_TLS=5    # leases abandoned while the daemon connects over TLS
N_SOCKET=3 # ... and while it connects over the Unix socket
# Leases expiring at once: ten times journald's default burst, and above what
# its free-space scaling can raise the default to (six times at 1 TB free).
N_BURST=100000
# shellcheck source=scripts/lib/e2e.sh
. scripts/lib/e2e.sh
PG_BIN=$(pg_bin_dir)

[ "$(id -u)" = 0 ] || die "run as root (it boots systemd in its own namespaces and installs a package)"
[ -x /usr/bin/dbus-daemon ] || die "dbus-daemon is missing (apt-get install dbus)"
for tool in unshare nsenter dpkg openssl python3; do
    command -v "$tool" >/dev/null || die "$tool is missing"
done
[ -x /lib/systemd/systemd ] || die "/lib/systemd/systemd is missing (apt-get install systemd)"
[ -n "$PG_BIN" ] && [ -x "$PG_BIN/postgres" ] || die "PostgreSQL server binaries missing (apt-get install postgresql)"

# ---- the package ------------------------------------------------------------------
DEB="${1:-}"
if [ -z "$DEB" ]; then
    command -v cargo-deb >/dev/null || die "cargo-deb is missing: cargo install cargo-deb --locked (or pass a .deb)"
    say "cargo deb"
    cargo deb --locked >/dev/null
    DEB=$(ls -t "${CARGO_TARGET_DIR:-target}"/debian/lease-sweeper_*.deb | head -n 1)
fi
DEB=$(realpath "$DEB")
[ -f "$DEB" ] || die "no package at $DEB"
say "package: $DEB"

# ---- state and clean-up -----------------------------------------------------------
# Not under /tmp or /var/tmp: the namespace covers those, and its commands
# read this directory too.
TARGET_DIR="${CARGO_TARGET_DIR:-$REPO/target}"
mkdir -p "$TARGET_DIR"
WORK=$(mktemp -d "$(realpath "$TARGET_DIR")/systemd-e2e.XXXXXX")
UNSHARE_PID=""
SD_PID=""
ETC_CREATED=""
WAS_INSTALLED=""
dpkg-query -W -f='${Status}' lease-sweeper 2>/dev/null | grep -q 'install ok installed' && WAS_INSTALLED=yes
find /sys/fs/cgroup -mindepth 1 -type d 2>/dev/null | sort >"$WORK/cgroups.before" || true

cleanup() {
    set +e
    if [ -n "$SD_PID" ] && kill -0 "$SD_PID" 2>/dev/null; then
        # PID 1 of the namespace: the kernel kills everything in it with it
        # (the daemon, PostgreSQL, journald).
        kill -KILL "$SD_PID"
    fi
    [ -n "$UNSHARE_PID" ] && wait "$UNSHARE_PID" 2>/dev/null
    stop_statsd
    # Cgroups systemd created for its units (empty now), deepest first.
    find /sys/fs/cgroup -mindepth 1 -type d 2>/dev/null | sort >"$WORK/cgroups.after"
    comm -13 "$WORK/cgroups.before" "$WORK/cgroups.after" | sort -r | while read -r dir; do
        rmdir "$dir" 2>/dev/null
    done
    if [ -z "$WAS_INSTALLED" ] && dpkg-query -W -f='${Status}' lease-sweeper 2>/dev/null | grep -q installed; then
        dpkg --purge lease-sweeper >/dev/null 2>&1
    fi
    [ -n "$ETC_CREATED" ] && rmdir /etc/lease-sweeper 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- the namespace ------------------------------------------------------------------
ns() { nsenter -t "$SD_PID" -m -p -u -i -- "$@"; }
prop() { ns systemctl show -p "$1" --value "$UNIT"; }

# ---- a StatsD listener on loopback (outside the namespace: same network) ----------
STATSD_PORT=$(free_port udp)
start_statsd "$STATSD_PORT" "$WORK/statsd.txt"

# ---- a test CA and a server certificate for `localhost` ---------------------------
say "test CA and server certificate (openssl)"
make_test_ca "$WORK" 'lease-sweeper e2e CA'

# ---- boot systemd in its own namespaces -------------------------------------------
if [ ! -d /etc/lease-sweeper ]; then
    mkdir /etc/lease-sweeper # the mount point for the private tmpfs below
    ETC_CREATED=yes
fi
cat >"$WORK/boot.sh" <<'BOOT'
#!/bin/bash
# Runs as PID 1 of the new namespaces until it execs systemd.
set -e
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=1777 tmpfs /var/tmp
# /run holds the volatile journal (below): a fixed size, so journald's limits
# are the same on every host instead of following its RAM (a tmpfs defaults
# to half of it). Only the pages used count.
mount -t tmpfs -o mode=0755,size=2g tmpfs /run
mount -t tmpfs -o mode=0755 tmpfs /etc/lease-sweeper
mount -t tmpfs -o mode=0755 tmpfs /etc/systemd/system
# Debian's container images ship a policy-rc.d that denies every service
# action (exit 101), which would stop the package's maintainer scripts from
# restarting or stopping the unit; a real host has none. Allow everything,
# here only.
if [ -e /usr/sbin/policy-rc.d ]; then mount --bind /bin/true /usr/sbin/policy-rc.d; fi
mkdir -p /run/systemd/system /run/systemd/journald.conf.d
cat >/run/systemd/system/lease-sweeper-e2e.target <<'T'
[Unit]
Description=lease-sweeper e2e: journald and the system bus, nothing else
Wants=systemd-journald.service dbus.socket
After=systemd-journald.service dbus.socket
T
# journald as shipped, except where the journal lives: volatile, on the
# namespace's /run, so nothing lands in the host's journal. The rate limit is
# stated at journald's defaults (30 s, 10,000 lines, scaled up with free
# space) so a host's own journald.conf cannot loosen it: the burst check
# below must measure the unit's LogRateLimit* settings against a stock
# journald. Storage must not drop lines either: RuntimeMaxUse defaults to 10%
# of /run (200 MB here) and past it journald deletes the oldest entries, so
# it is raised to 1 GB, far above what the run writes (72 MB of journal
# after the burst: about 700 bytes an entry with its metadata). The free-space scaling then
# sees about 1 GB available, which gives the default limit 32,500 lines.
cat >/run/systemd/journald.conf.d/e2e.conf <<'J'
[Journal]
Storage=volatile
RateLimitIntervalSec=30s
RateLimitBurst=10000
RuntimeMaxUse=1G
J
exec env -i container=other PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    /lib/systemd/systemd --system --unit=lease-sweeper-e2e.target
BOOT
chmod 0755 "$WORK/boot.sh"
say "booting systemd (unshare --pid --mount --uts --ipc --fork --mount-proc, container=other)"
unshare --pid --mount --uts --ipc --fork --mount-proc --propagation private \
    "$WORK/boot.sh" >"$WORK/systemd.console" 2>&1 &
UNSHARE_PID=$!
wait_for 10 pgrep -P "$UNSHARE_PID" >/dev/null || die "the namespace did not start: $(cat "$WORK/systemd.console")"
SD_PID=$(pgrep -P "$UNSHARE_PID")
booted() {
    local s
    s=$(ns systemctl is-system-running 2>/dev/null) || true
    [ "$s" = running ] || [ "$s" = degraded ]
}
wait_for 30 booted || die "systemd did not finish booting: $(ns systemctl is-system-running 2>&1; cat "$WORK/systemd.console")"
expect "systemd is PID 1 of its namespace" "$(awk '/^NSpid:/ {print $NF}' "/proc/$SD_PID/status")" 1
ok "systemd $(ns systemctl --version | awk 'NR==1 {print $2}') booted: $(ns systemctl is-system-running 2>&1)"

# ---- install the package -----------------------------------------------------------
say "dpkg -i $(basename "$DEB")"
ns dpkg -i "$DEB" >"$WORK/dpkg.log" 2>&1 || { cat "$WORK/dpkg.log"; die "dpkg -i failed"; }
ns /usr/bin/lease-sweeper --version
expect "unit installed at /lib/systemd/system" "$(ns systemctl show -p FragmentPath --value "$UNIT" | sed 's|^/usr/lib/|/lib/|')" "/lib/systemd/system/$UNIT"
expect "ExecStart runs the packaged binary" "$(prop ExecStart | grep -o 'path=[^ ;]*' | head -n 1)" "path=/usr/bin/lease-sweeper"
expect "env example in /usr/share/doc" "$(test -f /usr/share/doc/lease-sweeper/lease-sweeper.env.example && echo present)" present
expect "the package did not enable the unit" "$(ns systemctl is-enabled "$UNIT" 2>&1 || true)" disabled
expect "the package did not start the unit" "$(ns systemctl is-active "$UNIT" 2>&1 || true)" inactive

say "systemctl start without /etc/lease-sweeper/env"
if ns systemctl start "$UNIT" 2>"$WORK/start-noenv.err"; then
    bad "start without configuration: it started"
else
    ok "start without configuration refused: $(tr -s '\n' ' ' <"$WORK/start-noenv.err")"
fi
expect "AssertResult without configuration" "$(prop AssertResult)" no
expect "no daemon ran without configuration" "$(prop ExecMainPID)" 0

# ---- PostgreSQL, the schema and a LOGIN role, as docs/operations.md says ----------
PG_PORT=$(free_port tcp)
PGDATA=/var/tmp/lease-sweeper-e2e/pgdata # the namespace's private /var/tmp
say "PostgreSQL ($PG_BIN) on localhost:$PG_PORT and /run/postgresql, TLS on"
ns install -d -o postgres -g postgres -m 0700 "$PGDATA"
ns install -d -o postgres -g postgres -m 2775 /run/postgresql
ns runuser -u postgres -- "$PG_BIN/initdb" -D "$PGDATA" -U postgres -A peer >"$WORK/initdb.log" 2>&1 \
    || { cat "$WORK/initdb.log"; die "initdb failed"; }
cat >"$WORK/pg_hba.conf" <<'HBA'
# The administrator over the socket; everyone else with a password, and
# over TCP only with TLS (there is no plain `host` line).
local   all  postgres                peer
local   all  all                     scram-sha-256
hostssl all  all       127.0.0.1/32  scram-sha-256
hostssl all  all       ::1/128       scram-sha-256
HBA
ns install -o postgres -g postgres -m 0600 "$WORK/pg_hba.conf" "$PGDATA/pg_hba.conf"
ns install -o postgres -g postgres -m 0600 "$WORK/server.key" "$PGDATA/server.key"
ns install -o postgres -g postgres -m 0644 "$WORK/server.crt" "$PGDATA/server.crt"
ns systemd-run --quiet --unit=e2e-postgresql --property=User=postgres --property=Type=notify \
    --property=TimeoutStartSec=60 \
    "$PG_BIN/postgres" -D "$PGDATA" -p "$PG_PORT" -k /run/postgresql \
    -c listen_addresses=localhost -c ssl=on \
    -c ssl_cert_file=server.crt -c ssl_key_file=server.key \
    || die "PostgreSQL did not start: $(ns journalctl -u e2e-postgresql -o cat --no-pager | tail -n 20)"
ok "PostgreSQL started: $(ns systemctl is-active e2e-postgresql)"
PSQL=$(command -v psql || echo /usr/bin/psql)
psql_admin() { ns runuser -u postgres -- "$PSQL" -h /run/postgresql -p "$PG_PORT" -X -q -v ON_ERROR_STOP=1 "$@"; }

OWNER_PW='owner-pw'
# A password with characters that must be percent-encoded in a URL (the
# example file says so): p@ss:word/1 -> p%40ss%3Aword%2F1.
SWEEPER_PW='p@ss:word/1'
SWEEPER_PW_URL='p%40ss%3Aword%2F1'
psql_admin -d postgres <<SQL
CREATE ROLE locks_owner LOGIN CREATEROLE PASSWORD '$OWNER_PW';
CREATE DATABASE locks OWNER locks_owner;
SQL
# Install step 2: migrate with the owner role, over TLS, verifying the server.
ns install -m 0644 "$WORK/ca.pem" /etc/lease-sweeper/db-ca.pem
TLS_QUERY="sslmode=verify-full&sslrootcert=/etc/lease-sweeper/db-ca.pem"
ns env -i LOCKDB_URL="postgres://locks_owner:$OWNER_PW@localhost:$PG_PORT/locks?$TLS_QUERY" \
    /usr/bin/lease-sweeper migrate >"$WORK/migrate.log" 2>&1 || { cat "$WORK/migrate.log"; die "migrate failed"; }
ok "lease-sweeper migrate as the owner role over TLS: $(grep -o 'message=[a-z_]*' "$WORK/migrate.log" | tr '\n' ' ')"
psql_admin -d locks <<SQL
CREATE ROLE sweeper_host_a LOGIN PASSWORD '$SWEEPER_PW' IN ROLE lease_sweeper;
SQL
ok "CREATE ROLE sweeper_host_a LOGIN ... IN ROLE lease_sweeper"

# abandon PREFIX N: N leases taken by the lock server (the owner role) and
# never renewed, living 300 ms.
abandon() {
    local sql="" i
    for i in $(seq 1 "$2"); do
        sql+="SELECT lock_acquire('$1:$i', 'e2e-worker-$i', 300);"
    done
    ns env PGPASSWORD="$OWNER_PW" "$PSQL" -X -q -v ON_ERROR_STOP=1 -o /dev/null \
        "postgres://locks_owner@localhost:$PG_PORT/locks?sslmode=verify-full&sslrootcert=/etc/lease-sweeper/db-ca.pem" \
        -c "$sql"
}
leases_left() {
    psql_admin -d locks -At -c "SELECT count(*) FROM lock_entry"
}
# journal_count INVOCATION PATTERN
journal_count() {
    { ns journalctl --no-pager -o cat "_SYSTEMD_INVOCATION_ID=$1" || true; } | grep -c -- "$2" || true
}

# ---- the environment file, from the shipped example --------------------------------
# write_env URL: the example with its LOCKDB_URL replaced, StatsD pointed at
# the listener, everything else as shipped.
write_env() {
    local url=${1//&/\\&} # `&` in a sed replacement means "the match"
    sed -e "s|^LOCKDB_URL=.*|LOCKDB_URL=$url|" \
        -e "s|^#STATSD_HOST=.*|STATSD_HOST=127.0.0.1|" \
        -e "s|^#STATSD_PORT=.*|STATSD_PORT=$STATSD_PORT|" \
        /usr/share/doc/lease-sweeper/lease-sweeper.env.example >"$WORK/env"
    ns install -m 0600 -o root -g root "$WORK/env" /etc/lease-sweeper/env
}
TLS_URL="postgres://sweeper_host_a:$SWEEPER_PW_URL@localhost:$PG_PORT/locks?$TLS_QUERY"
SOCKET_URL="postgres://sweeper_host_a:$SWEEPER_PW_URL@localhost:$PG_PORT/locks?host=/run/postgresql"
write_env "$TLS_URL"
expect "/etc/lease-sweeper mode" "$(ns stat -c %a /etc/lease-sweeper)" 755
expect "/etc/lease-sweeper/env mode" "$(ns stat -c '%a %U' /etc/lease-sweeper/env)" "600 root"

# A short watchdog, so "fed" is proven within seconds (the shipped 120 s
# would take minutes to prove). Runtime drop-in: private to the namespace.
ns mkdir -p "/run/systemd/system/$UNIT.d"
printf '[Service]\nWatchdogSec=3s\n' >"$WORK/watchdog.conf"
ns install -m 0644 "$WORK/watchdog.conf" "/run/systemd/system/$UNIT.d/e2e-watchdog.conf"
ns systemctl daemon-reload

# ---- 0. the preflight as docs/operations.md step 4 runs it --------------------------
say "preflight: systemd-run --pipe --wait -p EnvironmentFile=… -p DynamicUser=yes lease-sweeper check"
ns systemd-run --quiet --pipe --wait -p EnvironmentFile=/etc/lease-sweeper/env -p DynamicUser=yes \
    /usr/bin/lease-sweeper check >"$WORK/preflight.log" 2>&1 && code=0 || code=$?
expect "preflight exit status" "$code" 0
expect "preflight verdict" "$(grep -c '^check passed: all' "$WORK/preflight.log")" 1
[ "$code" = 0 ] || cat "$WORK/preflight.log"

# ---- 1. start over TLS + DNS: Type=notify, dynamic user, watchdog ------------------
say "systemctl enable --now $UNIT (TLS verify-full to localhost:$PG_PORT)"
ns systemctl enable --now "$UNIT" 2>"$WORK/enable.err" || { cat "$WORK/enable.err"; bad "systemctl enable --now failed"; }
INV=$(prop InvocationID)
expect "Type" "$(prop Type)" notify
expect "state after start" "$(prop ActiveState)/$(prop SubState)" active/running
expect "status text (READY=1 came)" "$(prop StatusText)" "sweeping expired leases"
MAIN_PID=$(prop MainPID)
# MainPID is a PID of the namespace: read it through the namespace's /proc.
uid=$(ns awk '/^Uid:/ {print $2}' "/proc/$MAIN_PID/status")
if [ -n "$uid" ] && [ "$uid" -ne 0 ]; then
    ok "the daemon runs as a dynamic user: uid $uid ($(ns stat -c %U "/proc/$MAIN_PID"))"
else
    bad "the daemon runs as uid '${uid}', want a dynamic (non-root) uid"
fi
expect "preflight (ExecStartPre check) passed" \
    "$(journal_count "$INV" '^check passed: all')" 1
expect "preflight FAIL lines" "$(journal_count "$INV" '^FAIL')" 0
expect "WatchdogUSec (drop-in)" "$(prop WatchdogUSec)" 3s
wd1=$(prop WatchdogTimestampMonotonic)
restarts0=$(prop NRestarts)
# More than WatchdogSec with the loop running: systemd would have killed an
# unfed daemon (Restart=on-failure would then count a restart).
sleep 7
wd2=$(prop WatchdogTimestampMonotonic)
if [ "$wd2" -gt "$wd1" ]; then ok "watchdog fed: WatchdogTimestamp advanced by $(((wd2 - wd1) / 1000)) ms"; else bad "WatchdogTimestamp did not advance ($wd1 -> $wd2)"; fi
expect "NRestarts after 7 s with WatchdogSec=3s" "$(prop NRestarts)" "$restarts0"
expect "same process after 7 s" "$(prop MainPID)" "$MAIN_PID"

say "abandoning $N_TLS leases (lock_acquire, TTL 300 ms)"
abandon tls "$N_TLS"
swept_tls() { [ "$(journal_count "$INV" 'level=warn message=lease_expired')" -ge "$N_TLS" ] && [ "$(leases_left)" = 0 ]; }
wait_for 30 swept_tls || true
expect "lease_expired lines in the journal (TLS, DNS)" "$(journal_count "$INV" 'level=warn message=lease_expired')" "$N_TLS"
expect "leases left in lock_entry" "$(leases_left)" 0
statsd_at() { [ "$(statsd_expired)" -ge "$1" ]; }
wait_for 10 statsd_at "$N_TLS" || true
expect "lock.lease.expired counted by the StatsD listener" "$(statsd_expired)" "$N_TLS"
expect "sweep_failed lines" "$(journal_count "$INV" 'message=sweep_failed')" 0
expect "systemd_notify_failed lines" "$(journal_count "$INV" 'message=systemd_notify_failed')" 0

# ---- 2. stop ------------------------------------------------------------------------
say "systemctl stop"
ns systemctl stop "$UNIT"
expect "Result after stop" "$(prop Result)" success
expect "exit status after stop" "$(prop ExecMainStatus)" 0
expect "state after stop" "$(prop ActiveState)" inactive
expect "sweeper_stopped logged" "$(journal_count "$INV" 'message=sweeper_stopped')" 1

# ---- 3. the Unix socket -----------------------------------------------------------
say "restart over the Unix socket /run/postgresql"
write_env "$SOCKET_URL"
ns systemctl start "$UNIT" || bad "start over the socket failed"
INV=$(prop InvocationID)
expect "state (socket)" "$(prop ActiveState)/$(prop SubState)" active/running
before=$(statsd_expired)
abandon sock "$N_SOCKET"
swept_sock() { [ "$(journal_count "$INV" 'level=warn message=lease_expired')" -ge "$N_SOCKET" ] && [ "$(leases_left)" = 0 ]; }
wait_for 30 swept_sock || true
expect "lease_expired lines in the journal (Unix socket)" "$(journal_count "$INV" 'level=warn message=lease_expired')" "$N_SOCKET"
wait_for 10 statsd_at $((before + N_SOCKET)) || true
expect "lock.lease.expired counted (Unix socket)" "$(($(statsd_expired) - before))" "$N_SOCKET"
expect "sweep_failed lines (Unix socket)" "$(journal_count "$INV" 'message=sweep_failed')" 0

# ---- 3a. a burst: every line reaches the journal ------------------------------------
# One statement inserts N_BURST leases whose deadline has passed, as if that
# many holders died at once; the running daemon drains them in 5,000-lease
# batches, writing one line per lease as fast as journald takes them.
say "$N_BURST leases expire at once (one INSERT, deadlines already past)"
before=$(statsd_expired)
psql_admin -d locks -c "INSERT INTO lock_entry (lock_key, owner_id, token, acquired_at, expires_at)
    SELECT 'burst-' || g, 'e2e-burst-client/worker-' || (g % 64), nextval('lock_fencing_token_seq'),
           now() - interval '1 minute', now() - interval '1 second'
      FROM generate_series(1, $N_BURST) AS g"
t0=$(date +%s%N)
drained() { [ "$(leases_left)" = 0 ]; }
wait_for 300 drained || true
drain_ms=$((($(date +%s%N) - t0) / 1000000))
expect "leases left after the burst" "$(leases_left)" 0
# Each batch's lines are written before it commits, so all of them are in
# journald's socket by now; --sync returns once journald has stored what it
# had received. The wait covers a journald still reading its socket.
ns journalctl --sync
burst_lines() { journal_count "$INV" 'level=warn message=lease_expired lockKey=burst-'; }
all_lines() { [ "$(burst_lines)" -ge "$N_BURST" ]; }
wait_for 20 all_lines || true
expect "lease_expired lines in the journal for $N_BURST expiries at once" "$(burst_lines)" "$N_BURST"
wait_for 10 statsd_at $((before + N_BURST)) || true
expect "lock.lease.expired counted for the burst" "$(($(statsd_expired) - before))" "$N_BURST"
# The size of a line and journald's pace (reception times of the first and
# last line), figures the unit's comment and docs/operations.md quote.
burst_journal() { { ns journalctl --no-pager -o "$1" "_SYSTEMD_INVOCATION_ID=$INV" || true; } | grep -- 'lockKey=burst-'; }
pace=$(burst_journal short-unix | awk 'NR == 1 { t0 = $1 } { t = $1 }
    END { if (NR > 1 && t > t0) printf "%.0f ms, %.0f lines a second", (t - t0) * 1000, (NR - 1) / (t - t0) }')
line_bytes=$(burst_journal cat | awk '{ n += length($0) + 1 } END { if (NR) printf "%.0f", n / NR }')
usage=$(ns journalctl --disk-usage 2>/dev/null | grep -o 'take up [^ ]*' | cut -d' ' -f3)
ok "burst drained in $drain_ms ms; journald stored it over ${pace:-?}; ${line_bytes:-?} bytes a line with its newline; journal now ${usage:-?}"

# ---- 4. SIGKILL: restarted ------------------------------------------------------------
say "systemctl kill -s SIGKILL (a crash)"
restarts0=$(prop NRestarts)
pid0=$(prop MainPID)
ns systemctl kill -s SIGKILL --kill-who=main "$UNIT"
restarted() { [ "$(prop NRestarts)" -gt "$restarts0" ] && [ "$(prop ActiveState)/$(prop SubState)" = active/running ]; }
wait_for 20 restarted || true
expect "NRestarts after SIGKILL" "$(prop NRestarts)" $((restarts0 + 1))
expect "state after the restart" "$(prop ActiveState)/$(prop SubState)" active/running
if [ "$(prop MainPID)" != "$pid0" ]; then ok "a new process: MainPID $pid0 -> $(prop MainPID)"; else bad "MainPID unchanged ($pid0)"; fi

# ---- 4a. a wedged loop: the watchdog kills and restarts it ----------------------------
say "systemctl kill -s SIGSTOP (a wedged loop: no more WATCHDOG=1)"
restarts0=$(prop NRestarts)
pid0=$(prop MainPID)
ns systemctl kill -s SIGSTOP --kill-who=main "$UNIT"
# WatchdogSec=3s, then SIGABRT (held while stopped) and SIGKILL after
# TimeoutAbortSec (= TimeoutStopSec, 10 s), then RestartSec=2s.
wait_for 40 restarted || true
expect "NRestarts after a wedge" "$(prop NRestarts)" $((restarts0 + 1))
expect "state after the watchdog restart" "$(prop ActiveState)/$(prop SubState)" active/running
if [ "$(prop MainPID)" != "$pid0" ]; then ok "a new process: MainPID $pid0 -> $(prop MainPID)"; else bad "MainPID unchanged ($pid0)"; fi
wd=$({ ns journalctl --no-pager -o cat -u "$UNIT" || true; } | grep -c 'Watchdog timeout' || true)
if [ "$wd" -ge 1 ]; then ok "systemd logged the watchdog timeout: $({ ns journalctl --no-pager -o cat -u "$UNIT" || true; } | grep -m 1 'Watchdog timeout')"; else bad "no 'Watchdog timeout' in the journal"; fi

# ---- 4b. why /etc/lease-sweeper is 0755: a CA file under a 0700 directory ------------
say "the CA file under a 0700 directory (the mode docs/operations.md advises against)"
ns install -d -m 0700 /etc/lease-sweeper/private
ns install -m 0644 "$WORK/ca.pem" /etc/lease-sweeper/private/db-ca.pem
write_env "postgres://sweeper_host_a:$SWEEPER_PW_URL@localhost:$PG_PORT/locks?sslmode=verify-full&sslrootcert=/etc/lease-sweeper/private/db-ca.pem"
ns systemctl restart "$UNIT" || true
INV=$(prop InvocationID)
denied() { [ "$(journal_count "$INV" 'message=sweep_failed')" -ge 1 ]; }
wait_for 20 denied || true
line=$({ ns journalctl --no-pager -o cat "_SYSTEMD_INVOCATION_ID=$INV" || true; } | grep -m 1 'message=sweep_failed' || true)
case "$line" in
    *"ermission denied"*) ok "the dynamic user cannot read it: $(echo "$line" | grep -o 'error="[^"]*' | cut -c1-150)" ;;
    *) bad "expected a permission error from sweep_failed, got: ${line:-nothing}" ;;
esac
ns rm -rf /etc/lease-sweeper/private
write_env "$SOCKET_URL"
ns systemctl restart "$UNIT" || bad "restart over the socket failed"

# ---- 5. reinstalling the package restarts a running daemon (try-restart) -------------
say "dpkg -i again while it runs (upgrade path)"
pid0=$(prop MainPID)
ns dpkg -i "$DEB" >"$WORK/dpkg2.log" 2>&1 || { cat "$WORK/dpkg2.log"; bad "dpkg -i (again) failed"; }
upgraded() { [ "$(prop MainPID)" != "$pid0" ] && [ "$(prop ActiveState)/$(prop SubState)" = active/running ]; }
wait_for 20 upgraded || true
if [ "$(prop MainPID)" != "$pid0" ]; then ok "reinstall restarted it: MainPID $pid0 -> $(prop MainPID)"; else bad "reinstall did not restart it"; fi
expect "state after reinstall" "$(prop ActiveState)/$(prop SubState)" active/running
expect "still enabled after reinstall" "$(ns systemctl is-enabled "$UNIT" 2>&1 || true)" enabled

# ---- 6. exit status 2 is not restarted ------------------------------------------------
say "a malformed LOCKDB_URL (exit status 2)"
write_env "postgres://sweeper_host_a:$SWEEPER_PW_URL@localhost:99999/locks"
if ns systemctl restart "$UNIT" 2>"$WORK/restart2.err"; then
    bad "restart with a malformed URL succeeded"
else
    ok "restart with a malformed URL failed: $(tr -s '\n' ' ' <"$WORK/restart2.err" | cut -c1-120)"
fi
INV=$(prop InvocationID)
expect "Result" "$(prop Result)" exit-code
expect "exit status" "$(prop ExecMainStatus)" 2
restarts0=$(prop NRestarts)
# Proving that something does not happen takes waiting: RestartSec is 2 s.
sleep 5
expect "NRestarts 5 s later (RestartSec=2s)" "$(prop NRestarts)" "$restarts0"
expect "state" "$(prop ActiveState)" failed
named=$(journal_count "$INV" 'LOCKDB_URL is not a valid PostgreSQL URL')
if [ "$named" -ge 1 ]; then ok "the journal names the variable ($named lines)"; else bad "no line names LOCKDB_URL"; fi
if ns journalctl --no-pager -o cat -u "$UNIT" | grep -qF -e "$SWEEPER_PW" -e "$SWEEPER_PW_URL"; then
    bad "the password appears in the journal"
else
    ok "the password appears nowhere in the journal"
fi
ns systemctl reset-failed "$UNIT"

# ---- 6a. journald dropped nothing of the unit -----------------------------------------
# journald reports what its rate limit dropped when the unit's next message
# after the interval arrives; the run goes on well past 30 s after the burst,
# and the unit logged since, so a suppression would show by now.
suppressed=$({ ns journalctl --no-pager -o cat || true; } | grep -E "^Suppressed [0-9]+ messages from $UNIT" || true)
expect "journald's 'Suppressed N messages from $UNIT'" "${suppressed:-none}" none
expect "journald's limit for the unit (LogRateLimitIntervalSec/Burst)" \
    "$(prop LogRateLimitIntervalUSec) $(prop LogRateLimitBurst)" "1s 1000000"

# ---- 7. the live unit's exposure ------------------------------------------------------
exposure=$(ns systemd-analyze security --no-pager "$UNIT" 2>/dev/null | awk -F': ' '/Overall exposure level/ {print $2}')
ok "systemd-analyze security (live): $exposure"

# ---- 8. purge ----------------------------------------------------------------------
if [ -z "$WAS_INSTALLED" ]; then
    say "dpkg --purge lease-sweeper"
    write_env "$TLS_URL"
    ns systemctl start "$UNIT" || true
    ns dpkg --purge lease-sweeper >"$WORK/purge.log" 2>&1 || { cat "$WORK/purge.log"; bad "dpkg --purge failed"; }
    expect "no daemon after purge" "$(ns systemctl is-active "$UNIT" 2>&1 || true)" inactive
    expect "unit file after purge" "$( [ -e /lib/systemd/system/$UNIT ] && echo present || echo removed)" removed
    expect "binary after purge" "$( [ -e /usr/bin/lease-sweeper ] && echo present || echo removed)" removed
fi

# ---- summary -------------------------------------------------------------------------
echo
summary && exit 0
echo "--- journal of $UNIT (last 40 lines) ---"
ns journalctl --no-pager -o short-monotonic -u "$UNIT" | tail -n 40
exit 1
