//! The bundled schema (`migrations/`, embedded at build time) and applying it.
//!
//! Owns the migrator and the guard in front of it (no planted overload of a
//! built-in may run with the migrating role's rights); `cmd::migrate`
//! reports what it did, `cmd::check` reuses the guard's statement, and the
//! tests migrate their throwaway databases through here.

use sqlx::PgConnection;

/// The schema this binary needs, embedded at build time.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Applies the bundled migrations; safe to run again and from several
/// replicas at once (sqlx takes a session advisory lock, held across the
/// migrations' transactions: run it directly against PostgreSQL or through a
/// session-mode pool, never through PgBouncer in transaction mode).
///
/// Refuses first when a schema on the search path holds a function or
/// operator named like a built-in and owned by a role that is neither a
/// superuser nor the migrating role (`PLANTED_OVERLOADS`): such an overload
/// can be a better match than the built-in and would run with the migrating
/// role's rights inside a migration (CVE-2018-1058; an early migration calls
/// `format(…, current_schema())`, which an exact-typed `format(text, name)`
/// beats). Function bodies are not validated at creation
/// (`check_function_bodies = off`, as pg_dump restores do), so the schema
/// can be installed into a schema other than `public`: the last migration
/// re-pins every definer's search_path to that schema.
pub async fn migrate(conn: &mut PgConnection) -> Result<(), sqlx::migrate::MigrateError> {
    let planted: Option<String> = sqlx::query_scalar(PLANTED_OVERLOADS)
        .fetch_one(&mut *conn)
        .await?;
    if let Some(planted) = planted {
        return Err(sqlx::migrate::MigrateError::Source(
            format!(
                "refusing to migrate: {planted}; each shares a name with a PostgreSQL built-in, so it can be chosen \
                 instead of the built-in and would run with this role's rights during the migration (CVE-2018-1058). \
                 Have it dropped (DROP FUNCTION / DROP OPERATOR as named), run REVOKE CREATE ON SCHEMA public FROM PUBLIC, \
                 then run lease-sweeper migrate again"
            )
            .into(),
        ));
    }
    sqlx::raw_sql("SET check_function_bodies = off")
        .execute(&mut *conn)
        .await?;
    let result = MIGRATOR.run(&mut *conn).await;
    sqlx::raw_sql("RESET check_function_bodies")
        .execute(&mut *conn)
        .await?;
    result
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

#[cfg(test)]
mod tests {
    use super::MIGRATOR;

    /// Each migration as it first landed: the start of its SHA-384, the
    /// checksum sqlx stores when it applies it. A database that applied a
    /// migration refuses a binary whose copy of it differs, so a landed
    /// migration is never edited (a change is a new migration); a new one
    /// adds its line here.
    const LANDED: &[(i64, &str)] = &[
        (20261129000100, "a762107ac4785e78"),
        (20261129000200, "f1ed76117a23a92e"),
        (20261129000300, "a1eadb5d66c77765"),
        (20261130000100, "18cdf637b8731ce0"),
        (20261130000110, "c67112829d870949"),
        (20261130000120, "9d4eb57eb97ce575"),
        (20261130000300, "e681a8f9f8fe5deb"),
        (20261130000400, "c94f812e3c50452a"),
        (20261201000100, "4cec62e8b6a2ccfb"),
        (20261201000200, "f0af6baaa5f5fceb"),
        (20261201000400, "60ee757e3b6c4f8d"),
        (20261202000100, "5b4c685fe279f6da"),
        (20261202000200, "ead1de07303ead66"),
        (20261202000300, "de75f826a8caa423"),
        (20261204000100, "3c16223fa06e55c4"),
        (20261204000200, "32d3e67a0e77782f"),
        (20261204000300, "8849189dae864e9c"),
        (20261205000100, "2604e76428ee092d"),
        (20261205000200, "6fe45156e1ad9999"),
    ];

    #[test]
    fn landed_migrations_are_never_edited() {
        let bundled: Vec<(i64, String)> = MIGRATOR
            .iter()
            .map(|m| {
                let hex: String = m.checksum.iter().map(|b| format!("{b:02x}")).collect();
                (m.version, hex[..16].to_owned())
            })
            .collect();
        let landed: Vec<(i64, String)> = LANDED.iter().map(|&(v, h)| (v, h.to_owned())).collect();
        assert_eq!(bundled, landed);
    }
}
