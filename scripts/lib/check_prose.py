#!/usr/bin/env python3
"""Prose that cannot drift: what README.md, docs/ and the --help texts say,
checked against the tree.

Owns the checks that need no database and no build, each finding printed as
`file:line: what is wrong; what to do`:

  paths      a repository path (`src/…`, `tests/…`, `scripts/…`,
             `migrations/…`, `deploy/…`, `docs/…`, `systemd/…`, `man/…`,
             `debian/…`, `crates/…`; a deep path in no directory of ours is
             another project's; a crate's README may cite its own files from
             the crate's root) or a relative Markdown link that names nothing
             in the tree, in README.md, docs/*.md, crates/*/README.md,
             src/cli.rs, src/cli/pages.rs, systemd/, deploy/ (YAML, mtail, the dashboard's
             JSON), man/ and the `//!` docs of src/; a `#anchor` that names no
             heading of the linked page;
  names      `module::name` in README.md or docs/*.md, where `module` is a
             test module (tests/it/<module>/mod.rs) or a module of src/, naming
             no function or item there, or a test-like name under a module
             that does not exist (a renamed or split test file); a bare
             test-like name (`a_b_c_d_e`, four underscores or more) that
             appears nowhere in the code;
  modules    in the same texts, a `module::item` path (`pg::conn::BEGIN_GUARDED`,
             `crate::sweep::run`, a test's `locks::sweep::backlog_drained_in_one_sweep`)
             whose first part is neither a module of src/ or tests/it nor a
             crate, or whose item its module does not define; in a `//!` doc,
             a module said to own or do something ("(`sweeper` does)") that
             src/ does not have;
  env        an environment variable src/ reads (`env::var("X")`,
             `env::var_os(CONST)` with `const CONST: &str = "X"`, clap's
             `env = "X"`) that README.md's environment table does not list;
  events     an event name src/ logs (the last string literal of an
             `info!`/`warn!`/`error!`/`debug!`/`trace!` call, and the signal
             lines `output/events.rs` writes with `push_head`) that
             docs/metrics-and-logs.md does not mention;
  samples    a sample of `check` output (in src/cli/pages.rs, README.md, docs/)
             whose migration count or latest migration differs from
             migrations/, or whose number of checks differs from the one in
             `check --help` (itself compared with a real run of `check` by
             the test `check::command::help_sample_counts_what_check_runs`);
  figures    a figure with a named home stated elsewhere with another value:
             a numeric constant of src/ or crates/*/src (`BATCH_SIZE`,
             `DRAIN_GRACE`) named next to a number (`BATCH_SIZE` (4,000),
             3 s (`DRAIN_GRACE`)), a phrase that stands for one (`a 1-second
             sweep delay`, `batches of 1,000 jobs`), or a count the tree
             itself holds (`N migrations`, `N definer functions` against the
             least-privilege table); and a counted phrase of FACT_PHRASES
             (`three gates`, `two tuning settings`, `N connections per
             daemon`) that appears with different numbers in different places.
             It reads every text `paths` reads, CHANGELOG.md excepted (its
             entries are history). `--self-test` plants drifts in a scratch
             tree and fails unless each is found;
  package    debian/changelog's latest version, or a `.deb` file name in the
             prose, that is not the version Cargo.toml builds;
  outside    a reference to something outside the repository (a design
             brief's section, a reference document, an issue or a task
             number) anywhere in docs/, src/, tests/, scripts/, systemd/,
             deploy/, man/, debian/, crates/, .ci/, README.md, CHANGELOG.md,
             Cargo.toml, build.rs, the Dockerfile or a migration
             added after this check (applied migrations never change, so the
             ones before it are exempt).

It does not judge style or truth beyond these facts, and it does not run the
binary (the man pages are compared with the CLI by the test
`cli::man::committed_pages_match_the_cli`).

Usage: check_prose.py [REPO] [--only CHECK,…]   exit 0 when nothing is found, 1 otherwise.
       check_prose.py [REPO] --self-test        plant drifts in a scratch copy; exit 1 unless each is found.
"""

import os
import re
import sys
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else ".").resolve()

# Top-level directories whose paths prose may cite.
CITABLE = ("src", "tests", "scripts", "migrations", "sql", "deploy", "docs", "systemd", "man", "debian", "crates")

# Migrations applied before this check existed. Applied migrations never
# change (sqlx compares checksums), so what their comments cite stays.
FROZEN_MIGRATIONS = {
    "20261129000100_lock_leases.sql",
    "20261129000200_job_queue.sql",
    "20261129000300_sweeper_role.sql",
    "20261130000100_lock_rows_never_block.sql",
    "20261130000110_job_rows_never_block.sql",
    "20261130000120_privilege_holes.sql",
    "20261130000300_reap_walk_and_shared_held_count.sql",
    "20261130000400_job_idle_question_in_plpgsql.sql",
    "20261201000200_job_lease_duration.sql",
}

# References to documents and trackers outside the repository. Built from
# parts so that this file does not match itself.
OUTSIDE = re.compile(
    r"\b" + "SP" + r"EC\b"
    r"|\breference/|\breference 0\d+"
    r"|\b[Ii]" + r"ssue ?#?\d+"
    r"|\bT-0\d+"
    r"|(?i:\bthe (?:spec|specification|issue)(?:'s)?\b|\bdesign brief\b|\bsource document\b)"
)
OUTSIDE_FIX = "say the thing itself (what was measured, decided or asked), not where it was written"

# The test that compares `check --help` with a real run of `check`.
CHECK_COUNT_TEST = "cargo test --test it check::command::help_sample_counts_what_check_runs"

findings = []


def find(path, line, what, fix):
    findings.append(f"{path}:{line}: {what}; {fix}")


def rel(p):
    return p.relative_to(ROOT).as_posix()


def read(p):
    return p.read_text(encoding="utf-8", errors="replace")


def prose_files():
    files = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
    return [f for f in files if f.exists()]


def tracked(top):
    """Every file and directory under `top`, as repository paths."""
    out = set()
    base = ROOT / top
    if not base.exists():
        return out
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = [d for d in dirnames if d not in ("target", ".git", "node_modules")]
        d = Path(dirpath)
        out.add(rel(d))
        for f in filenames:
            out.add(rel(d / f))
    return out


ALL_PATHS = set()
for top in CITABLE:
    ALL_PATHS |= tracked(top)


def path_exists(cited):
    cited = cited.rstrip("/")
    # `migrations/20261130000300_…` and `src/*.rs` name a prefix or a glob.
    pattern = cited.replace("…", "*")
    if "*" in pattern:
        return any(fnmatch(p, pattern) for p in ALL_PATHS)
    return cited in ALL_PATHS


# ---- paths ----------------------------------------------------------------------


def foreign(cited):
    """A deep path none of whose directories is ours names another project's
    file (PostgreSQL's `src/interfaces/libpq/test/regress.in`), not a stale
    one of ours: stale paths are files that moved or went away from
    directories that exist, or one level below them."""
    parts = cited.rstrip("/").split("/")
    return len(parts) > 3 and "/".join(parts[:2]) not in ALL_PATHS


PATH_RE = re.compile(
    r"(?<![\w./~-])(?:" + "|".join(CITABLE) + r")/[\w.*…/-]*[\w*…/]"
)
LINK_RE = re.compile(r"\]\(([^)\s]+)\)")
HEADING_RE = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def slug(heading):
    """GitHub's anchor for a heading."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


_anchors = {}


def anchors(path):
    if path not in _anchors:
        seen = {}
        out = set()
        in_code = False
        for line in read(path).splitlines():
            if line.startswith("```"):
                in_code = not in_code
                continue
            m = not in_code and HEADING_RE.match(line)
            if m:
                s = slug(m.group(2))
                n = seen.get(s, 0)
                seen[s] = n + 1
                out.add(s if n == 0 else f"{s}-{n}")
        _anchors[path] = out
    return _anchors[path]


# The command line and its help pages.
CLI_FILES = [ROOT / "src" / "cli.rs", ROOT / "src" / "cli" / "pages.rs"]


def cited_texts():
    """Every file whose words cite the tree, as (file, [(line number, text)],
    markdown?): README.md and docs/*.md, src/cli.rs and src/cli/pages.rs (the help), the crates'
    READMEs, the systemd unit and env file, deploy/ (the YAML, the mtail
    program and the dashboard's JSON, whose descriptions and comments name
    docs and paths), the man pages (roff escapes undone) and the `//!` docs of
    every module of src/."""
    out = [(f, list(enumerate(read(f).splitlines(), 1)), True)
           for f in prose_files() + sorted(ROOT.glob("crates/*/README.md"))]
    for help_file in CLI_FILES:
        out.append((help_file, list(enumerate(read(help_file).splitlines(), 1)), False))
    for top in ("systemd", "deploy"):
        for p in sorted(tracked(top)):
            f = ROOT / p
            if f.is_file():
                out.append((f, list(enumerate(read(f).splitlines(), 1)), False))
    for f in sorted((ROOT / "man").glob("*.1")):
        lines = [(no, re.sub(r"\\\*\(Aq|\\\(aq", "'", line).replace("\\-", "-").replace("\\fB", "").replace("\\fR", ""))
                 for no, line in enumerate(read(f).splitlines(), 1)]
        out.append((f, lines, False))
    for f in sorted((ROOT / "src").rglob("*.rs")):
        docs = [(no, line.strip()[3:]) for no, line in enumerate(read(f).splitlines(), 1)
                if line.strip().startswith("//!")]
        if docs:
            out.append((f, docs, False))
    return out


def check_paths():
    for f, lines, markdown in cited_texts():
        for no, line in lines:
            for m in PATH_RE.finditer(line):
                cited = m.group(0).rstrip(".")
                # `kubectl logs deploy/NAME` names a Deployment, not a path.
                if re.search(r"\bkubectl\b[^`]*\s$", line[:m.start()]) and re.fullmatch(r"deploy/[\w-]+", cited):
                    continue
                if foreign(cited):
                    continue
                # A crate's README cites its own files from the crate's root.
                crate = rel(f).split("/")[:2] if rel(f).startswith("crates/") else None
                if crate and (ROOT.joinpath(*crate) / cited.replace("…", "")).exists():
                    continue
                if not path_exists(cited):
                    find(rel(f), no, f"cites `{cited}`, which is not in the repository",
                         "correct the path (ls -R), or say what it was without the path")
            if not markdown:
                continue
            for m in LINK_RE.finditer(line):
                target = m.group(1)
                if re.match(r"^[a-z]+:", target):
                    continue
                file_part, _, anchor = target.partition("#")
                dest = (f.parent / file_part).resolve() if file_part else f
                if not dest.exists():
                    find(rel(f), no, f"links to `{target}`, which does not exist",
                         "point the link at an existing file")
                    continue
                if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                    find(rel(f), no, f"links to `{target}`, but {rel(dest)} has no heading with that anchor",
                         "link to an existing heading (GitHub's anchor: lower case, spaces to -, punctuation dropped)")


# ---- names ----------------------------------------------------------------------

ITEM_RE = r"(?:fn|const|static|struct|enum|trait|type|mod|macro_rules!)\s+{}\b"


def module_files():
    """src module name -> its files; tests/it module path (`locks::sweep`,
    `locks` for locks/mod.rs) -> its file."""
    src, tests = {}, {}
    for p in (ROOT / "src").rglob("*.rs"):
        name = p.parent.name if p.name == "mod.rs" else p.stem
        src.setdefault(name, []).append(p)
        if p.name == "mod.rs":
            src[name] += [q for q in p.parent.glob("*.rs") if q.name != "mod.rs"]
    it = ROOT / "tests" / "it"
    for p in it.rglob("*.rs"):
        parts = p.relative_to(it).with_suffix("").parts
        if parts == ("main",):
            continue
        tests["::".join(parts[:-1] if parts[-1] == "mod" else parts)] = p
    return src, tests


def test_defines(node, name):
    """Whether a test module defines `name`; a mod.rs also through the files
    beside it, whose items it may re-export (`support::Daemon`)."""
    files = [node] + (sorted(node.parent.glob("*.rs")) if node.name == "mod.rs" else [])
    return any(re.search(ITEM_RE.format(re.escape(name)), read(q)) for q in files)


NAME_RE = re.compile(r"`([a-z_][a-z0-9_]*)::([a-z_][a-z0-9_]*)`")
BARE_RE = re.compile(r"`([a-z][a-z0-9]*(?:_[a-z0-9]+){4,})`")


def check_names():
    src, tests = module_files()
    code = "\n".join(read(p) for p in list((ROOT / "src").rglob("*.rs"))
                     + list((ROOT / "tests").rglob("*.rs"))
                     + list((ROOT / "migrations").glob("*.sql"))
                     + list((ROOT / "sql").rglob("*.sql"))
                     + [p for p in (ROOT / "scripts").rglob("*") if p.is_file()])
    for f in prose_files():
        for no, line in enumerate(read(f).splitlines(), 1):
            for m in NAME_RE.finditer(line):
                module, name = m.groups()
                if module not in tests and module not in src:
                    # A test-like name under a module that is gone (a
                    # renamed or split test file); other `a::b` paths are
                    # another crate's (`serde_json::from_str`).
                    if BARE_RE.fullmatch(f"`{name}`"):
                        homes = sorted(path for path, p in tests.items()
                                       if re.search(r"\bfn " + re.escape(name) + r"\b", read(p)))
                        find(rel(f), no,
                             f"names `{module}::{name}`, but there is no module `{module}`"
                             + (f"; that test is in {rel(tests[homes[0]])}" if homes else ""),
                             f"write `{homes[0]}::{name}`" if homes
                             else "use the current name of the test, or drop the reference")
                    continue
                item = re.compile(ITEM_RE.format(re.escape(name)))
                places = ([tests[module]] if module in tests else []) + src.get(module, [])
                if not (module in tests and test_defines(tests[module], name)) and not any(item.search(read(p)) for p in places):
                    where = ", ".join(rel(p) for p in places)
                    find(rel(f), no, f"names `{module}::{name}`, which is no function or item of {where}",
                         "use the current name (grep -rn 'fn NAME' tests/ src/), or drop the reference")
            for m in BARE_RE.finditer(line):
                name = m.group(1)
                if not re.search(r"\b" + re.escape(name) + r"\b", code):
                    find(rel(f), no, f"names `{name}`, which appears nowhere in src/, tests/, migrations/, sql/ or scripts/",
                         "use the current name of the test or item, or drop the reference")


# ---- module paths -----------------------------------------------------------

# `pg::conn::BEGIN_GUARDED`, `crate::sweep::run`, `lease_sweeper::cli::Cli`.
MODPATH_RE = re.compile(r"`(?:(?:crate|super|self)::)?([a-z_][a-z0-9_]*)((?:::[A-Za-z_][A-Za-z0-9_]*)+)(?:\(\))?`")
# "(`shutdown` does)", "`cmd` owns": how a module's doc names another module.
OWNER_RE = re.compile(r"`([a-z_][a-z0-9_]*)` (?:does|do|owns|own|decides|decide)\b")
DEP_RE = re.compile(r"^([A-Za-z0-9_-]+)\s*=", re.M)


def crates():
    """Names a path may start with that are not modules of ours: std's and
    every dependency's (Cargo.toml's and each workspace crate's)."""
    names = {"std", "core", "alloc", "lease_sweeper"}
    for toml in [ROOT / "Cargo.toml"] + sorted(ROOT.glob("crates/*/Cargo.toml")):
        names.add(toml.parent.name.replace("-", "_"))
        section = None
        for line in read(toml).splitlines():
            if line.startswith("["):
                section = line.strip("[] ")
                continue
            m = DEP_RE.match(line)
            if m and section and section.split(".")[-1] in ("dependencies", "dev-dependencies", "build-dependencies"):
                names.add(m.group(1).replace("-", "_"))
    return names


def module_nodes(name, under=None):
    """The files of every src module called `name` (`check`: src/cmd/check/mod.rs),
    directly in `under` when given, anywhere in src/ otherwise."""
    if under is not None:
        cands = [under / f"{name}.rs", under / name / "mod.rs"]
    else:
        cands = list((ROOT / "src").rglob(f"{name}.rs")) + list((ROOT / "src").rglob(f"{name}/mod.rs"))
        if name == "lease_sweeper":
            cands = [ROOT / "src" / "lib.rs"]
    return [c for c in cands if c.exists() and c.name != "main.rs"]


def children_dir(node):
    return node.parent if node.name in ("mod.rs", "lib.rs") else node.with_suffix("")


def defines(node, name):
    files = [node] + ([q for q in node.parent.glob("*.rs") if q != node] if node.name == "mod.rs" else [])
    # An item, a re-export, or a field or variant of a type declared there.
    item = re.compile(ITEM_RE.format(re.escape(name))
                      + r"|^\s*(?:pub(?:\([^)]*\))?\s+)?use [^;]*\b" + re.escape(name) + r"\b[^;]*;"
                      + r"|^\s*(?:pub(?:\([^)]*\))?\s+)?" + re.escape(name) + r"\b\s*[:({,]", re.M)
    return any(item.search(read(q)) for q in files)


def resolve(first, rest):
    """None when `first::rest…` names a module and item of src/, else what is
    wrong with it."""
    nodes = module_nodes(first)
    for node in nodes:
        ok = True
        for i, seg in enumerate(rest):
            last = i == len(rest) - 1
            sub = module_nodes(seg, children_dir(node))
            if sub and not last:
                node = sub[0]
                continue
            if sub or defines(node, seg):
                if seg[:1].isupper():
                    break  # a type: its methods and variants are not checked
                if last:
                    break
            ok = False
            break
        if ok:
            return None
    return f"no item `{'::'.join(rest)}` in module `{first}` ({', '.join(rel(n) for n in nodes)})"


def check_module_paths():
    """`module::item` paths in every cited text (the prose's two-part
    lower-case ones are check_names'), and the modules a `//!` doc says own
    or do something."""
    _, tests = module_files()
    known = crates()
    prose = set(prose_files())
    for f, lines, _ in cited_texts():
        for no, line in lines:
            for m in MODPATH_RE.finditer(line):
                first, rest = m.group(1), m.group(2).split("::")[1:]
                if f in prose and NAME_RE.fullmatch(m.group(0)):
                    continue
                if first in known and first != "lease_sweeper":
                    continue
                # A test's path (`locks::sweep::NAME`, tests/it/locks/sweep.rs)
                # may start like a src module's (src/cmd/jobs/ beside
                # tests/it/jobs/): either may hold the item.
                test_module = "::".join([first] + rest[:-1])
                if test_module in tests and test_defines(tests[test_module], rest[-1]):
                    continue
                if test_module in tests and not (module_nodes(first) and resolve(first, rest) is None):
                    find(rel(f), no, f"names `{m.group(0).strip('`')}`, which is no function or item of {rel(tests[test_module])}",
                         "use the current name (grep -rn 'fn NAME' tests/), or drop the reference")
                    continue
                if not module_nodes(first):
                    if first in tests:
                        find(rel(f), no, f"names `{m.group(0).strip('`')}`, which is no module or item of tests/it/{first}/",
                             "use the current path (ls -R tests/it), or drop the reference")
                    elif first not in PRIMITIVES and not (ROOT / "tests" / "it" / first).is_dir():
                        find(rel(f), no, f"names `{m.group(0).strip('`')}`, but src/ has no module `{first}` and no crate is called that",
                             "use the module's current path (ls src/), or drop the reference")
                    continue
                why = resolve(first, rest)
                if why:
                    find(rel(f), no, f"names `{m.group(0).strip('`')}`: {why}",
                         "use the current path (grep -rn 'fn NAME\\|const NAME' src/), or drop the reference")
            if f.suffix == ".rs":
                for m in OWNER_RE.finditer(line):
                    name = m.group(1)
                    if not module_nodes(name) and name not in known and name not in SUBCOMMANDS:
                        find(rel(f), no, f"says `{name}` owns or does something, but src/ has no module `{name}`",
                             "name the module that does it now (ls src/), e.g. `sweep::run`")


PRIMITIVES = {"i8", "i16", "i32", "i64", "i128", "isize", "u8", "u16", "u32", "u64", "u128", "usize",
              "f32", "f64", "str", "char", "bool"}
SUBCOMMANDS = {"run", "migrate", "check", "jobs", "gates", "leases", "alive", "demo"}


# ---- env ------------------------------------------------------------------------

ENV_LITERAL = re.compile(r"env::var(?:_os)?\(\s*\"([A-Z][A-Z0-9_]*)\"")
ENV_CONST = re.compile(r"env::var(?:_os)?\(\s*([A-Z][A-Z0-9_]*)\s*\)")
CLAP_ENV = re.compile(r"\benv\s*=\s*\"([A-Z][A-Z0-9_]*)\"")
CONST_DEF = re.compile(r"const\s+([A-Z][A-Z0-9_]*)\s*:\s*&(?:'static\s+)?str\s*=\s*\"([A-Z][A-Z0-9_]*)\"")


def code_lines(p):
    """A source file's lines up to its unit tests (tests' own variables are exempt)."""
    for no, line in enumerate(read(p).splitlines(), 1):
        if line.startswith("#[cfg(test)]"):
            return
        yield no, line


def readme_env_table():
    """Names in the first column of README.md's environment table, and its line."""
    names, first = set(), None
    in_env = False
    for no, line in enumerate(read(ROOT / "README.md").splitlines(), 1):
        if line.startswith("#"):
            in_env = "Environment" in line
            continue
        if in_env and line.startswith("|"):
            first = first or no
            names |= set(re.findall(r"`([A-Z][A-Z0-9_]*)`", line.split("|")[1]))
    return names, first


def check_env():
    listed, table_line = readme_env_table()
    consts = {}
    for p in (ROOT / "src").rglob("*.rs"):
        for m in CONST_DEF.finditer(read(p)):
            consts[m.group(1)] = m.group(2)
    for p in sorted((ROOT / "src").rglob("*.rs")):
        for no, line in code_lines(p):
            names = ENV_LITERAL.findall(line) + CLAP_ENV.findall(line)
            names += [consts[c] for c in ENV_CONST.findall(line) if c in consts]
            for name in names:
                if name not in listed:
                    find(rel(p), no, f"reads the environment variable {name}, which README.md's environment table does not list",
                         f"add a row for `{name}` (what it does, its default) to the table at README.md:{table_line}")


# ---- events ---------------------------------------------------------------------

LOG_MACRO = re.compile(r"\b(?:tracing::)?(info|warn|error|debug|trace)!\s*\(")
STRING = re.compile(r"\"((?:[^\"\\]|\\.)*)\"")
SIGNAL = re.compile(r"push_head\([^)]*\"([a-z_]+)\"\s*\)")


def macro_body(text, start):
    """The text of a macro call's arguments, from just after its `(`."""
    depth, i, in_str = 1, start, False
    while i < len(text) and depth:
        c = text[i]
        if in_str:
            if c == "\\":
                i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        i += 1
    return text[start:i - 1]


SIGNAL_CONST = re.compile(r"(?:warn|info)_lines\(\s*([A-Z][A-Z0-9_]*)")
SERVICE_CONST = re.compile(r"const (NAME|WORK): &'static str = \"([a-z_]+)\"")


def emitted_events():
    """(event, file, line) for every event name src/ logs.

    The service loop (src/sweep/mod.rs) names its events after each
    service, `"{}_failed"` with the service's WORK or NAME: each template is
    expanded with every service's value."""
    services = {"NAME": [], "WORK": []}
    for p in (ROOT / "src" / "sweep").glob("*.rs"):
        for kind, value in SERVICE_CONST.findall(read(p)):
            services[kind].append(value)
    consts = {}
    for p in (ROOT / "src").rglob("*.rs"):
        for m in re.finditer(r"const ([A-Z][A-Z0-9_]*): &(?:'static )?str = \"([a-z_]+)\"", read(p)):
            consts[m.group(1)] = m.group(2)
    out = []
    for p in sorted((ROOT / "src").rglob("*.rs")):
        text = read(p)
        cut = text.find("\n#[cfg(test)]")
        if cut >= 0:
            text = text[:cut]

        def at(pos):
            return text.count("\n", 0, pos) + 1

        for m in LOG_MACRO.finditer(text):
            body = macro_body(text, m.end())
            strings = list(STRING.finditer(body))
            if not strings:
                continue
            name = strings[-1].group(1)
            if re.fullmatch(r"[a-z][a-z0-9_]*", name):
                out.append((name, p, at(m.start())))
            elif re.fullmatch(r"\{\}_[a-z0-9_]+", name):
                tail = body[strings[-1].end():]
                kind = "NAME" if re.search(r"\bNAME\b", tail) else "WORK"
                for value in services[kind]:
                    out.append((value + name[2:], p, at(m.start())))
        for m in SIGNAL.finditer(text):
            out.append((m.group(1), p, at(m.start())))
        for m in SIGNAL_CONST.finditer(text):
            if m.group(1) in consts:
                out.append((consts[m.group(1)], p, at(m.start())))
    return out


def check_events():
    catalogue = ROOT / "docs" / "metrics-and-logs.md"
    doc = read(catalogue)
    seen = set()
    for name, p, no in emitted_events():
        if name in seen:
            continue
        seen.add(name)
        if not re.search(r"(?:`|message=)" + re.escape(name) + r"\b", doc):
            find(rel(p), no, f"logs the event `{name}`, which {rel(catalogue)} does not mention",
                 f"describe `{name}` (level, fields, what an operator does about it) in {rel(catalogue)}")


# ---- samples --------------------------------------------------------------------

APPLIED_RE = re.compile(r"all (\d+) applied \(latest (\d{14})\)")
CHECKS_RE = re.compile(r"(?:of|all) (\d+) checks\b")


def check_samples():
    ups = sorted(p.name for p in (ROOT / "migrations").glob("*.sql") if not p.name.endswith(".down.sql"))
    count, latest = len(ups), ups[-1].split("_", 1)[0] if ups else ""
    cli = ROOT / "src" / "cli" / "pages.rs"
    helped = [int(n) for n in CHECKS_RE.findall(read(cli))]
    files = CLI_FILES + prose_files()
    for f in files:
        for no, line in enumerate(read(f).splitlines(), 1):
            for m in APPLIED_RE.finditer(line):
                n, t = int(m.group(1)), m.group(2)
                if (n, t) != (count, latest):
                    find(rel(f), no, f"shows `all {n} applied (latest {t})`, but migrations/ holds {count}, the latest {latest}",
                         f"write `all {count} applied (latest {latest})`")
            if f in CLI_FILES or not helped:
                continue
            for m in CHECKS_RE.finditer(line):
                if int(m.group(1)) != helped[0]:
                    find(rel(f), no, f"shows {m.group(1)} checks, but `lease-sweeper check --help` shows {helped[0]}",
                         f"write {helped[0]} (the help's number is compared with a real run by `{CHECK_COUNT_TEST}`)")
    if not helped:
        find(rel(cli), 1, "the `check` help has no sample with its number of checks (`of N checks`)",
             "show a sample verdict line in CHECK_HELP")


# ---- figures --------------------------------------------------------------------

WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
         "nine": 9, "ten": 10, "eleven": 11, "twelve": 12}
# A number as prose writes it: 5,000, 5_000, 2.5, or a word up to twelve;
# never the second half of a range (15–46) or of a version (0.9).
NUM = r"(?<![\d.,_–-])(\d{1,3}(?:[,_]\d{3})+|\d+(?:\.\d+)?|" + "|".join(WORDS) + r")(?![\d_]|[.,]\d)"
UNIT = r"(?:[- ]?(ms|milliseconds?|s|secs?|seconds?|min|minutes?|h|hours?|KiB|MiB|bytes?)\b)?"
TIME_UNITS = {"ms": 0.001, "millisecond": 0.001, "milliseconds": 0.001, "s": 1, "sec": 1, "secs": 1,
              "second": 1, "seconds": 1, "min": 60, "minute": 60, "minutes": 60, "h": 3600,
              "hour": 3600, "hours": 3600}
SIZE_UNITS = {"KiB": 1024, "MiB": 1024 * 1024, "byte": 1, "bytes": 1}


def number(text):
    text = text.lower()
    if text in WORDS:
        return WORDS[text]
    return float(text.replace(",", "").replace("_", ""))


CONST_RE = re.compile(
    r"^\s*(?:pub(?:\([^)]*\))?\s+)?const\s+([A-Z][A-Z0-9_]*)\s*:\s*(usize|u8|u16|u32|u64|i16|i32|i64|Duration)\s*=\s*([^;]+);",
    re.M)
MACRO_RE = re.compile(r"macro_rules!\s+(\w+)\s*\{\s*\(\)\s*=>\s*\{\s*([\d_]+)\s*\};?\s*\}", re.S)


def constants(root):
    """Every numeric constant of src/ and crates/*/src, up to each file's unit
    tests: name -> (value, "time" | "count", where). Durations are in seconds;
    a name defined twice with different values is left out (it names two
    things)."""
    out, clash = {}, set()
    files = sorted(root.glob("src/**/*.rs")) + sorted(root.glob("crates/*/src/**/*.rs"))
    for p in files:
        text = read(p)
        cut = text.find("\n#[cfg(test)]")
        text = text if cut < 0 else text[:cut]
        macros = {m.group(1): m.group(2) for m in MACRO_RE.finditer(text)}
        for m in CONST_RE.finditer(text):
            name, ty, expr = m.group(1), m.group(2), m.group(3).strip()
            expr = re.sub(r"(\w+)!\(\)", lambda x: macros.get(x.group(1), x.group(0)), expr)
            if ty == "Duration":
                d = re.fullmatch(r"Duration::from_(secs|millis)\(([\d_]+)\)", expr)
                if not d:
                    continue
                value, kind = int(d.group(2).replace("_", "")) * (1 if d.group(1) == "secs" else 0.001), "time"
            else:
                if not re.fullmatch(r"[\d_]+(?:\s*\*\s*[\d_]+)*", expr):
                    continue
                value = 1
                for factor in expr.split("*"):
                    value *= int(factor.strip().replace("_", ""))
                kind = "count"
            where = f"{p.relative_to(root).as_posix()}:{text.count(chr(10), 0, m.start()) + 1}"
            if name in out and out[name][0] != value:
                clash.add(name)
            out[name] = (value, kind, where)
    return {k: v for k, v in out.items() if k not in clash}


def stated(value_text, unit, kind):
    """The value a mention states, in the constant's units, or None when it
    cannot be compared (a duration given without a unit)."""
    n = number(value_text)
    if kind == "time":
        return n * TIME_UNITS[unit] if unit in TIME_UNITS else None
    if unit in TIME_UNITS:
        return None
    return n * SIZE_UNITS.get(unit, 1)


def shown(value, kind):
    if kind == "time":
        return f"{value:g} s" if value >= 1 else f"{value * 1000:g} ms"
    return f"{value:,}"


# Phrases that stand for a constant without naming it.
CONST_PHRASES = [
    (re.compile(NUM + r"[- ](?:s|second)s?\b(?: sweep)? delay\b", re.I), "SWEEP_DELAY", "s"),
    (re.compile(r"\bsweep delay \(" + NUM + r" ?(s|ms)\)", re.I), "SWEEP_DELAY", None),
    (re.compile(NUM + r"[- ](?:s|second) drain grace\b", re.I), "DRAIN_GRACE", "s"),
    (re.compile(r"\b(?:batch(?:es)? of (?:up to |at most )?|transactions of at most )" + NUM + r" jobs\b", re.I),
     "JOB_BATCH_SIZE", ""),
    (re.compile(NUM + r" jobs a batch\b", re.I), "JOB_BATCH_SIZE", ""),
]

# Counted phrases that must say the same number wherever they appear; a
# phrase whose number the tree holds is compared with that instead.
FACT_PHRASES = [
    # "the first two gates" counts part of them, not all.
    ("gates", re.compile(r"(?<!first )(?<!other )(?<!last )" + NUM + r" (?:operator |queue )?gates\b", re.I)),
    ("tuning settings", re.compile(NUM + r" tuning settings\b", re.I)),
    ("settings `gates` shows", re.compile(NUM + r" settings\b(?! of)", re.I)),
    ("connections per daemon", re.compile(
        r"\b(?:each|a|every) daemon (?:holds|pins|uses|opens|keeps) " + NUM + r" (?:server |client |database )?connections\b", re.I)),
    ("connections per daemon", re.compile(NUM + r" (?:server |client |database )?connections (?:per|for each|each) daemon\b", re.I)),
    ("connections per daemon", re.compile(r"\b(?:pool|pools) for " + NUM + r" per daemon\b", re.I)),
    ("migrations", re.compile(NUM + r" migrations\b", re.I)),
    ("definer functions", re.compile(NUM + r" (?:SECURITY DEFINER|definer) functions\b", re.I)),
]


def fact_truths(root):
    """The counts the tree itself holds, by FACT_PHRASES name."""
    out = {}
    ups = [p for p in (root / "migrations").glob("*.sql") if not p.name.endswith(".down.sql")]
    if ups:
        out["migrations"] = (len(ups), "migrations/ holds")
    lp = root / "docs" / "least-privilege.md"
    if lp.exists():
        section = next((s for s in read(lp).split("\n## ") if s.startswith("2. ")), "")
        rows = [l for l in section.splitlines() if l.startswith("| `") and "SECURITY DEFINER" in l]
        if rows:
            out["definer functions"] = (len(rows), "docs/least-privilege.md §2 grants the role")
    return out


def figure_texts():
    """(file, [(line number, text)]) of every shipped text: what `paths` reads."""
    return [(f, lines) for f, lines, _ in cited_texts()]


def check_figures():
    consts = constants(ROOT)
    truths = fact_truths(ROOT)
    seen = {}  # FACT_PHRASES name -> {number: first (file, line)}
    for f, lines in figure_texts():
        for i, (no, first) in enumerate(lines):
            # A figure may be wrapped onto the next line (`BATCH_SIZE`\n(5,000)):
            # read the pair, keep what starts on this one.
            line = first + " " + (lines[i + 1][1].strip() if i + 1 < len(lines) else "")
            cut = len(first)
            for name, (value, kind, where) in consts.items():
                if name not in line:
                    continue
                n = re.escape(name)
                after = re.compile(r"(?<![A-Za-z0-9_])" + n + r"(?![A-Za-z0-9_])`?\)?\s*(?:[(=:]\s*)?(?:(?:stays|is|of|at)\s+)?~?"
                                   + NUM + r"\s?" + UNIT)
                before = re.compile(NUM + r"\s?" + UNIT + r"\s*\(?`?" + n + r"(?![A-Za-z0-9_])")
                for m in list(after.finditer(line)) + list(before.finditer(line)):
                    if m.start() >= cut:
                        continue
                    got = stated(m.group(1), m.group(2) or "", kind)
                    if got is not None and abs(got - value) > 1e-9:
                        find(rel(f), no, f"states `{name}` as {m.group(1)}{' ' + m.group(2) if m.group(2) else ''}, but {where} makes it {shown(value, kind)}",
                             f"write {shown(value, kind)}, or name the figure without the constant if it is another one")
            for rx, name, unit in CONST_PHRASES:
                if name not in consts:
                    continue
                value, kind, where = consts[name]
                for m in rx.finditer(line):
                    if m.start() >= cut:
                        continue
                    u = m.group(2) if unit is None else unit
                    got = stated(m.group(1), u, kind)
                    if got is not None and abs(got - value) > 1e-9:
                        find(rel(f), no, f"`{m.group(0)}` stands for `{name}`, which {where} makes {shown(value, kind)}",
                             f"write {shown(value, kind)}")
            for name, rx in FACT_PHRASES:
                for m in rx.finditer(line):
                    if m.start() >= cut:
                        continue
                    text = next((g for g in m.groups() if g), None)
                    if text is None:
                        continue
                    n = number(text)
                    if name in truths:
                        want, source = truths[name]
                        if n != want:
                            find(rel(f), no, f"says `{m.group(0)}`, but {source} {want}",
                                 f"write {want}, or drop the count and link to where it is listed")
                        continue
                    seen.setdefault(name, {}).setdefault(n, (rel(f), no, m.group(0)))
    for name, numbers in seen.items():
        if len(numbers) < 2:
            continue
        places = "; ".join(f"`{t}` at {p}:{l}" for _, (p, l, t) in sorted(numbers.items()))
        for n, (p, l, t) in sorted(numbers.items()):
            find(p, l, f"says `{t}`, but the same count of {name} is stated with another number elsewhere ({places})",
                 "make them agree (one of them has drifted), and keep the count in one place")


# ---- package --------------------------------------------------------------------

DEB_RE = re.compile(r"lease-sweeper_(\d[\w.~+]*)-(\d+)_amd64\.deb")


def check_package():
    cargo = read(ROOT / "Cargo.toml")
    version = re.search(r'^version\s*=\s*"([^"]+)"', cargo, re.M).group(1)
    revision = "1"
    m = re.search(r'^revision\s*=\s*"([^"]*)"', cargo, re.M)
    if m:
        revision = m.group(1)
    want = f"{version}-{revision}"
    changelog = ROOT / "debian" / "changelog"
    if changelog.exists():
        first = read(changelog).splitlines()[0]
        m = re.match(r"lease-sweeper \(([^)]+)\)", first)
        if not m or m.group(1) != want:
            find(rel(changelog), 1, f"the latest entry is `{first}`, but Cargo.toml makes the package {want}",
                 f"add an entry `lease-sweeper ({want}) unstable; urgency=medium` on top (dch -v {want})")
    for f in prose_files():
        for no, line in enumerate(read(f).splitlines(), 1):
            for m in DEB_RE.finditer(line):
                if f"{m.group(1)}-{m.group(2)}" != want:
                    find(rel(f), no, f"names the package `{m.group(0)}`, but Cargo.toml builds lease-sweeper_{want}_amd64.deb",
                         f"write lease-sweeper_{want}_amd64.deb")


# ---- outside --------------------------------------------------------------------

OUTSIDE_ROOTS = ("docs", "src", "tests", "scripts", "systemd", "deploy", "man", "debian", ".ci", "crates")
OUTSIDE_FILES = ("README.md", "CHANGELOG.md", "Cargo.toml", "build.rs", "Dockerfile")
SELF = {"scripts/lib/check_prose.py", "scripts/check-prose.sh"}


def check_outside():
    files = [ROOT / f for f in OUTSIDE_FILES if (ROOT / f).exists()]
    for top in OUTSIDE_ROOTS:
        for p in sorted(tracked(top)):
            if (ROOT / p).is_file():
                files.append(ROOT / p)
    files += [p for p in sorted((ROOT / "migrations").glob("*.sql")) if p.name not in FROZEN_MIGRATIONS]
    files += sorted((ROOT / "sql").rglob("*.sql"))
    for f in files:
        if rel(f) in SELF or f.suffix in (".png", ".gz"):
            continue
        for no, line in enumerate(read(f).splitlines(), 1):
            m = OUTSIDE.search(line)
            if m:
                find(rel(f), no, f"refers outside the repository (`{m.group(0).strip()}`)", OUTSIDE_FIX)


# The drifts `--self-test` plants in a scratch copy of the tree, each as
# (file, text appended, what the finding must say).
PLANTED = [
    ("README.md", "\nEach lock batch holds `BATCH_SIZE` (4,000) leases.\n", "states `BATCH_SIZE` as 4,000"),
    ("docs/operations.md", "\nA sweep waits 5 s\n(`DRAIN_GRACE`) for its batch.\n", "states `DRAIN_GRACE` as 5 s"),
    ("docs/reliability.md", "\nThe role runs 3 definer functions.\n", "says `3 definer functions`"),
    ("docs/container.md", "\nThe reaper obeys the four gates.\n", "says `four gates`"),
    ("systemd/lease-sweeper.service", "\n# a 2-second sweep delay\n", "stands for `SWEEP_DELAY`"),
    ("src/notify.rs", None, "states `JOB_BATCH_SIZE` as 10, but"),
]
# What the figure check reads, copied for the self-test.
SCRATCH = ("README.md", "docs", "src", "crates", "systemd", "deploy", "man", "migrations")


def self_test():
    """Copies the tree's texts to a scratch directory, checks the copy finds no
    figure drift, plants each drift of PLANTED and checks each is found."""
    import shutil
    import subprocess
    import tempfile
    me = Path(__file__).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        for top in SCRATCH:
            src = ROOT / top
            if src.is_dir():
                shutil.copytree(src, scratch / top, ignore=shutil.ignore_patterns("target", ".git"))
            elif src.exists():
                shutil.copy2(src, scratch / top)

        def figures():
            run = subprocess.run([sys.executable, str(me), str(scratch), "--only", "figures"],
                                 capture_output=True, text=True)
            return run.returncode, run.stdout

        rc, out = figures()
        clean = [l for l in out.splitlines() if not l.startswith("check-prose:")]
        failures = []
        for path, text, want in PLANTED:
            f = scratch / path
            if text is None:
                # a module doc: inserted after the first `//!` line
                lines = read(f).splitlines(True)
                at = next(i for i, l in enumerate(lines) if l.startswith("//!")) + 1
                lines.insert(at, "//! reaps in batches of `JOB_BATCH_SIZE` (10 jobs).\n")
                f.write_text("".join(lines), encoding="utf-8")
            else:
                f.write_text(read(f) + text, encoding="utf-8")
        rc2, out2 = figures()
        for path, _, want in PLANTED:
            if not any(l.startswith(path + ":") and want in l for l in out2.splitlines()):
                failures.append(f"planted in {path}, not found: {want}")
        if rc2 != 1:
            failures.append(f"the planted tree exited {rc2}, not 1")
    for line in failures:
        print(f"check-prose self-test: {line}")
    print(f"check-prose self-test: {len(PLANTED) - len([x for x in failures if x.startswith('planted')])} of "
          f"{len(PLANTED)} planted drifts found" + (f"; the unplanted copy had {len(clean)} figure finding(s)" if clean else ""))
    return 1 if failures else 0


CHECKS = {"paths": check_paths, "names": check_names, "modules": check_module_paths, "env": check_env,
          "events": check_events, "samples": check_samples, "figures": check_figures,
          "package": check_package, "outside": check_outside}


def main():
    args = sys.argv[2:]
    if "--self-test" in args:
        return self_test()
    only = args[args.index("--only") + 1].split(",") if "--only" in args else list(CHECKS)
    for name in only:
        CHECKS[name]()
    for f in findings:
        print(f)
    verdict = "fix each as its line says" if findings else "README.md, docs/ and --help agree with the tree"
    print(f"check-prose: {len(findings)} finding(s); {verdict}")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
