#!/usr/bin/env python3
"""Every PromQL expression of a Grafana dashboard, with the panel it feeds.

Owns reading a dashboard JSON file (panels, panels inside collapsed rows)
and printing each `targets[].expr`, so that a check can evaluate them
against a real Prometheus: scripts/check-dashboard.sh parses them all, and a
test with data can assert what each returns. It does not talk to
Prometheus or Grafana, and it does not judge the queries.

Usage:
  dashboard_exprs.py DASHBOARD.json          one line per expression:
                                             panel title <TAB> refId <TAB> expr
  dashboard_exprs.py --json DASHBOARD.json   a JSON array of
                                             {"panel", "refId", "expr"}
  dashboard_exprs.py --lint DASHBOARD.json   checks the file is importable as
                                             shipped (see lint()); exit 1 and
                                             one line per problem otherwise

Expressions are printed on one line (PromQL treats a newline as a space).
Grafana's interval macros are replaced by fixed windows Prometheus accepts
(MACROS below); any other `$variable` is an error, because Prometheus could
not parse the expression and the dashboard defines no variables.
"""

import json
import re
import sys

# Grafana's built-in interval variables, as a check without Grafana reads
# them: the rules' and panels' usual 5-minute window.
MACROS = {
    "$__rate_interval": "5m",
    "${__rate_interval}": "5m",
    "$__interval": "1m",
    "${__interval}": "1m",
    "$__range": "1h",
    "${__range}": "1h",
}

# The datasource every panel and target must use: the `__inputs` entry
# Grafana asks for on import.
DATASOURCE_INPUT = "DS_PROMETHEUS"


def panels(dashboard):
    """Every panel, rows' nested panels included, in file order."""
    for panel in dashboard.get("panels", []):
        yield panel
        for nested in panel.get("panels", []):
            yield nested


def expressions(dashboard):
    """(panel title, refId, expr) for every target that has an expr."""
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            expr = target.get("expr")
            if expr is None:
                continue
            for macro, window in MACROS.items():
                expr = expr.replace(macro, window)
            if "$" in expr:
                raise SystemExit(
                    f"panel {panel.get('title')!r} target {target.get('refId')}: "
                    f"unknown Grafana variable in {expr!r}"
                )
            yield panel.get("title", ""), target.get("refId", ""), " ".join(expr.split())


def lint(dashboard):
    """Problems that would make the shipped file fail to import or to query."""
    problems = []
    inputs = {i.get("name"): i for i in dashboard.get("__inputs", [])}
    if inputs.get(DATASOURCE_INPUT, {}).get("pluginId") != "prometheus":
        problems.append(f"__inputs lacks a prometheus datasource named {DATASOURCE_INPUT}")
    if not isinstance(dashboard.get("schemaVersion"), int):
        problems.append("schemaVersion missing")
    if dashboard.get("id") is not None:
        problems.append("id must be null, so an import creates the dashboard")
    want = {"type": "prometheus", "uid": "${" + DATASOURCE_INPUT + "}"}
    ids = set()
    for panel in panels(dashboard):
        title = panel.get("title", "")
        if panel.get("type") == "row":
            continue
        if panel.get("id") in ids:
            problems.append(f"panel {title!r}: duplicate id {panel.get('id')}")
        ids.add(panel.get("id"))
        if panel.get("datasource") != want:
            problems.append(f"panel {title!r}: datasource is not {want}")
        targets = panel.get("targets", [])
        if not targets:
            problems.append(f"panel {title!r}: no targets")
        refs = [t.get("refId") for t in targets]
        if len(set(refs)) != len(refs):
            problems.append(f"panel {title!r}: duplicate refId")
        for target in targets:
            if target.get("datasource") != want:
                problems.append(f"panel {title!r} target {target.get('refId')}: datasource is not {want}")
            if not target.get("expr", "").strip():
                problems.append(f"panel {title!r} target {target.get('refId')}: no expr")
    return problems


def recording_rules_used(dashboard):
    """Names of recording rules (level:metric:operations) the expressions read."""
    names = set()
    for _, _, expr in expressions(dashboard):
        # Not inside label values (`instance="host:9464"`).
        expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
        names.update(re.findall(r"\b[a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_:]*[a-zA-Z0-9_]\b", expr))
    return sorted(names)


def main(argv):
    mode = "tsv"
    if argv and argv[0] in ("--json", "--lint", "--recording-rules"):
        mode = argv.pop(0)[2:]
    if len(argv) != 1:
        raise SystemExit(__doc__)
    with open(argv[0], encoding="utf-8") as f:
        dashboard = json.load(f)
    if mode == "lint":
        problems = lint(dashboard)
        for p in problems:
            print(p)
        return 1 if problems else 0
    if mode == "recording-rules":
        print("\n".join(recording_rules_used(dashboard)))
        return 0
    rows = list(expressions(dashboard))
    if mode == "json":
        json.dump([{"panel": p, "refId": r, "expr": e} for p, r, e in rows], sys.stdout, indent=2)
        print()
    else:
        for row in rows:
            print("\t".join(row))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
