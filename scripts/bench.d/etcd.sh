#!/usr/bin/env bash
# The etcd lock backend beside a real workload. Not part of CI or the tests.
#
#   scripts/bench.d/etcd.sh                      # every part (~11 min on 2 cores)
#   scripts/bench.d/etcd.sh --quick              # small scale (~4 min)
#   BENCH_ETCD_PARTS="delay classify" scripts/bench.d/etcd.sh --runs 1
#
# Every part starts its own single etcd member on loopback (a fresh data
# directory in the work directory, default fsync), the release daemon as
# sidecars (`HOSTNAME=side-I ETCDCTL_ENDPOINTS=<member> STATSD_PORT=<an
# unused UDP port> lease-sweeper run > side-I.out`, nothing else in their
# environment, so no PostgreSQL), and the load tool examples/etcd_load.rs
# (`etcd_load --help`): holders that lock with etcd's own Lock RPC, each
# on a lease of its own renewed every TTL/3, and watch their own keys. The
# daemons, the load and the member are stopped at the end of each part
# (SIGTERM, then SIGKILL after 10 s), and whatever is left on any exit
# (trap); the step fails if anything it started is still running.
#
#   delay     BENCH_ETCD_DELAY_N (1,000) holders (TTL 2 s) die at once
#             (their keep-alives stop); per key, the time from the holders'
#             watch seeing etcd's DELETE to the sidecar's `lease_expired`
#             line (its `ts`, ms, same host clock): p50/p99/max, `alone`
#             and `beside` a second load instance locking and unlocking
#             other names at BENCH_ETCD_CHURN_RATE (100) pairs a second on
#             16 sessions; one sidecar; and the LeaseTimeToLive calls a
#             second etcd received while they held (only sidecars ask it)
#   mass      BENCH_ETCD_MASS_N (10,000) holders (TTL BENCH_ETCD_MASS_TTL,
#             10 s) die at once, one sidecar and three: lines per key over
#             all sidecars (each exactly once), how long etcd took to delete
#             them all (first to last DELETE the holders' watch saw, and
#             the rate), the time to the last line; lines are waited for
#             until all are in or BENCH_ETCD_MASS_WAIT (30) s after the
#             holders saw the last deletion; then, if lines are missing,
#             every sidecar is restarted under its HOSTNAME and lines are
#             counted until all are in or 60 s (each key once over both);
#             BENCH_ETCD_MASS_RUNS (1) runs
#   cost      what the sidecar asks of etcd: a window of BENCH_ETCD_WINDOW
#             (60) s without it, then (after 10 s of settling) one with
#             it, on the same member and load: idle (no locks), and
#             BENCH_ETCD_COST_N (10,000) held locks kept alive (none dying)
#             at each TTL of BENCH_ETCD_COST_TTLS ("10"; "10 60" adds
#             2.5 min); etcd's gRPC messages received a second by method
#             (its /metrics, grpc_server_msg_received_total) and its CPU
#             (schedstat of every thread, ns), the difference being the
#             sidecar's; once
#   classify  BENCH_ETCD_CLASS_N (300) holders each killed, released
#             (Unlock, lease kept alive) and revoked (LeaseRevoke while
#             held), interleaved, all at the same signal, at each TTL of
#             BENCH_ETCD_CLASS_TTLS ("2 10"): how many lines say what
#             happened (expiry / none / revoke); then as many holders that
#             unlock and at once revoke their lease (`etcdctl lock`'s own
#             exit), all at once, and as many one after another at
#             BENCH_ETCD_CLASS_PACE (50) a second: how many get a
#             `reapedBy=revoke` line (none should)
#
# Options:
#   --bin PATH       the daemon (default target/release/lease-sweeper; not
#                    built here)
#   --load PATH      the load tool (default target/release/examples/etcd_load,
#                    built here with `cargo build --release --example
#                    etcd_load` unless --no-build)
#   --no-build       do not build the load tool
#   --quick          small scale: 300 / 2,000 / 2,000 holders, 15 s windows,
#                    100 per classified group, TTL 2 s only, one run
#   --runs N         runs of delay and classify (default 2; BENCH_ETCD_RUNS)
#   --results FILE   also append the tables to FILE
#   --keep           keep the work directory (every stdout, etcd's logs,
#                    each part's report.json)
# Environment: ETCD_BIN (default etcd on PATH), BENCH_ETCD_WORK (work
# directory), BENCH_ETCD_PARTS (default "delay mass cost classify"), and the
# BENCH_ETCD_* sizes above.
# From scripts/bench, as its `etcd` step (`scripts/bench --only etcd`; its
# --quick, --no-build and --keep are passed on, the work directory is
# $BENCH_WORK/etcd).
# Needs: bash, python3, bc, curl, etcd (Debian: etcd-server), cargo.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=$ROOT/target/release/lease-sweeper LOAD=$ROOT/target/release/examples/etcd_load
RESULTS_FILE= KEEP=0 BUILD=1 QUICK=0 RUNS=
while (($#)); do
    case $1 in
    --bin) BIN=$(realpath "$2"); shift ;;
    --load) LOAD=$(realpath "$2"); BUILD=0; shift ;;
    --no-build) BUILD=0 ;;
    --quick) QUICK=1 ;;
    --runs) RUNS=$2; shift ;;
    --results) RESULTS_FILE=$(realpath "$2"); shift ;;
    --keep) KEEP=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "etcd: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
if ((QUICK)); then
    DELAY_N=300 MASS_N=2000 COST_N=2000 WINDOW=15 CLASS_N=100 RUNS=${RUNS:-1} COST_TTLS=10 CLASS_TTLS=2
fi
RUNS=${RUNS:-${BENCH_ETCD_RUNS:-2}}
DELAY_N=${DELAY_N:-${BENCH_ETCD_DELAY_N:-1000}}
MASS_N=${MASS_N:-${BENCH_ETCD_MASS_N:-10000}}
MASS_TTL=${BENCH_ETCD_MASS_TTL:-10}
MASS_WAIT=${BENCH_ETCD_MASS_WAIT:-30}
MASS_RUNS=${BENCH_ETCD_MASS_RUNS:-1}
COST_N=${COST_N:-${BENCH_ETCD_COST_N:-10000}}
COST_TTLS=${COST_TTLS:-${BENCH_ETCD_COST_TTLS:-10}}
WINDOW=${WINDOW:-${BENCH_ETCD_WINDOW:-60}}
CLASS_N=${CLASS_N:-${BENCH_ETCD_CLASS_N:-300}}
CLASS_TTLS=${CLASS_TTLS:-${BENCH_ETCD_CLASS_TTLS:-"2 10"}}
CLASS_PACE=${BENCH_ETCD_CLASS_PACE:-50}
CHURN_RATE=${BENCH_ETCD_CHURN_RATE:-100}
PARTS=${BENCH_ETCD_PARTS:-"delay mass cost classify"}
ETCD=${ETCD_BIN:-$(command -v etcd || true)}
[[ -x $ETCD ]] || { echo "etcd: no etcd server (Debian: apt-get install etcd-server; or ETCD_BIN)" >&2; exit 2; }
[[ -x $BIN ]] || { echo "etcd: no daemon at $BIN (cargo build --release, or --bin PATH)" >&2; exit 2; }
if ((BUILD)); then
    (cd "$ROOT" && cargo build --release --quiet --example etcd_load)
fi
[[ -x $LOAD ]] || { echo "etcd: no load tool at $LOAD" >&2; exit 2; }

log() { printf '[etcd %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
now() { date +%s.%N; }
calc() { echo "$*" | bc -l; }
fmt() { printf "%.${2:-2}f" "$1"; }
json() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }
num() { printf "%'d" "$1"; }

WORK=${BENCH_ETCD_WORK:-$(mktemp -d /tmp/lease-bench-etcd.XXXXXX)}
mkdir -p "$WORK"
RESULTS=$WORK/results.md
: >"$RESULTS"
PIDS=() SIDES=() EPID= HPID= CPID=
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    if ((KEEP)); then log "artifacts kept in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

row() {
    printf '|' | tee -a "$RESULTS"
    local c
    for c in "$@"; do printf ' %s |' "$c" | tee -a "$RESULTS"; done
    echo | tee -a "$RESULTS"
}
header() {
    { echo; echo "### $1"; echo; } | tee -a "$RESULTS"
    shift
    row "$@"
    local sep=() c
    for c in "$@"; do sep+=("---"); done
    row "${sep[@]}"
}

# alive PID: running and not a zombie.
alive() {
    local s
    s=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1) || return 1
    [[ -n $s && $s != Z ]]
}
# stop_pid PID: SIGTERM, SIGKILL after 10 s; sets RC to its exit code.
stop_pid() {
    RC=
    [[ -n $1 ]] || return 0
    kill -TERM "$1" 2>/dev/null || true
    reap_pid "$1"
}
# reap_pid PID: waits for it (SIGKILL after 10 s); sets RC. A second SIGTERM
# would be the daemon's forced shutdown, so none is sent here.
reap_pid() {
    local i
    for i in $(seq 200); do alive "$1" || break; sleep 0.05; done
    kill -KILL "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null && RC=0 || RC=$?
}
free_port() { python3 -c 'import socket, sys; s = socket.socket(socket.AF_INET, getattr(socket, sys.argv[1])); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' "$1"; }
# cpu_ns PID: nanoseconds on CPU, every thread (schedstat).
cpu_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%.0f\n", s}'; }

# etcd_start DIR: a single member on two free loopback ports, its data and
# log in DIR; sets EURL, EPID.
etcd_start() {
    local d=$1 cp pp i
    mkdir -p "$d"
    cp=$(free_port SOCK_STREAM) pp=$(free_port SOCK_STREAM)
    EURL=http://127.0.0.1:$cp
    # Nothing from the caller's ETCD_* variables (etcd reads them all).
    env -i PATH="$PATH" "$ETCD" --name bench --data-dir "$d/etcd" \
        --listen-client-urls "$EURL" --advertise-client-urls "$EURL" \
        --listen-peer-urls "http://127.0.0.1:$pp" --initial-advertise-peer-urls "http://127.0.0.1:$pp" \
        --initial-cluster "bench=http://127.0.0.1:$pp" --initial-cluster-token "$d" \
        --logger zap --log-outputs stderr >"$d/etcd.log" 2>&1 &
    EPID=$!
    PIDS+=("$EPID")
    for i in $(seq 200); do
        curl -sf "$EURL/health" 2>/dev/null | grep -q '"health":"true"' && return 0
        alive "$EPID" || break
        sleep 0.05
    done
    echo "etcd: the member did not start (see $d/etcd.log)" >&2
    return 1
}

# side_start DIR I: sidecar side-I, its stdout in DIR/side-I.out.
SPORT=$(free_port SOCK_DGRAM)
side_start() {
    env -i PATH="$PATH" HOSTNAME="side-$2" ETCDCTL_ENDPOINTS="$EURL" \
        STATSD_HOST=127.0.0.1 STATSD_PORT="$SPORT" \
        "$BIN" run >"$1/side-$2.out" 2>"$1/side-$2.err" &
    SIDES+=("$!")
    PIDS+=("$!")
}
# sides_stop: SIGTERM to every sidecar; SIDE_RC: their exit codes.
sides_stop() {
    local p
    SIDE_RC=
    for p in "${SIDES[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${SIDES[@]}"; do reap_pid "$p"; SIDE_RC+="${SIDE_RC:+ }$RC"; done
    SIDES=()
}
lines() { cat "$1"/side-*.out 2>/dev/null | grep -c ' message=lease_expired ' || true; }
# wait_lines DIR N SECS: until the sidecars wrote N lines, at most SECS.
wait_lines() {
    local deadline=$(($(date +%s) + $3))
    while (($(lines "$1") < $2)) && (($(date +%s) < deadline)); do sleep 0.1; done
}

# hold_start DIR ARGS…: the holders, their files in DIR (ready, deletes.tsv,
# summary.json); returns once all hold; sets HPID.
hold_start() {
    local d=$1 i
    shift
    mkdir -p "$d"
    "$LOAD" hold --endpoint "$EURL" --out "$d" "$@" 2>"$d.err" &
    HPID=$!
    PIDS+=("$HPID")
    for i in $(seq 6000); do
        [[ -s $d/ready ]] && return 0
        alive "$HPID" || break
        sleep 0.05
    done
    echo "etcd: the holders did not come up (see $d.err)" >&2
    cat "$d.err" >&2
    return 1
}
# hold_act DIR: the signal; waits until the holders' watch saw every key go.
hold_act() {
    kill -USR1 "$HPID"
    wait "$HPID" || { echo "etcd: the holders failed (see $1.err)" >&2; cat "$1.err" >&2; return 1; }
    ACT_MS=$(json "$1/summary.json" "d['act_ms']")
}
churn_start() {
    "$LOAD" churn --endpoint "$EURL" --out "$1" --rate "$CHURN_RATE" 2>"$1.err" &
    CPID=$!
    PIDS+=("$CPID")
}
report() { # DELETES SIDECAR-OUT… > JSON
    local del=$1
    shift
    "$LOAD" report --deletes "$del" --act-ms "$ACT_MS" "$@"
}
# metrics FILE: etcd's Prometheus text.
metrics() { curl -sf "$EURL/metrics" >"$1"; }
# ttl_asked: LeaseTimeToLive calls etcd has received so far (only the
# sidecars ask it; the load tool never does).
ttl_asked() { curl -sf "$EURL/metrics" | awk '/^grpc_server_msg_received_total\{.*grpc_method="LeaseTimeToLive"/ {s += $2} END {printf "%.0f\n", s}'; }
# trio PATH: "p50 / p99 / max" of the JSON on stdin at PATH (e.g.
# "['kill']['delay_ms']"), or — when there is none.
trio() { json /dev/stdin "'—' if d$1 is None else '{p50} / {p99} / {max}'.format(**d$1)"; }

{
    echo "## Machine (etcd step)"
    echo
    echo "- nproc: $(nproc); load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "- $("$ETCD" --version | head -1) (one member, loopback, default fsync, data in $WORK)"
    echo "- daemon: $BIN ($("$BIN" --version)); load: $LOAD"
} | tee -a "$RESULTS"

# ---------------------------------------------------------------- delay
part_delay() {
    header "etcd delay: $(num "$DELAY_N") holders (TTL 2 s) die at once; from the holders' watch seeing etcd's DELETE to the sidecar's line (ts), one sidecar; beside: $CHURN_RATE lock+unlock pairs a second of other names" \
        variant run holders "lines (keys once)" "delay p50 / p99 / max ms" "overdueMillis p50 / p99 / max" "deletions first→last s" "beside: pairs/s done, lock p99 ms" "sidecar's LeaseTimeToLive/s while they held" "renewal answered at worst ms" "load1" "sidecar exit"
    local r v d st cs=— rc asked
    for ((r = 1; r <= RUNS; r++)); do
        for v in alone beside; do
            d=$WORK/delay.$r.$v
            log "delay run $r $v: $DELAY_N holders"
            etcd_start "$d"
            side_start "$d" 0
            sleep 2
            if [[ $v == beside ]]; then churn_start "$d/churn.json"; sleep 2; fi
            hold_start "$d/hold" --kill "$DELAY_N" --ttl 2 --prefix locks
            local l1 a0 a1 t0
            a0=$(ttl_asked) t0=$(now)
            sleep 3
            a1=$(ttl_asked)
            asked=$(fmt "$(calc "($a1 - $a0) / ($(now) - $t0)")" 0)
            l1=$(cut -d' ' -f1 /proc/loadavg)
            hold_act "$d/hold"
            wait_lines "$d" "$DELAY_N" 30
            sleep 1
            cs=—
            if [[ $v == beside ]]; then
                stop_pid "$CPID"
                cs="$(fmt "$(json "$d/churn.json" "d['rate']")" 1), $(fmt "$(json "$d/churn.json" "(d['lock_ms'] or {}).get('p99', 0)")" 1)"
            fi
            sides_stop
            rc=$SIDE_RC
            stop_pid "$EPID"
            st=$(report "$d/hold/deletes.tsv" "$d"/side-*.out | tee "$d/report.json")
            row "$v" "$r" "$(num "$DELAY_N")" "$(json /dev/stdin "f\"{d['lines']} ({d['keys_with_lines']})\"" <<<"$st")" \
                "$(trio "['kill']['delay_ms']" <<<"$st")" "$(trio "['kill']['overdue_ms']" <<<"$st")" \
                "$(json /dev/stdin "(d['kill']['deletions'] or {}).get('secs')" <<<"$st")" "$cs" "$asked" \
                "$(json "$d/hold/summary.json" "d['renew_max_ms']")" "$l1" "$rc"
            log "delay run $r $v: $st"
        done
    done
}

# ---------------------------------------------------------------- mass
part_mass() {
    header "etcd mass expiry: $(num "$MASS_N") holders (TTL $MASS_TTL s) die at once; lines counted until all are in or $MASS_WAIT s after etcd's last deletion; then every sidecar restarted under its HOSTNAME, lines counted until all are in or 60 s" \
        sidecars run "lines / keys" "lines per sidecar" "etcd deleted them in s" "deletions/s" "last line after first deletion s" "after last deletion s" "delay p50 / p99 / max ms" "sidecars' LeaseTimeToLive/s after the signal" "after the restart: more lines, in s" "in all: keys once / twice / none" "holders lost before the signal" "load1" "sidecar exits"
    local r k i d st all l1 a0 a1 t0 asked n1 again deadline
    for ((r = 1; r <= MASS_RUNS; r++)); do
        for k in 1 3; do
            d=$WORK/mass.$r.$k
            log "mass run $r: $MASS_N holders, $k sidecar(s)"
            etcd_start "$d"
            for ((i = 0; i < k; i++)); do side_start "$d" "$i"; done
            sleep 2
            hold_start "$d/hold" --kill "$MASS_N" --ttl "$MASS_TTL" --prefix locks
            sleep 5
            l1=$(cut -d' ' -f1 /proc/loadavg)
            a0=$(ttl_asked) t0=$(now)
            hold_act "$d/hold"
            wait_lines "$d" "$MASS_N" "$MASS_WAIT"
            sleep 3
            a1=$(ttl_asked)
            asked=$(fmt "$(calc "($a1 - $a0) / ($(now) - $t0)")" 0)
            sides_stop
            local rc1=$SIDE_RC
            # Whatever was not written yet is written after a restart, from
            # each sidecar's resume point (nothing lost, none twice).
            n1=$(lines "$d")
            again=—
            if ((n1 < MASS_N)); then
                mkdir -p "$d/again"
                t0=$(now)
                for ((i = 0; i < k; i++)); do side_start "$d/again" "$i"; done
                deadline=$(($(date +%s) + 60))
                while (($(lines "$d") + $(lines "$d/again") < MASS_N)) && (($(date +%s) < deadline)); do sleep 0.1; done
                again="$(($(lines "$d/again"))), $(fmt "$(calc "$(now) - $t0")" 1)"
                sleep 2
                sides_stop
                rc1+=", $SIDE_RC"
            fi
            stop_pid "$EPID"
            st=$(report "$d/hold/deletes.tsv" "$d"/side-*.out | tee "$d/report.json")
            local outs=("$d"/side-*.out)
            [[ -d $d/again ]] && outs+=("$d"/again/side-*.out)
            all=$(report "$d/hold/deletes.tsv" "${outs[@]}" | tee "$d/report.all.json")
            row "$k" "$r" "$(json /dev/stdin "f\"{d['lines']} / {d['keys_with_lines']}\"" <<<"$st")" \
                "$(json /dev/stdin "' + '.join(map(str, d['per_sidecar']))" <<<"$st")" \
                "$(json /dev/stdin "(d['kill']['deletions'] or {}).get('secs')" <<<"$st")" \
                "$(fmt "$(json /dev/stdin "(d['kill']['deletions'] or {}).get('per_sec', 0)" <<<"$st")" 0)" \
                "$(json /dev/stdin "d['kill']['last_line_after_first_deletion_s']" <<<"$st")" \
                "$(json /dev/stdin "d['kill']['last_line_after_last_deletion_s']" <<<"$st")" \
                "$(trio "['kill']['delay_ms']" <<<"$st")" "$asked" "$again" \
                "$(json /dev/stdin "f\"{d['keys_with_lines']} / {d['duplicates']} / {d['by_group']['kill'].get('none', 0)}\"" <<<"$all")" \
                "$(json "$d/hold/summary.json" "d['lost_before_act']")" "$l1" "$rc1"
            log "mass run $r, $k sidecar(s): $st; with the restart: $all"
        done
    done
}

# ---------------------------------------------------------------- cost
# grpc_rates M0 M1 M2 M3 SECS_WITHOUT SECS_WITH: per method, messages
# received a second without and with the sidecar, and unary calls handled.
grpc_rates() {
    python3 - "$@" <<'PY'
import json, re, sys
def load(f):
    d = {}
    for line in open(f):
        m = re.match(r'(grpc_server_(?:handled|msg_received)_total)\{([^}]*)\} (\S+)', line)
        if not m:
            continue
        lab = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        kind = 'received' if 'msg_received' in m.group(1) else 'handled'
        k = (kind, lab.get('grpc_type'), lab.get('grpc_method'))
        d[k] = d.get(k, 0) + float(m.group(3))
    return d
m0, m1, m2, m3 = (load(f) for f in sys.argv[1:5])
w0, w1 = float(sys.argv[5]), float(sys.argv[6])
out = {}
for k in set(m1) | set(m3):
    a = (m1.get(k, 0) - m0.get(k, 0)) / w0
    b = (m3.get(k, 0) - m2.get(k, 0)) / w1
    if a or b:
        out['%s %s %s' % k] = [round(a, 2), round(b, 2), round(b - a, 2)]
print(json.dumps(out, sort_keys=True))
PY
}
part_cost() {
    header "etcd cost: ${WINDOW} s without the sidecar, then ${WINDOW} s with it (after 10 s), same member and load; requests etcd received a second (the sidecar's: with − without) and etcd's CPU" \
        "held locks" "TTL s" "sidecar's unary calls/s" "of which LeaseTimeToLive/s" "expected LeaseTimeToLive/s" "Txn / Range / Put /s" "Watch msgs/s" "LeaseKeepAlive msgs/s without → with" "etcd CPU without → with ms/s (difference)" "sidecar's own CPU ms/s" "holders lost" "load1"
    local ttl d n t0 t1 t2 t3 c0 c1 c2 c3 s0 s1 rates lost l1 expect sp
    for ttl in idle $COST_TTLS; do
        d=$WORK/cost.$ttl
        n=0
        [[ $ttl == idle ]] || n=$COST_N
        log "cost: $n held locks, TTL $ttl: ${WINDOW} s without, ${WINDOW} s with the sidecar"
        etcd_start "$d"
        HPID=
        if [[ $ttl != idle ]]; then hold_start "$d/hold" --kill "$COST_N" --ttl "$ttl" --prefix locks; fi
        sleep 5
        l1=$(cut -d' ' -f1 /proc/loadavg)
        metrics "$d/m0"; t0=$(now); c0=$(cpu_ns "$EPID")
        sleep "$WINDOW"
        metrics "$d/m1"; t1=$(now); c1=$(cpu_ns "$EPID")
        side_start "$d" 0
        sp=${SIDES[0]}
        sleep 10
        metrics "$d/m2"; t2=$(now); c2=$(cpu_ns "$EPID"); s0=$(cpu_ns "$sp")
        sleep "$WINDOW"
        metrics "$d/m3"; t3=$(now); c3=$(cpu_ns "$EPID"); s1=$(cpu_ns "$sp")
        sides_stop
        lost=—
        if [[ -n $HPID ]]; then
            stop_pid "$HPID"
            lost=$(json "$d/hold/summary.json" "d['lost_before_act']")
        fi
        stop_pid "$EPID"
        rates=$(grpc_rates "$d/m0" "$d/m1" "$d/m2" "$d/m3" "$(calc "$t1 - $t0")" "$(calc "$t3 - $t2")" | tee "$d/rates.json")
        # What the sidecar should ask: each holder's lease when it appears,
        # then again once the deadline it learned is within 2 s. The brief
        # rule, one ask per lease per TTL - 2 s, is the low end; renewed
        # every TTL/3, a lease is asked with TTL - TTL/6 s left on average,
        # which etcd rounds down (0.5 s): the high end.
        expect=—
        [[ $ttl == idle ]] || expect="$(fmt "$(calc "$n / ($ttl - 2)")" 0)–$(fmt "$(calc "$n / ($ttl - $ttl / 6 - 0.5 - 2)")" 0)"
        row "$(num "$n")" "${ttl/idle/—}" \
            "$(json /dev/stdin "'**%.1f**' % sum(v[2] for k, v in d.items() if k.startswith('received unary'))" <<<"$rates")" \
            "$(json /dev/stdin "d.get('received unary LeaseTimeToLive', [0, 0, 0])[2]" <<<"$rates")" "$expect" \
            "$(json /dev/stdin "' / '.join(str(d.get('received unary ' + m, [0, 0, 0])[2]) for m in ('Txn', 'Range', 'Put'))" <<<"$rates")" \
            "$(json /dev/stdin "d.get('received bidi_stream Watch', [0, 0, 0])[2]" <<<"$rates")" \
            "$(json /dev/stdin "'%s → %s' % tuple(d.get('received bidi_stream LeaseKeepAlive', [0, 0, 0])[:2])" <<<"$rates")" \
            "$(fmt "$(calc "($c1 - $c0) / 1000000 / ($t1 - $t0)")" 1) → $(fmt "$(calc "($c3 - $c2) / 1000000 / ($t3 - $t2)")" 1) ($(fmt "$(calc "($c3 - $c2) / 1000000 / ($t3 - $t2) - ($c1 - $c0) / 1000000 / ($t1 - $t0)")" 1))" \
            "$(fmt "$(calc "($s1 - $s0) / 1000000 / ($t3 - $t2)")" 1)" "$lost" "$l1"
        log "cost $ttl: $rates"
    done
}

# ---------------------------------------------------------------- classify
part_classify() {
    header "etcd classification: $CLASS_N holders each killed, released (Unlock, lease alive) and revoked (LeaseRevoke while held), interleaved, at one signal; then $CLASS_N that unlock and at once revoke their lease (etcdctl lock's exit), all at once, then $CLASS_N more one after another at $CLASS_PACE a second; one sidecar" \
        "TTL s" run "killed: expiry / revoke / none" "released: none / expiry / revoke" "revoked: revoke / expiry / none" "right" "unlock+revoke all at once: none / revoke / expiry" "unlock+revoke at $CLASS_PACE/s: none / revoke / expiry" "duplicates" "load1" "sidecar exit"
    local ttl r d st st2 st3 l1 act1
    for ttl in $CLASS_TTLS; do
        for ((r = 1; r <= RUNS; r++)); do
            d=$WORK/classify.$ttl.$r
            log "classify TTL $ttl run $r"
            etcd_start "$d"
            side_start "$d" 0
            sleep 2
            hold_start "$d/hold" --kill "$CLASS_N" --release "$CLASS_N" --revoke "$CLASS_N" --ttl "$ttl" --prefix locks
            sleep 3
            l1=$(cut -d' ' -f1 /proc/loadavg)
            hold_act "$d/hold"
            act1=$ACT_MS
            wait_lines "$d" $((2 * CLASS_N)) 60
            sleep 3
            cp "$d/side-0.out" "$d/first.out"
            hold_start "$d/hold2" --unlock-revoke "$CLASS_N" --ttl "$ttl" --prefix ur
            sleep 3
            hold_act "$d/hold2"
            sleep 3
            hold_start "$d/hold3" --unlock-revoke "$CLASS_N" --ttl "$ttl" --prefix urpaced --pace "$CLASS_PACE"
            sleep 3
            hold_act "$d/hold3"
            sleep 3
            sides_stop
            stop_pid "$EPID"
            st=$(ACT_MS=$act1 report "$d/hold/deletes.tsv" "$d/first.out" | tee "$d/report.json")
            st2=$(report "$d/hold2/deletes.tsv" "$d/side-0.out" | tee "$d/report2.json")
            st3=$(report "$d/hold3/deletes.tsv" "$d/side-0.out" | tee "$d/report3.json")
            c() { json /dev/stdin "' / '.join(str(d['by_group'].get('$1', {}).get(v, 0)) for v in '$2'.split())" <<<"$3"; }
            row "$ttl" "$r" "$(c kill 'expiry revoke none' "$st")" "$(c release 'none expiry revoke' "$st")" \
                "$(c revoke 'revoke expiry none' "$st")" \
                "$(json /dev/stdin "'%d / %d' % (d['by_group'].get('kill', {}).get('expiry', 0) + d['by_group'].get('release', {}).get('none', 0) + d['by_group'].get('revoke', {}).get('revoke', 0), sum(sum(g.values()) for g in d['by_group'].values()))" <<<"$st")" \
                "$(c unlock-revoke 'none revoke expiry' "$st2")" "$(c unlock-revoke 'none revoke expiry' "$st3")" \
                "$(json /dev/stdin "d['duplicates']" <<<"$st3")" "$l1" "$SIDE_RC"
            log "classify TTL $ttl run $r: $st; unlock+revoke at once: $st2; paced: $st3"
        done
    done
}

T0=$(date +%s)
for part in $PARTS; do
    "part_$part"
done
# Nothing of this step may outlive it.
left=
for p in "${PIDS[@]}"; do alive "$p" && left+=" $p"; done
[[ -z $left ]] || { echo "etcd: still running:$left" >&2; exit 1; }
log "done in $(($(date +%s) - T0)) s; tables in $RESULTS"
[[ -z $RESULTS_FILE ]] || cat "$RESULTS" >>"$RESULTS_FILE"
