-- One reading of what churn must keep bounded, as `table.name|value` rows
-- (psql -At): the rows, total bytes (heap, indexes, TOAST), dead rows and
-- autovacuum/autoanalyze runs of lock_entry and of every side table the
-- sweeps write or drain (the hand-offs, the takeover outbox, the held count
-- and its deltas), and lock_entry's index bytes. Dead rows and run counts
-- come from the statistics system, so they lag by up to a second.
SELECT 'lock_entry.index_bytes', pg_indexes_size('lock_entry')
UNION ALL SELECT 'lock_entry.rows', count(*) FROM lock_entry
UNION ALL SELECT 'lock_reap_handoff.rows', count(*) FROM lock_reap_handoff
UNION ALL SELECT 'job_reap_handoff.rows', count(*) FROM job_reap_handoff
UNION ALL SELECT 'lock_expiry_outbox.rows', count(*) FROM lock_expiry_outbox
UNION ALL SELECT 'lock_held_delta.rows', count(*) FROM lock_held_delta
UNION ALL SELECT 'lock_held_count.rows', count(*) FROM lock_held_count
UNION ALL
SELECT s.relname || '.' || v.k, v.v
  FROM pg_stat_user_tables AS s
 CROSS JOIN LATERAL (VALUES ('dead_rows', s.n_dead_tup),
                            ('autovacuum_count', s.autovacuum_count),
                            ('autoanalyze_count', s.autoanalyze_count),
                            ('total_bytes', pg_total_relation_size(s.relid))) AS v (k, v)
 WHERE s.relname IN ('lock_entry', 'lock_reap_handoff', 'job_reap_handoff',
                     'lock_expiry_outbox', 'lock_held_delta', 'lock_held_count');
