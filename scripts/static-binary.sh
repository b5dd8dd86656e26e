#!/usr/bin/env bash
# Builds the fully static (musl) lease-sweeper that the container image ships,
# and proves on this host what the image relies on:
#   1. it is static: no ELF interpreter, ldd finds nothing to load;
#   2. it runs with an empty environment (env -i): no PATH, HOME, locale, TZ;
#   3. as PID 1 of its own PID namespace (what `FROM scratch` + exec-form
#      ENTRYPOINT gives it, with no init shim) it handles SIGTERM and exits 0;
#      PID 1 gets no default signal actions, so this only works because the
#      daemon installs its own handlers;
#   4. it does the real job: `lease-sweeper demo` (a throwaway PostgreSQL,
#      leases abandoned and swept, SIGTERM) with an empty environment.
#
# Usage: scripts/static-binary.sh              (as root for steps 3-4; see below)
#        scripts/static-binary.sh --build-only (build and step 1 only; used by
#                                               scripts/container-image.sh)
# Output: $CARGO_TARGET_DIR (default target)/x86_64-unknown-linux-musl/release/lease-sweeper
#
# Needs: rustup, and musl-gcc for ring's C code (Debian: musl-tools; installed
# here when missing and we are root). A release build takes a few minutes on
# two cores. Not part of `cargo test`/CI. See docs/container.md.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_ONLY=""
[ "${1:-}" = "--build-only" ] && BUILD_ONLY=yes
TARGET=x86_64-unknown-linux-musl
BIN="$(realpath -m "${CARGO_TARGET_DIR:-target}")/$TARGET/release/lease-sweeper"
WORK="$(mktemp -d /tmp/lease-sweeper-static.XXXXXX)"
DAEMON_PID=""
cleanup() {
    if [ -n "$DAEMON_PID" ] && kill -0 "$DAEMON_PID" 2>/dev/null; then
        kill -KILL "$DAEMON_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

say() { printf '==> %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }

# ---- toolchain -----------------------------------------------------------------
if ! rustup target list --installed | grep -qx "$TARGET"; then
    say "adding the $TARGET Rust target"
    rustup target add "$TARGET"
fi
if ! command -v musl-gcc >/dev/null; then
    [ "$(id -u)" = 0 ] || fail "musl-gcc missing: apt-get install musl-tools"
    say "installing musl-tools (musl-gcc, for ring)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq musl-tools >/dev/null
fi

# ---- build ---------------------------------------------------------------------
say "cargo build --release --target $TARGET"
started=$(date +%s)
cargo build --release --locked --target "$TARGET" --bin lease-sweeper
say "built in $(( $(date +%s) - started )) s"

# ---- 1. static -----------------------------------------------------------------
say "1. static linking"
file "$BIN"
if readelf -l "$BIN" | grep -q 'INTERP'; then
    fail "$BIN has an ELF interpreter: it is dynamically linked"
fi
if readelf -d "$BIN" 2>/dev/null | grep -q 'NEEDED'; then
    fail "$BIN needs shared libraries: $(readelf -d "$BIN" | grep NEEDED)"
fi
ldd_out="$(ldd "$BIN" 2>&1 || true)"
echo "ldd: $ldd_out"
case "$ldd_out" in
    *"not a dynamic executable"*|*"statically linked"*) ;;
    *) fail "ldd found libraries to load: $ldd_out" ;;
esac
size_bytes=$(stat -c %s "$BIN")
say "size: $size_bytes bytes ($(( size_bytes / 1024 )) KiB)"
if [ -n "$BUILD_ONLY" ]; then
    say "OK: $BIN is static ($size_bytes bytes)"
    exit 0
fi

# ---- 2. empty environment ------------------------------------------------------
say "2. runs with an empty environment"
env -i "$BIN" --version
env -i "$BIN" --help >/dev/null || fail "--help failed with an empty environment"

# ---- 3. PID 1 and SIGTERM ------------------------------------------------------
say "3. SIGTERM as PID 1 of a new PID namespace, empty environment"
UNSHARE=(unshare --pid --fork --mount-proc)
if [ "$(id -u)" != 0 ]; then
    UNSHARE=(unshare --user --map-root-user --pid --fork --mount-proc)
fi
# No database is reachable with an empty environment: the daemon must keep
# running (logging sweep_failed) and still stop cleanly.
"${UNSHARE[@]}" env -i "$BIN" run >"$WORK/pid1.log" 2>&1 &
UNSHARE_PID=$!
for _ in $(seq 1 100); do
    DAEMON_PID=$(pgrep -P "$UNSHARE_PID" || true)
    [ -n "$DAEMON_PID" ] && grep -q 'message=sweeper_started' "$WORK/pid1.log" && break
    sleep 0.1
done
[ -n "$DAEMON_PID" ] || fail "the daemon did not start: $(cat "$WORK/pid1.log")"
nspid=$(awk '/^NSpid:/ {print $NF}' "/proc/$DAEMON_PID/status")
[ "$nspid" = 1 ] || fail "the daemon is PID $nspid in its namespace, not 1"
say "daemon is host PID $DAEMON_PID, PID $nspid in its namespace; running for 2 s"
sleep 2
kill -0 "$DAEMON_PID" || fail "the daemon died: $(cat "$WORK/pid1.log")"
sent=$(date +%s%N)
kill -TERM "$DAEMON_PID"
set +e
wait "$UNSHARE_PID"
code=$?
set -e
took_ms=$(( ($(date +%s%N) - sent) / 1000000 ))
sed 's/^/    /' "$WORK/pid1.log"
[ "$code" = 0 ] || fail "exit status $code after SIGTERM as PID 1"
grep -q 'message=shutdown_requested signal=SIGTERM' "$WORK/pid1.log" || fail "no shutdown_requested"
grep -q 'message=sweeper_stopped' "$WORK/pid1.log" || fail "no sweeper_stopped"
say "exit 0, ${took_ms} ms after SIGTERM"

# ---- 4. the real job -----------------------------------------------------------
if [ "$(id -u)" = 0 ] && ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    say "4. lease-sweeper demo with an empty environment (throwaway PostgreSQL)"
    set +e
    env -i "$BIN" demo >"$WORK/demo.log" 2>&1
    code=$?
    set -e
    expired=$(grep -c 'message=lease_expired' "$WORK/demo.log" || true)
    grep -E 'message=(lease_expired|demo_statsd_datagram|sweeper_stopped|demo_done)' "$WORK/demo.log" \
        | head -n 12 | sed 's/^/    /'
    [ "$code" = 0 ] || { cat "$WORK/demo.log"; fail "demo exited $code"; }
    [ "$expired" -gt 0 ] || fail "the demo swept nothing"
    say "demo exit 0, $expired lease_expired lines"
else
    say "4. skipped (needs root and PostgreSQL server binaries)"
fi

say "OK: $BIN is static ($size_bytes bytes), runs with env -i, exits 0 on SIGTERM as PID 1"
