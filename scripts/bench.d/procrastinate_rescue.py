#!/usr/bin/env python3
"""procrastinate driver for scripts/bench (jobs).

usage: procrastinate_rescue.py CONNINFO N  -> JSON {seconds, states}

Applies procrastinate's schema, makes N jobs `doing` on a worker whose
heartbeat stopped an hour ago, then times procrastinate's documented
stalled-job recipe: `job_manager.get_stalled_jobs()` and
`job_manager.retry_job(job)` for each.
"""
import asyncio
import json
import sys
import time

import warnings

import procrastinate

warnings.simplefilter("ignore")


async def main(conninfo: str, n: int) -> None:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        connector = app.connector
        await connector.execute_query_async(
            "INSERT INTO procrastinate_workers (last_heartbeat) VALUES (now() - interval '1 hour')")
        await connector.execute_query_async(
            """INSERT INTO procrastinate_jobs (queue_name, task_name, args, status, attempts, worker_id)
               SELECT 'bench', 'bench.task',
                      jsonb_build_object('order', g, 'customer', 'c-' || mod(g, 997)),
                      'doing', mod(g, 5), (SELECT max(id) FROM procrastinate_workers)
                 FROM generate_series(1, %(n)s) AS g""", n=n)
        await connector.execute_query_async("ANALYZE procrastinate_jobs")

        t0 = time.perf_counter()
        stalled = await app.job_manager.get_stalled_jobs()
        for job in stalled:
            await app.job_manager.retry_job(job)
        seconds = time.perf_counter() - t0

        rows = await connector.execute_query_all_async(
            "SELECT status::text AS s, count(*) AS n FROM procrastinate_jobs GROUP BY 1 ORDER BY 1")
        states = ", ".join(f"{r['s']}: {r['n']}" for r in rows)
    print(json.dumps({"seconds": seconds, "states": states, "stalled_found": len(stalled)}))


asyncio.run(main(sys.argv[1], int(sys.argv[2])))
