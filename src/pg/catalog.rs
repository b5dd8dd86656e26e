//! What the preflight (`cmd::check`) asks PostgreSQL's catalogs: who this
//! session is, which migrations are applied, whether each table, index and
//! function is visible, which privileges the role lacks, and who owns the
//! SECURITY DEFINER functions.
//!
//! Owns the statement texts and decoding their rows into plain values. It
//! owns no wording, no verdict and no transactions: `cmd::check` runs each
//! function in its own guarded transaction (`conn::in_tx`) and decides what
//! a result means for the operator. It changes nothing.
//!
//! Every name in these statements is qualified with `pg_catalog` and every
//! operator spelled `OPERATOR(pg_catalog.…)`: the preflight may run against a
//! database where a hostile overload already sits on the search path (the
//! very thing `PLANTED_OVERLOADS` looks for), and an unqualified `=` or
//! function call could resolve to it.

use sqlx::{FromRow, PgConnection};

/// Who this session is: its role, the server's version, and whether the
/// role is a superuser (every privilege check passes for one, which is worth
/// saying: the preflight would then prove nothing about the grants).
pub const SESSION: &str = "
SELECT current_user::text, pg_catalog.current_setting('server_version'),
       (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) current_user)";

/// The connected session, as `SESSION` tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub role: String,
    pub server_version: String,
    pub superuser: bool,
}

pub async fn session(conn: &mut PgConnection) -> Result<Session, sqlx::Error> {
    let (role, server_version, superuser): (String, String, Option<bool>) = sqlx::query_as(SESSION)
        .persistent(false)
        .fetch_one(&mut *conn)
        .await?;
    Ok(Session {
        role,
        server_version,
        // NULL only if the role vanished mid-statement: not a superuser.
        superuser: superuser.unwrap_or(false),
    })
}

/// sqlx's bookkeeping table as this role's search path resolves it; NULL
/// when it is not there, i.e. nothing was ever migrated (asked first, so
/// that case reads "none applied" instead of a missing-relation error).
pub const MIGRATIONS_TABLE: &str =
    "SELECT pg_catalog.to_regclass('lease_sweeper_migrations')::text";

/// Whether `lease_sweeper_migrations` is visible to this role.
pub async fn migrations_table_exists(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
    let table: Option<String> = sqlx::query_scalar(MIGRATIONS_TABLE)
        .persistent(false)
        .fetch_one(&mut *conn)
        .await?;
    Ok(table.is_some())
}

/// Every migration the database records, applied or failed, with the
/// checksum it was applied with (compared with the binary's own).
pub const APPLIED_MIGRATIONS: &str =
    "SELECT version, success, checksum FROM lease_sweeper_migrations";

/// One row of `lease_sweeper_migrations`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedMigration {
    pub version: i64,
    /// False when the migration failed part-way (sqlx records that).
    pub success: bool,
    pub checksum: Vec<u8>,
}

/// The rows of `lease_sweeper_migrations`; fails with SQLSTATE 42501 when the role
/// may not read it.
pub async fn applied_migrations(
    conn: &mut PgConnection,
) -> Result<Vec<AppliedMigration>, sqlx::Error> {
    let rows: Vec<(i64, bool, Vec<u8>)> = sqlx::query_as(APPLIED_MIGRATIONS)
        .persistent(false)
        .fetch_all(&mut *conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(version, success, checksum)| AppliedMigration {
            version,
            success,
            checksum,
        })
        .collect())
}

/// The relation `$1` as this role's search path resolves it: its kind
/// (`pg_class.relkind`), whether it is a valid index (NULL for a table), and
/// its schema. No row when it is not visible. `to_regclass` skips schemas the
/// role may not use, which is what the daemon would meet.
pub const RELATION: &str = "
SELECT c.relkind::text,
       (SELECT i.indisvalid FROM pg_catalog.pg_index i
         WHERE i.indexrelid OPERATOR(pg_catalog.=) c.oid),
       n.nspname::text
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
 WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass($1)";

/// A relation visible to this role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    /// `pg_class.relkind`: `r`/`p` a table, `i`/`I` an index, others neither.
    pub relkind: String,
    /// For an index, false after a failed concurrent build; `None` otherwise.
    pub valid: Option<bool>,
    pub schema: String,
}

impl Relation {
    pub fn is_table(&self) -> bool {
        matches!(self.relkind.as_str(), "r" | "p")
    }

    pub fn is_index(&self) -> bool {
        matches!(self.relkind.as_str(), "i" | "I")
    }
}

pub async fn relation(
    conn: &mut PgConnection,
    name: &str,
) -> Result<Option<Relation>, sqlx::Error> {
    let found: Option<(String, Option<bool>, String)> = sqlx::query_as(RELATION)
        .persistent(false)
        .bind(name)
        .fetch_optional(&mut *conn)
        .await?;
    Ok(found.map(|(relkind, valid, schema)| Relation {
        relkind,
        valid,
        schema,
    }))
}

/// Every schema holding a relation named `$1`, visible or not (comma-joined,
/// NULL when none): tells "missing" from "there, but not usable by this role".
pub const RELATION_ANYWHERE: &str = "
SELECT pg_catalog.string_agg(DISTINCT n.nspname::text, ', ')
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
 WHERE c.relname OPERATOR(pg_catalog.=) $1";

pub async fn relation_schemas_anywhere(
    conn: &mut PgConnection,
    name: &str,
) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar(RELATION_ANYWHERE)
        .persistent(false)
        .bind(name)
        .fetch_one(&mut *conn)
        .await
}

/// The schemas of the functions named `$1` that this role's search path
/// makes visible, whatever their argument lists.
pub const FUNCTION_SCHEMAS: &str = "
SELECT DISTINCT n.nspname::text
  FROM pg_catalog.pg_proc p
  JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
 WHERE p.proname OPERATOR(pg_catalog.=) $1 AND pg_catalog.pg_function_is_visible(p.oid)";

pub async fn visible_function_schemas(
    conn: &mut PgConnection,
    name: &str,
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(FUNCTION_SCHEMAS)
        .persistent(false)
        .bind(name)
        .fetch_all(&mut *conn)
        .await
}

/// Every schema holding a function named `$1`, visible or not (comma-joined,
/// NULL when none), as `RELATION_ANYWHERE` for relations.
pub const FUNCTION_ANYWHERE: &str = "
SELECT pg_catalog.string_agg(DISTINCT n.nspname::text, ', ')
  FROM pg_catalog.pg_proc p
  JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
 WHERE p.proname OPERATOR(pg_catalog.=) $1";

pub async fn function_schemas_anywhere(
    conn: &mut PgConnection,
    name: &str,
) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar(FUNCTION_ANYWHERE)
        .persistent(false)
        .bind(name)
        .fetch_one(&mut *conn)
        .await
}

/// Which of the privileges `$2` this role lacks on the table `$1`; NULL when
/// the table is not visible. A privilege written `SELECT (a, b)` is asked
/// column by column (`has_column_privilege`), any other on the whole table.
/// The privilege list is bound as data, never spliced into the statement.
pub const TABLE_PRIVILEGES_LACKING: &str = "
SELECT CASE WHEN pg_catalog.to_regclass($1) IS NULL THEN NULL ELSE
       coalesce(pg_catalog.array_agg(p) FILTER (WHERE NOT
           CASE WHEN p OPERATOR(pg_catalog.~~) '% (%'
                THEN (SELECT pg_catalog.bool_and(pg_catalog.has_column_privilege(
                             pg_catalog.to_regclass($1)::pg_catalog.oid, pg_catalog.btrim(c),
                             pg_catalog.split_part(p, ' ', 1)))
                        FROM pg_catalog.unnest(pg_catalog.string_to_array(
                             pg_catalog.rtrim(pg_catalog.split_part(p, '(', 2), ')'), ',')) AS c)
                ELSE pg_catalog.has_table_privilege(pg_catalog.to_regclass($1)::pg_catalog.oid, p) END),
                '{}'::pg_catalog.text[])
       END
  FROM pg_catalog.unnest($2::pg_catalog.text[]) AS p";

pub async fn table_privileges_lacking(
    conn: &mut PgConnection,
    table: &str,
    privileges: &[String],
) -> Result<Option<Vec<String>>, sqlx::Error> {
    sqlx::query_scalar(TABLE_PRIVILEGES_LACKING)
        .persistent(false)
        .bind(table)
        .bind(privileges)
        .fetch_one(&mut *conn)
        .await
}

/// Which of the privileges `$2` this role lacks on any visible function
/// named `$1` (every overload must be callable: the daemon's call could
/// resolve to any of them); NULL when no such function is visible.
pub const FUNCTION_PRIVILEGES_LACKING: &str = "
SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM pg_catalog.pg_proc f
                              WHERE f.proname OPERATOR(pg_catalog.=) $1
                                AND pg_catalog.pg_function_is_visible(f.oid))
       THEN NULL ELSE
       coalesce(pg_catalog.array_agg(DISTINCT p) FILTER (WHERE NOT pg_catalog.has_function_privilege(f.oid, p)),
                '{}'::pg_catalog.text[])
       END
  FROM pg_catalog.unnest($2::pg_catalog.text[]) AS p
  LEFT JOIN pg_catalog.pg_proc f ON f.proname OPERATOR(pg_catalog.=) $1
       AND pg_catalog.pg_function_is_visible(f.oid)";

pub async fn function_privileges_lacking(
    conn: &mut PgConnection,
    function: &str,
    privileges: &[String],
) -> Result<Option<Vec<String>>, sqlx::Error> {
    sqlx::query_scalar(FUNCTION_PRIVILEGES_LACKING)
        .persistent(false)
        .bind(function)
        .bind(privileges)
        .fetch_one(&mut *conn)
        .await
}

/// The owners of the SECURITY DEFINER functions in the schemas on this
/// role's search path (outside `pg_catalog`): first those that are
/// superusers, then all of them, each comma-joined or NULL. A definer runs
/// with its owner's rights, so a superuser owner turns any flaw in one into
/// a flaw with every right.
pub const DEFINER_OWNERS: &str = "
SELECT pg_catalog.string_agg(DISTINCT r.rolname::text, ', ') FILTER (WHERE r.rolsuper),
       pg_catalog.string_agg(DISTINCT r.rolname::text, ', ')
  FROM pg_catalog.pg_proc p
  JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) p.proowner
  JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
 WHERE p.prosecdef
   AND n.nspname OPERATOR(pg_catalog.=) ANY (pg_catalog.current_schemas(false))
   AND n.nspname OPERATOR(pg_catalog.<>) 'pg_catalog'::pg_catalog.name";

/// Who owns the definer functions on the search path (`DEFINER_OWNERS`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefinerOwners {
    /// The owners that are superusers, comma-joined; `None` when none is.
    pub superusers: Option<String>,
    /// Every owner, comma-joined; `None` when there is no definer function.
    pub all: Option<String>,
}

pub async fn definer_owners(conn: &mut PgConnection) -> Result<DefinerOwners, sqlx::Error> {
    let (superusers, all): (Option<String>, Option<String>) = sqlx::query_as(DEFINER_OWNERS)
        .persistent(false)
        .fetch_one(&mut *conn)
        .await?;
    Ok(DefinerOwners { superusers, all })
}

/// The overloads of built-ins that another role planted on the search path,
/// one phrase each (`PLANTED_OVERLOADS` below, the very statement
/// `migrate` refuses on); `None` when there is none.
pub async fn planted_overloads(conn: &mut PgConnection) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar(PLANTED_OVERLOADS)
        .persistent(false)
        .fetch_one(&mut *conn)
        .await
}

/// The sidecar on this database as `check` sees it (`ADOPTION`).
#[derive(Debug, Clone, PartialEq, Eq, FromRow)]
pub struct Adoption {
    /// `migrate` ran here (its record of applied SQL is visible).
    pub installed: bool,
    /// How many of its `HOOK_TRIGGERS` triggers `lock_entry` has.
    pub triggers: i64,
    /// A valid index leading with `expires_at`, by name.
    pub deadline_index: Option<String>,
}

/// How many triggers the sidecar keeps on `lock_entry` (sql/lock_entry_hooks.sql):
/// a takeover, a late renewal and a late release each need one, or that way
/// past a deadline goes unreported.
pub const HOOK_TRIGGERS: i64 = 3;

/// Whether the sidecar is installed beside the `lock_entry` this role sees,
/// with its triggers, and which index serves the deadline order.
pub const ADOPTION: &str = "
SELECT pg_catalog.to_regclass('lease_sweeper_sql') IS NOT NULL AS installed,
       (SELECT pg_catalog.count(*) FROM pg_catalog.pg_trigger AS t
         WHERE t.tgrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('lock_entry')
           AND t.tgname OPERATOR(pg_catalog.=) ANY ('{lock_entry_takeover,lock_entry_late_renewal,lock_entry_late_release}'::pg_catalog.name[])) AS triggers,
       (SELECT c.relname::pg_catalog.text
          FROM pg_catalog.pg_index AS i
          JOIN pg_catalog.pg_class AS c ON c.oid OPERATOR(pg_catalog.=) i.indexrelid
          JOIN pg_catalog.pg_attribute AS a
            ON a.attrelid OPERATOR(pg_catalog.=) i.indrelid AND a.attnum OPERATOR(pg_catalog.=) i.indkey[0]
         WHERE i.indrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('lock_entry') AND i.indisvalid
           AND a.attname OPERATOR(pg_catalog.=) 'expires_at' AND i.indpred IS NULL
         ORDER BY 1 LIMIT 1) AS deadline_index";

/// Asks `ADOPTION`.
pub async fn adoption(conn: &mut PgConnection) -> Result<Adoption, sqlx::Error> {
    sqlx::query_as(ADOPTION)
        .persistent(false)
        .fetch_one(conn)
        .await
}

/// Functions and operators on the search path, outside pg_catalog, that
/// share a name with a built-in and are owned by a role that is neither a
/// superuser nor the current one; NULL when there is none. Every name here
/// is qualified and every operand exactly typed, so nothing it finds can
/// run while it looks.
pub const PLANTED_OVERLOADS: &str = "
SELECT pg_catalog.string_agg(x.what, '; ' ORDER BY x.what)
  FROM (SELECT pg_catalog.format('function %I.%I(%s) owned by %I', n.nspname, p.proname,
                                 pg_catalog.pg_get_function_identity_arguments(p.oid),
                                 pg_catalog.pg_get_userbyid(p.proowner)) AS what
          FROM pg_catalog.pg_proc AS p
          JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
          JOIN pg_catalog.pg_roles AS o ON o.oid OPERATOR(pg_catalog.=) p.proowner
         WHERE n.nspname OPERATOR(pg_catalog.=) ANY (pg_catalog.current_schemas(false))
           AND n.nspname OPERATOR(pg_catalog.<>) 'pg_catalog'::pg_catalog.name
           AND NOT o.rolsuper
           AND o.rolname OPERATOR(pg_catalog.<>) CURRENT_USER
           AND EXISTS (SELECT 1 FROM pg_catalog.pg_proc AS b
                        WHERE b.pronamespace OPERATOR(pg_catalog.=) 'pg_catalog'::pg_catalog.regnamespace::pg_catalog.oid
                          AND b.proname OPERATOR(pg_catalog.=) p.proname)
        UNION ALL
        SELECT pg_catalog.format('operator %I.%s(%s, %s) owned by %I', n.nspname, op.oprname,
                                 pg_catalog.format_type(op.oprleft, NULL), pg_catalog.format_type(op.oprright, NULL),
                                 pg_catalog.pg_get_userbyid(op.oprowner))
          FROM pg_catalog.pg_operator AS op
          JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) op.oprnamespace
          JOIN pg_catalog.pg_roles AS o ON o.oid OPERATOR(pg_catalog.=) op.oprowner
         WHERE n.nspname OPERATOR(pg_catalog.=) ANY (pg_catalog.current_schemas(false))
           AND n.nspname OPERATOR(pg_catalog.<>) 'pg_catalog'::pg_catalog.name
           AND NOT o.rolsuper
           AND o.rolname OPERATOR(pg_catalog.<>) CURRENT_USER
           AND EXISTS (SELECT 1 FROM pg_catalog.pg_operator AS b
                        WHERE b.oprnamespace OPERATOR(pg_catalog.=) 'pg_catalog'::pg_catalog.regnamespace::pg_catalog.oid
                          AND b.oprname OPERATOR(pg_catalog.=) op.oprname)) AS x";

/// Each function the binary ships (`$1` its names, `$2` their files' text)
/// beside each the database records in `lease_sweeper_sql` (the triggers'
/// record aside): whether it is shipped, recorded, recorded with the
/// shipped text, and in `pg_proc` in the sidecar's schema (that of
/// `lease_sweeper_sql` as this role resolves it). One row per name.
pub const FUNCTION_TEXTS: &str = "
WITH shipped AS (
    SELECT u.name, pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(u.body, 'UTF8')), 'hex') AS sha256
      FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), pg_catalog.unnest($2::pg_catalog.text[]))
           AS u (name, body)),
recorded AS (
    SELECT s.name, s.sha256 FROM lease_sweeper_sql AS s
     WHERE s.name OPERATOR(pg_catalog.<>) 'lock_entry_hooks'),
home AS (
    SELECT c.relnamespace FROM pg_catalog.pg_class AS c
     WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('lease_sweeper_sql'))
SELECT coalesce(sh.name, r.name) AS name,
       sh.name IS NOT NULL AS shipped,
       r.name IS NOT NULL AS recorded,
       r.sha256 IS NOT NULL AND sh.sha256 IS NOT DISTINCT FROM r.sha256 AS same,
       EXISTS (SELECT 1 FROM pg_catalog.pg_proc AS p, home AS h
                WHERE p.proname OPERATOR(pg_catalog.=) coalesce(sh.name, r.name)
                  AND p.pronamespace OPERATOR(pg_catalog.=) h.relnamespace) AS present
  FROM shipped AS sh FULL JOIN recorded AS r ON r.name OPERATOR(pg_catalog.=) sh.name
 ORDER BY 1";

/// One row of `FUNCTION_TEXTS`.
#[derive(Debug, Clone, PartialEq, Eq, FromRow)]
pub struct FunctionText {
    pub name: String,
    /// The binary ships it (`sql::FUNCTIONS`).
    pub shipped: bool,
    /// `lease_sweeper_sql` records it.
    pub recorded: bool,
    /// Recorded with the text the binary ships.
    pub same: bool,
    /// A function of that name is in the sidecar's schema.
    pub present: bool,
}

/// Asks `FUNCTION_TEXTS` about the binary's functions.
pub async fn function_texts(conn: &mut PgConnection) -> Result<Vec<FunctionText>, sqlx::Error> {
    let (names, texts): (Vec<&str>, Vec<&str>) = crate::pg::sql::FUNCTIONS.iter().copied().unzip();
    sqlx::query_as(FUNCTION_TEXTS)
        .persistent(false)
        .bind(names)
        .bind(texts)
        .fetch_all(conn)
        .await
}
