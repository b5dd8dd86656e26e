#!/usr/bin/env bash
# Checks the Grafana dashboard against a real Prometheus: the file is
# importable as shipped (scripts/lib/dashboard_exprs.py --lint), every
# panel's query parses and type-checks (each is sent to /api/v1/query and
# must come back status=success), and every recording rule a query reads is
# one that deploy/prometheus/lease-sweeper.rules.yml defines.
#
# The Prometheus it starts has no scrape targets, so the queries return no
# data: this proves they are valid PromQL over the right names, not what
# they show. Prometheus listens on 127.0.0.1 only, on a free port, in a temp
# dir; both are removed on exit, and every wait is bounded.
#
# Usage: scripts/check-dashboard.sh [DASHBOARD.json]
# Needs: prometheus (Debian: apt-get install prometheus), python3, curl.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
# shellcheck source=lib/e2e.sh
. scripts/lib/e2e.sh

DASHBOARD="${1:-deploy/grafana/lease-sweeper.json}"
RULES="$REPO/deploy/prometheus/lease-sweeper.rules.yml"
# Seconds Prometheus may take to become ready, and one query to answer.
READY_TIMEOUT=30
QUERY_TIMEOUT=10

command -v prometheus >/dev/null || die "prometheus is not installed: apt-get install prometheus"
command -v curl >/dev/null || die "curl is not installed: apt-get install curl"
EXPRS=(python3 scripts/lib/dashboard_exprs.py)

say "lint $DASHBOARD"
if problems=$("${EXPRS[@]}" --lint "$DASHBOARD"); then
    ok "importable: __inputs, datasource \${DS_PROMETHEUS} on every panel and target"
else
    while read -r p; do bad "$p"; done <<<"$problems"
fi

WORK=$(mktemp -d)
PROM_PID=
cleanup() {
    if [ -n "$PROM_PID" ]; then
        kill "$PROM_PID" 2>/dev/null || true
        wait "$PROM_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

PORT=$(free_port tcp)
URL="http://127.0.0.1:$PORT"
cat >"$WORK/prometheus.yml" <<YML
# No scrape targets: only the rules, so their names exist for the checks.
rule_files:
  - $RULES
YML
say "starting Prometheus $(prometheus --version 2>&1 | awk 'NR == 1 { print $3 }') on $URL"
prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/data" \
    --web.listen-address="127.0.0.1:$PORT" >"$WORK/prometheus.log" 2>&1 &
PROM_PID=$!
ready() { curl -fs --max-time 2 -o /dev/null "$URL/-/ready"; }
if ! wait_for "$READY_TIMEOUT" ready; then
    tail -n 20 "$WORK/prometheus.log" >&2
    die "Prometheus was not ready within ${READY_TIMEOUT}s"
fi

# status of a /api/v1/query answer on stdin, and its error if any
status_of() {
    python3 -c 'import json, sys
try:
    a = json.load(sys.stdin)
except ValueError:
    print("unreadable answer"); sys.exit()
print(a.get("status"), a.get("errorType", ""), a.get("error", ""))'
}

say "every panel query, through $URL/api/v1/query"
n=0
while IFS=$'\t' read -r panel ref expr; do
    n=$((n + 1))
    answer=$(curl -sS --max-time "$QUERY_TIMEOUT" --data-urlencode "query=$expr" "$URL/api/v1/query" | status_of)
    if [ "${answer%% *}" = success ]; then
        ok "$panel [$ref]: $expr"
    else
        bad "$panel [$ref]: $expr -> $answer"
    fi
done < <("${EXPRS[@]}" "$DASHBOARD")
[ "$n" -gt 0 ] || bad "no queries found in $DASHBOARD"

say "recording rules the dashboard reads, against those Prometheus loaded"
recorded=$(curl -fsS --max-time "$QUERY_TIMEOUT" "$URL/api/v1/rules?type=record" | python3 -c 'import json, sys
for g in json.load(sys.stdin)["data"]["groups"]:
    for r in g["rules"]:
        print(r["name"])')
while read -r name; do
    if grep -qxF "$name" <<<"$recorded"; then
        ok "recorded: $name"
    else
        bad "$name is read by the dashboard but recorded by no rule in $RULES"
    fi
done < <("${EXPRS[@]}" --recording-rules "$DASHBOARD")

summary
