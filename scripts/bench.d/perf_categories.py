#!/usr/bin/env python3
"""Sums a flat `perf report` into CPU milliseconds by process and by kind of work.

    perf_categories.py HZ REPORT.txt [REPORT.txt ...]

Each REPORT.txt is the output of
`perf report -n --no-children --sort comm,dso,sym --stdio -g none --percent-limit 0`
for one measured run. Prints one JSON object per report: samples turned into
milliseconds at the sampling frequency HZ, per process name (`comm`), per
category of the database backend's work (first matching pattern below wins)
and the top symbols of each process. Categories are the questions
docs/performance.md asks of the profile, not a full taxonomy.
"""

import json
import re
import sys
from collections import Counter

# (category, pattern on "dso sym"), tried in order.
CATEGORIES = [
    ("row lock (heap_lock_tuple)", r"heap_lock_tuple|heap_acquire_tuplock|compute_new_xmax_infomask|MultiXact"),
    ("delete (heap_delete, index)", r"heap_delete|index_delete|_bt_|btree"),
    ("fetch by tuple id / scan", r"heap_fetch|TidNext|TidRangeNext|heap_getnextslot|heapgettup|heap_prepare_pagescan|ExecScan|SeqNext|IndexNext|index_getnext|heap_hot_search|HeapTupleSatisfies|heapam_index_fetch|heap_page_prune"),
    ("WAL", r"XLog|pg_comp_crc32c|log_heap"),
    ("function result (tuplestore, plpgsql)", r"tuplestore|plpgsql|exec_stmt|exec_eval|ExecMakeTableFunctionResult|SPI_|_SPI"),
    ("output (printtup, send)", r"printtup|pq_putmessage|pq_flush|pq_send|pq_beginmessage|pq_endmessage|internal_flush|secure_write|sendmsg|sock_write_iter"),
    ("parse, plan", r"raw_parser|base_yyparse|core_yylex|parse_analyze|transform|pg_analyze|planner|pg_plan|subquery_planner|grouping_planner|query_planner|make_one_rel|create_plan|set_base_rel|add_paths|cost_|get_relation_info|eval_const|expression_tree_walker|fmgr_sql|init_sql_fcache|RevalidateCachedQuery|GetCachedPlan|CreateCachedPlan|pg_rewrite|QueryRewrite|fetch_upper_rel"),
    ("memory (palloc, contexts)", r"palloc|MemoryContext|AllocSet|pfree|repalloc"),
    ("snapshot, transaction, locks", r"GetSnapshotData|GetTransactionSnapshot|StartTransaction|CommitTransaction|AbortTransaction|LockAcquire|LockRelease|LWLock|ProcArray|AtEOXact|ResourceOwner|RecordTransaction|TransactionId|xact"),
    ("statistics (pgstat)", r"pgstat|pgstat_report|pg_stat"),
    ("catalog, syscache", r"SearchCatCache|SearchSysCache|catcache|relcache|RelationIdGetRelation|hash_search|hash_bytes|hash_any|LookupTypeCache|oid_hash"),
    ("executor, expressions, tuples", r"Exec|slot_|tts_|heap_form|heap_fill|heap_deform|nocachegetattr|heap_compute_data_size|fmgr|FunctionCall|PortalRun|PortalStart|CreatePortal|standard_Executor|Executor"),
    ("type output (text, numbers)", r"out$|enlargeStringInfo|appendStringInfo|appendBinaryStringInfo|pq_begintypsend|pq_sendtext|pq_sendcountedtext"),
    ("libc (copies, malloc)", r"libc\.so|\[vdso\]"),
    ("kernel: wake-up, socket read, scheduling", r"\[kernel|epoll|WaitEventSet|WaitLatch|secure_read|pq_getbyte|ReadCommand|recv|futex|schedule|pv_native"),
]
COMPILED = [(name, re.compile(pat)) for name, pat in CATEGORIES]
LINE = re.compile(r"^\s*([\d.]+)%\s+(\d+)\s+(\S+)\s+(\S+)\s+\[[.k]\]\s+(.*)$")


def categorise(dso: str, sym: str) -> str:
    text = f"{dso} {sym}"
    if dso.startswith("[kernel"):
        text = f"[kernel] {sym}"
    for name, pat in COMPILED:
        if pat.search(text):
            return name
    if sym.startswith("0x"):
        return "unresolved (static functions)"
    return "other"


def summarise(path: str, hz: float) -> dict:
    per_comm: Counter = Counter()
    per_cat: Counter = Counter()
    per_sym: dict = {}
    for line in open(path, encoding="utf-8", errors="replace"):
        m = LINE.match(line)
        if not m:
            continue
        _pct, samples, comm, dso, sym = m.groups()
        ms = int(samples) * 1000.0 / hz
        per_comm[comm] += ms
        if comm == "postgres":
            per_cat[categorise(dso, sym.strip())] += ms
        per_sym.setdefault(comm, Counter())[f"{sym.strip()} ({dso})"] += ms
    return {
        "file": path,
        "ms_by_process": {k: round(v, 1) for k, v in per_comm.most_common()},
        "backend_ms_by_kind": {k: round(v, 1) for k, v in per_cat.most_common()},
        "top_symbols": {
            comm: [[s, round(v, 1)] for s, v in c.most_common(12)]
            for comm, c in per_sym.items()
            if comm in ("postgres", "lease-sweeper", "psql", "pgbench", "tokio-runtime-w")
        },
    }


def main() -> None:
    hz = float(sys.argv[1])
    for path in sys.argv[2:]:
        print(json.dumps(summarise(path, hz)))


if __name__ == "__main__":
    main()
