#!/usr/bin/env bash
# Checks the Prometheus rules shipped in deploy/prometheus/:
#   - `promtool check rules`: the file loads and every expression parses;
#   - `promtool test rules`: on the test file's input series, each alert
#     fires when it should and stays silent when it should not, and the
#     recording rules compute the values written there;
#   - every alert has both kinds of case in the test file (one that fires,
#     one that does not), so an alert cannot be added untested;
#   - every runbook_url names a section heading that exists in
#     docs/operations.md.
# Starts nothing and needs no network.
#
# Usage: scripts/check-prometheus-rules.sh
# Needs: promtool (Debian: apt-get install prometheus), python3.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/e2e.sh
. scripts/lib/e2e.sh

RULES=deploy/prometheus/lease-sweeper.rules.yml
TESTS=deploy/prometheus/lease-sweeper.rules.test.yml
RUNBOOK=docs/operations.md

command -v promtool >/dev/null || die "promtool is not installed: apt-get install prometheus"

say "promtool check rules $RULES"
if out=$(promtool check rules "$RULES" 2>&1); then
    ok "$(grep -o 'SUCCESS.*' <<<"$out")"
else
    bad "promtool check rules: $out"
fi

say "promtool test rules $TESTS"
if out=$(promtool test rules "$TESTS" 2>&1); then
    ok "every case of $TESTS passes"
else
    bad "promtool test rules:"
    printf '%s\n' "$out"
fi

say "each alert fires and stays silent somewhere in $TESTS; runbook anchors exist in $RUNBOOK"
while read -r verdict line; do
    if [ "$verdict" = ok ]; then ok "$line"; else bad "$line"; fi
done < <(python3 - "$RULES" "$TESTS" "$RUNBOOK" <<'PY'
import re, sys

rules, tests, runbook = (open(p, encoding="utf-8").read() for p in sys.argv[1:])
alerts = re.findall(r"^\s*- alert: (\S+)", rules, re.M)

# Each `alertname:` in the test file is followed by its `exp_alerts:`,
# either `[]` (must stay silent) or a list (must fire).
cases = {}
for name, expected in re.findall(r"alertname: (\S+)\s+exp_alerts:(.*)", tests):
    cases.setdefault(name, set()).add("silent" if expected.strip() == "[]" else "fires")
for alert in alerts:
    got = cases.get(alert, set())
    missing = {"fires", "silent"} - got
    if missing:
        words = {"fires": "fires", "silent": "stays silent"}
        print(f"bad {alert}: no test case where it {' or '.join(words[m] for m in sorted(missing))}")
    else:
        print(f"ok {alert}: tested firing and silent")

# GitHub's heading anchors: lower case, punctuation dropped, spaces to '-'.
def slug(heading):
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")

anchors = {slug(h) for h in re.findall(r"^#+ (.+)$", runbook, re.M)}
for alert, url in re.findall(r"- alert: (\S+)(?:(?!- alert:).)*?runbook_url: \"([^\"]+)\"", rules, re.S):
    page, _, anchor = url.partition("#")
    if page == "docs/operations.md" and anchor in anchors:
        print(f"ok {alert}: runbook {url}")
    else:
        print(f"bad {alert}: runbook {url} names no heading of docs/operations.md")
runbooks = re.findall(r"runbook_url:", rules)
if len(runbooks) != len(alerts):
    print(f"bad {len(alerts)} alerts but {len(runbooks)} runbook_url annotations")
PY
)

summary
