# shellcheck shell=bash
# Throwaway PostgreSQL for the benchmark harness (sourced by scripts/bench).
#
# Same recipe as src/throwaway.rs: initdb into a fresh directory, listen on a
# Unix socket inside it only (no TCP), trust auth, run as `postgres` when we
# are root. Settings are the throwaway's (durability off) plus the memory
# settings the benchmark states in docs/performance.md.

pg_find_bindir() {
    if [[ -n "${PG_BINDIR:-}" ]]; then echo "$PG_BINDIR"; return; fi
    local d
    d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
    if [[ -n "$d" && -x "$d/initdb" ]]; then echo "$d"; return; fi
    dirname "$(command -v initdb)"
}

# The settings every cluster of the harness runs with, one `-c` each.
PG_BENCH_SETTINGS=(
    "listen_addresses="
    "fsync=off"
    "synchronous_commit=off"
    "full_page_writes=off"
    "max_connections=200"
    "unix_socket_permissions=0777"
    "shared_buffers=1GB"
    "work_mem=64MB"
    "maintenance_work_mem=512MB"
    "max_wal_size=8GB"
    "checkpoint_timeout=30min"
    "autovacuum=on"
    "jit=off"
)

# pg_as CMD...: run a server binary as the unprivileged user when root.
pg_as() {
    if [[ $(id -u) == 0 ]]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

# pg_start DIR: initdb + start; sets PGHOST/PGPORT/PGUSER/PGDATABASE exports.
pg_start() {
    local dir=$1
    PG_BIN=$(pg_find_bindir)
    PG_DIR=$dir
    mkdir -p "$dir"
    if [[ $(id -u) == 0 ]]; then chown postgres: "$dir"; fi
    pg_as "$PG_BIN/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; return 1; }
    local opts="-k $dir -p ${PG_PORT:-5432}" s
    for s in "${PG_BENCH_SETTINGS[@]}"; do opts+=" -c $s"; done
    pg_as "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 -o "$opts" start >/dev/null \
        || { tail -20 "$dir/postgres.log" >&2; return 1; }
    export PGHOST=$dir PGPORT=${PG_PORT:-5432} PGUSER=postgres PGDATABASE=postgres
    PG_URL="postgres://postgres@localhost:$PGPORT/postgres?host=$dir"
    export PG_URL PG_BIN PG_DIR
}

pg_stop() {
    [[ -n "${PG_DIR:-}" && -d "$PG_DIR/data" ]] || return 0
    pg_as "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m fast -w stop >/dev/null 2>&1 || true
    rm -rf "$PG_DIR"
}

# psqlq ARGS...: quiet psql that stops on the first error.
psqlq() {
    "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 "$@"
}
