#!/usr/bin/env bash
# Checks that README.md, docs/, the crates' READMEs, systemd/, deploy/, man/,
# the `//!` module docs and the --help texts agree with the tree: cited paths,
# module paths and test names exist, every environment variable the code
# reads is in README's table, every event it logs is in
# docs/metrics-and-logs.md, the `check` samples show today's migration and
# check counts, a figure with a named home (a constant, a count the tree
# holds) is not stated elsewhere with another value, a counted phrase says
# the same number everywhere, and nothing refers to documents or trackers
# outside the repository. Each finding is one line, `file:line: what; what to do`
# (scripts/lib/check_prose.py says exactly what is checked).
#
# Two tests finish the job where a database or the binary is needed:
# `check::command::help_sample_counts_what_check_runs` (the help's number
# of checks against a real run) and
# `cli::man::committed_pages_match_the_cli` (man/ against the CLI).
#
# Usage: scripts/check-prose.sh    exit 0 when nothing is found, 1 otherwise.
# First it proves its figure check can fail: it plants drifts in a scratch
# copy of the tree and stops (exit 1) unless each is found.
# Needs: python3. Starts nothing, builds nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v python3 >/dev/null || { echo "python3 is not installed: apt-get install python3" >&2; exit 1; }
python3 scripts/lib/check_prose.py . --self-test
exec python3 scripts/lib/check_prose.py .
