// pg-boss driver for scripts/bench (jobs): N stale active jobs, then one
// maintenance pass — the body of pg-boss's supervisor (`supervise`), whose
// expire step fails every active job past its expire_in: retry with backoff
// while retries remain, else failed and copied to the dead-letter queue.
//
// usage: node pgboss.mjs SOCKET_DIR DATABASE N  -> JSON {seconds, states}
import PgBoss from 'pg-boss'

const [socketDir, database, nArg] = process.argv.slice(2)
const n = Number(nArg)
const boss = new PgBoss({
  host: socketDir, database, user: 'postgres', max: 4,
  supervise: false, schedule: false, migrate: true
})
boss.on('error', (e) => { console.error(e); process.exit(1) })
await boss.start()
await boss.createQueue('bench-dlq')
await boss.createQueue('bench', { retryLimit: 4, retryDelay: 10, retryBackoff: true, deadLetter: 'bench-dlq' })

// Same mix as ours: one job in five has no retry left (dead letter).
for (let i = 0; i < n; i += 10000) {
  const jobs = []
  for (let g = i; g < Math.min(n, i + 10000); g++) {
    jobs.push({
      name: 'bench',
      data: { order: g, customer: 'c-' + (g % 997) },
      retryLimit: g % 5 === 4 ? 0 : 4,
      retryDelay: 10,
      retryBackoff: true,
      deadLetter: 'bench-dlq',
      expireInSeconds: 300
    })
  }
  await boss.insert(jobs)
}
const db = boss.getDb()
// Leased an hour ago by workers that died: active and past expire_in.
await db.executeSql(`UPDATE pgboss.job SET state = 'active', started_on = now() - interval '1 hour'
                      WHERE name = 'bench'`)
await db.executeSql('VACUUM ANALYZE pgboss.job')

const t0 = process.hrtime.bigint()
await boss.maintain()
const seconds = Number(process.hrtime.bigint() - t0) / 1e9

const { rows } = await db.executeSql(`SELECT name, state::text, count(*)::int AS n FROM pgboss.job
                                       GROUP BY 1, 2 ORDER BY 1, 2`)
const states = rows.map((r) => `${r.name}/${r.state}: ${r.n}`).join(', ')
await boss.stop({ graceful: false, wait: true })
console.log(JSON.stringify({ seconds, states }))
