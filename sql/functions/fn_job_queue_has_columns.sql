-- Whether job_queue, as the caller's search path finds it, has every column
-- named in p_columns. A queue adopted as its own tool made it may lack the
-- columns this project's stand-in adds (the lease each claim gave, who
-- reaped a job); the reaper, the dry run and `migrate`'s grants ask this,
-- and take the statement that fits. PL/pgSQL plans a statement when it
-- first runs, so the branch not taken never needs the columns.
CREATE OR REPLACE FUNCTION fn_job_queue_has_columns(p_columns name[])
 RETURNS boolean
 LANGUAGE sql
 STABLE
AS $function$
    SELECT pg_catalog.count(*) OPERATOR(pg_catalog.=) pg_catalog.cardinality(p_columns)
      FROM pg_catalog.pg_attribute AS a
     WHERE a.attrelid OPERATOR(pg_catalog.=) 'job_queue'::pg_catalog.regclass
       AND a.attname OPERATOR(pg_catalog.=) ANY (p_columns)
       AND NOT a.attisdropped
$function$;
