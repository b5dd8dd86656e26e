//! Whether a lock server's or job queue's tables, found in the database,
//! fit what the sidecar reads, and whether the migrating role may add the
//! sidecar's triggers to them. Owns the catalog statement that describes a
//! table and the rules (small pure functions) that judge it; `pg::migrate`
//! acts on the verdict, `cmd::check` words it. No DDL.

use sqlx::{FromRow, PgConnection};

/// A table found on the search path: where it lives, who owns it, its
/// columns, whether the migrating role may alter it (owns it, is a member
/// of its owner, or is a superuser), and the column lists of its unique,
/// non-partial indexes (a key the sweep relies on must be one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub schema: String,
    pub owner: String,
    pub may_alter: bool,
    pub columns: Vec<Column>,
    pub unique_keys: Vec<Vec<String>>,
}

/// One column: its name and type as `format_type` words it.
#[derive(Debug, Clone, PartialEq, Eq, FromRow)]
pub struct Column {
    pub name: String,
    pub type_name: String,
}

/// Describes the table `$1` as the search path resolves it: no row when
/// there is none. Every name is qualified, so nothing planted can run.
const DESCRIBE: &str = "
SELECT n.nspname::pg_catalog.text AS schema,
       pg_catalog.pg_get_userbyid(c.relowner)::pg_catalog.text AS owner,
       (pg_catalog.pg_has_role(CURRENT_USER, c.relowner, 'USAGE')
        OR (SELECT r.rolsuper FROM pg_catalog.pg_roles AS r WHERE r.rolname OPERATOR(pg_catalog.=) CURRENT_USER)) AS may_alter,
       ARRAY(SELECT a.attname::pg_catalog.text FROM pg_catalog.pg_attribute AS a
              WHERE a.attrelid OPERATOR(pg_catalog.=) c.oid AND a.attnum OPERATOR(pg_catalog.>) 0
                AND NOT a.attisdropped ORDER BY a.attnum) AS column_names,
       ARRAY(SELECT pg_catalog.format_type(a.atttypid, a.atttypmod) FROM pg_catalog.pg_attribute AS a
              WHERE a.attrelid OPERATOR(pg_catalog.=) c.oid AND a.attnum OPERATOR(pg_catalog.>) 0
                AND NOT a.attisdropped ORDER BY a.attnum) AS column_types,
       ARRAY(SELECT pg_catalog.array_to_string(ARRAY(
                        SELECT a.attname::pg_catalog.text
                          FROM pg_catalog.unnest(i.indkey::pg_catalog.int2[]) WITH ORDINALITY AS k (attnum, ord)
                          JOIN pg_catalog.pg_attribute AS a
                            ON a.attrelid OPERATOR(pg_catalog.=) c.oid AND a.attnum OPERATOR(pg_catalog.=) k.attnum
                         ORDER BY k.ord), ',')
              FROM pg_catalog.pg_index AS i
             WHERE i.indrelid OPERATOR(pg_catalog.=) c.oid AND i.indisunique AND i.indisvalid
               AND i.indpred IS NULL AND i.indexprs IS NULL) AS unique_keys
  FROM pg_catalog.pg_class AS c
  JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
 WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass($1)
   AND c.relkind OPERATOR(pg_catalog.=) ANY ('{r,p}'::pg_catalog.char[])";

#[derive(FromRow)]
struct DescribeRow {
    schema: String,
    owner: String,
    may_alter: Option<bool>,
    column_names: Vec<String>,
    column_types: Vec<String>,
    unique_keys: Vec<String>,
}

/// The table named `name` as this session's search path resolves it.
pub async fn describe(conn: &mut PgConnection, name: &str) -> Result<Option<Found>, sqlx::Error> {
    // Unnamed: `check` runs it through PgBouncer in transaction mode too.
    let row: Option<DescribeRow> = sqlx::query_as(DESCRIBE)
        .persistent(false)
        .bind(name)
        .fetch_optional(conn)
        .await?;
    Ok(row.map(|r| Found {
        schema: r.schema,
        owner: r.owner,
        may_alter: r.may_alter.unwrap_or(false),
        columns: r
            .column_names
            .into_iter()
            .zip(r.column_types)
            .map(|(name, type_name)| Column { name, type_name })
            .collect(),
        unique_keys: r
            .unique_keys
            .into_iter()
            .map(|k| k.split(',').map(str::to_owned).collect())
            .collect(),
    }))
}

/// What a column must be for the sidecar to read it.
struct Need {
    column: &'static str,
    /// The types it may have, as `format_type` words them.
    types: &'static [&'static str],
    /// What it is for, and what the sidecar needs of it.
    why: &'static str,
}

const TEXT: &[&str] = &["text", "character varying"];
const TIMESTAMPTZ: &[&str] = &["timestamp with time zone"];
/// A token's types: each has a text form every line can carry, and
/// equality, which tells a takeover (the token changed) from a renewal.
const TOKEN: &[&str] = &[
    "bigint",
    "integer",
    "smallint",
    "numeric",
    "uuid",
    "text",
    "character varying",
];

/// What the sweep reads of `lock_entry`. The session link is the lock
/// server's business (its cascade is not an expiry) and not read.
const LOCK_ENTRY: &[Need] = &[
    Need {
        column: "lock_key",
        types: TEXT,
        why: "the lease's key (text or varchar), the lockKey of every line",
    },
    Need {
        column: "owner_id",
        types: TEXT,
        why: "the holder (text or varchar), the ownerId of every line",
    },
    Need {
        column: "token",
        types: TOKEN,
        why: "the holder's token, written in every line as its text: a takeover is the token changing",
    },
    Need {
        column: "expires_at",
        types: TIMESTAMPTZ,
        why: "the deadline as timestamptz: a timestamp without time zone has no instant for the database clock to compare with",
    },
];

/// What the reaper reads and writes of `job_queue`: the job-queue
/// document's columns. `state` is judged apart (`state_misfits`): text, or
/// an enum with the document's five states.
const JOB_QUEUE: &[Need] = &[
    Need {
        column: "job_id",
        types: &["uuid"],
        why: "the job's id (uuid)",
    },
    Need {
        column: "job_kind",
        types: TEXT,
        why: "the job's kind",
    },
    Need {
        column: "payload",
        types: &["jsonb"],
        why: "what a dead letter keeps (jsonb)",
    },
    Need {
        column: "attempts",
        types: &["integer"],
        why: "attempts so far (integer)",
    },
    Need {
        column: "max_attempts",
        types: &["integer"],
        why: "when a job is dead-lettered (integer)",
    },
    Need {
        column: "scheduled_at",
        types: TIMESTAMPTZ,
        why: "when a reset job runs again, after its backoff",
    },
    Need {
        column: "lease_owner",
        types: TEXT,
        why: "the worker holding the lease",
    },
    Need {
        column: "lease_until",
        types: TIMESTAMPTZ,
        why: "the lease's deadline",
    },
    Need {
        column: "last_error",
        types: TEXT,
        why: "set to lease_expired_reaped on a reset",
    },
    Need {
        column: "updated_at",
        types: TIMESTAMPTZ,
        why: "set when the reaper resets a job",
    },
];

/// What the reaper uses of `job_queue` only where the queue has it (the
/// stand-in does; the job-queue document names none of them): judged only
/// when present, so a column of that name the reaper cannot use is refused
/// rather than misread.
const JOB_QUEUE_OPTIONAL: &[Need] = &[
    Need {
        column: "lease_duration_sec",
        types: &["integer"],
        why: "optional: the lease a claim granted, which the dry run reports where the queue records it",
    },
    Need {
        column: "lease_duration_source",
        types: TEXT,
        why: "optional: where that duration came from, which the dry run reports beside it",
    },
    Need {
        column: "reaped_by",
        types: TEXT,
        why: "optional: the actor that reaped a job, which the reaper records where the queue has it",
    },
    Need {
        column: "reaped_by_role",
        types: TEXT,
        why: "optional: the role that reaped a job, recorded beside reaped_by",
    },
];

/// The job-queue document's states: a `state` enum must have each label.
pub const JOB_STATES: &[&str] = &[
    "queued",
    "leased",
    "retry_waiting",
    "succeeded",
    "dead_letter",
];

/// Why `state` will not do: missing, neither text nor an enum, or an enum
/// (`enum_labels` is `Some` when its type is one) without one of the
/// document's states, each missing label named. The reaper compares and
/// assigns it as string literals, which both take.
fn state_misfits(found: &Found, enum_labels: Option<&[String]>) -> Vec<String> {
    const WHY: &str = "queued | leased | retry_waiting | succeeded | dead_letter";
    let Some(column) = found.columns.iter().find(|c| c.name == "state") else {
        return vec![format!("no column state ({WHY})")];
    };
    match enum_labels {
        None if TEXT.contains(&base_type(&column.type_name)) => Vec::new(),
        None => vec![format!(
            "column state is {}, not text or character varying or an enum of the states ({WHY})",
            column.type_name
        )],
        Some(labels) => JOB_STATES
            .iter()
            .filter(|state| !labels.iter().any(|l| l == *state))
            .map(|state| {
                format!(
                    "state's enum type {} has no label '{state}' (the reaper reads and writes the \
                     states {WHY})",
                    column.type_name
                )
            })
            .collect(),
    }
}

/// Each reason the table cannot be adopted, in one phrase each: a missing or
/// unusable column and what it needs; empty when it fits.
fn misfits(found: &Found, needs: &[Need]) -> Vec<String> {
    needs
        .iter()
        .filter_map(|need| {
            match found.columns.iter().find(|c| c.name == need.column) {
                None => Some(format!("no column {} ({})", need.column, need.why)),
                // `character varying(200)` is a `character varying`.
                Some(c) if !need.types.contains(&base_type(&c.type_name)) => Some(format!(
                    "column {} is {}, not {} ({})",
                    need.column,
                    c.type_name,
                    need.types.join(" or "),
                    need.why
                )),
                Some(_) => None,
            }
        })
        .collect()
}

/// A type's name without its modifier.
fn base_type(type_name: &str) -> &str {
    type_name.split('(').next().unwrap_or(type_name)
}

/// Why `lock_entry` cannot be adopted; empty when it can.
pub fn lock_entry_misfits(found: &Found) -> Vec<String> {
    let mut out = misfits(found, LOCK_ENTRY);
    if !found.unique_keys.iter().any(|k| k == &["lock_key"]) {
        out.push(
            "lock_key is not unique by itself (no primary key or unique index on (lock_key) alone): \
             one lease per key is what a takeover and a sweep count on"
                .to_owned(),
        );
    }
    out
}

/// Why `job_queue` cannot be adopted; empty when it can. `state_labels`
/// is the labels of `state`'s type when that type is an enum.
pub fn job_queue_misfits(found: &Found, state_labels: Option<&[String]>) -> Vec<String> {
    let optional: Vec<&Need> = JOB_QUEUE_OPTIONAL
        .iter()
        .filter(|need| found.columns.iter().any(|c| c.name == need.column))
        .collect();
    let mut out = misfits(found, JOB_QUEUE);
    out.extend(state_misfits(found, state_labels));
    for need in optional {
        out.extend(misfits(found, std::slice::from_ref(need)));
    }
    out
}

/// The refusal for a table the migrating role may not add triggers or
/// grants to.
pub fn not_owner(table: &str, found: &Found) -> String {
    format!(
        "{}.{table} is owned by {}, and this role is neither that role, a member of it, nor a superuser; \
         run lease-sweeper migrate as {} (or a role granted it), or as a superuser; on a managed \
         PostgreSQL, as the role that owns the lock server's tables",
        found.schema, found.owner, found.owner
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(columns: &[(&str, &str)], unique: &[&[&str]]) -> Found {
        Found {
            schema: "public".into(),
            owner: "lockserver".into(),
            may_alter: true,
            columns: columns
                .iter()
                .map(|(n, t)| Column {
                    name: (*n).into(),
                    type_name: (*t).into(),
                })
                .collect(),
            unique_keys: unique
                .iter()
                .map(|k| k.iter().map(|c| (*c).to_owned()).collect())
                .collect(),
        }
    }

    const FITS: &[(&str, &str)] = &[
        ("lock_key", "character varying(200)"),
        ("owner_id", "text"),
        ("token", "integer"),
        ("session_id", "uuid"),
        ("expires_at", "timestamp with time zone"),
        ("their_own", "text"),
    ];

    #[test]
    fn a_lock_server_table_with_its_own_columns_and_types_fits() {
        let found = table(FITS, &[&["lock_key"]]);
        assert_eq!(lock_entry_misfits(&found), Vec::<String>::new());
    }

    #[test]
    fn each_missing_or_unusable_column_is_named_once_with_what_it_needs() {
        let found = table(
            &[
                ("lock_key", "text"),
                ("token", "point"),
                ("expires_at", "timestamp without time zone"),
            ],
            &[&["lock_key", "owner_id"]],
        );
        let misfits = lock_entry_misfits(&found);
        assert_eq!(misfits.len(), 4, "{misfits:#?}");
        assert!(misfits[0].starts_with("no column owner_id"));
        assert!(misfits[1].starts_with("column token is point, not bigint or integer"));
        assert!(misfits[2].starts_with(
            "column expires_at is timestamp without time zone, not timestamp with time zone"
        ));
        assert!(misfits[3].starts_with("lock_key is not unique by itself"));
    }

    #[test]
    fn a_token_of_any_type_with_a_text_form_fits_and_a_composite_does_not() {
        for token in ["bigint", "integer", "uuid", "text", "character varying(64)"] {
            let mut columns = FITS.to_vec();
            columns[2] = ("token", token);
            let found = table(&columns, &[&["lock_key"]]);
            assert_eq!(lock_entry_misfits(&found), Vec::<String>::new(), "{token}");
        }
        let mut columns = FITS.to_vec();
        columns[2] = ("token", "fencing_pair");
        let misfits = lock_entry_misfits(&table(&columns, &[&["lock_key"]]));
        assert_eq!(misfits.len(), 1, "{misfits:#?}");
        assert!(misfits[0].starts_with("column token is fencing_pair, not bigint or integer or"));
    }

    #[test]
    fn a_refusal_for_a_table_of_another_role_names_who_can() {
        let found = table(FITS, &[&["lock_key"]]);
        let text = not_owner("lock_entry", &found);
        assert!(text.starts_with("public.lock_entry is owned by lockserver"));
        assert!(text.contains("run lease-sweeper migrate as lockserver"));
    }

    /// The job-queue document's own queue: its columns, none of the
    /// sidecar's.
    const PHASE1: &[(&str, &str)] = &[
        ("job_id", "uuid"),
        ("job_kind", "text"),
        ("payload", "jsonb"),
        ("state", "text"),
        ("attempts", "integer"),
        ("max_attempts", "integer"),
        ("scheduled_at", "timestamp with time zone"),
        ("lease_owner", "text"),
        ("lease_until", "timestamp with time zone"),
        ("last_error", "text"),
        ("metadata", "jsonb"),
        ("created_at", "timestamp with time zone"),
        ("updated_at", "timestamp with time zone"),
    ];

    fn labels(states: &[&str]) -> Vec<String> {
        states.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_documents_queue_fits_without_the_sidecars_own_columns() {
        let found = table(PHASE1, &[&["job_id"]]);
        assert_eq!(job_queue_misfits(&found, None), Vec::<String>::new());
        let mut ours = PHASE1.to_vec();
        ours.extend([
            ("reaped_by", "text"),
            ("reaped_by_role", "text"),
            ("lease_duration_sec", "integer"),
            ("lease_duration_source", "text"),
        ]);
        let found = table(&ours, &[&["job_id"]]);
        assert_eq!(job_queue_misfits(&found, None), Vec::<String>::new());
    }

    #[test]
    fn a_missing_column_the_reaper_reads_is_named_and_an_optional_one_is_not() {
        let columns: Vec<_> = PHASE1
            .iter()
            .copied()
            .filter(|(n, _)| *n != "lease_until" && *n != "updated_at")
            .collect();
        let misfits = job_queue_misfits(&table(&columns, &[]), None);
        assert_eq!(
            misfits,
            [
                "no column lease_until (the lease's deadline)",
                "no column updated_at (set when the reaper resets a job)",
            ]
        );
    }

    #[test]
    fn an_optional_column_the_reaper_cannot_use_is_refused_by_name() {
        let mut columns = PHASE1.to_vec();
        columns.push(("lease_duration_sec", "text"));
        let misfits = job_queue_misfits(&table(&columns, &[]), None);
        assert_eq!(misfits.len(), 1, "{misfits:#?}");
        assert!(
            misfits[0].starts_with("column lease_duration_sec is text, not integer (optional:"),
            "{misfits:#?}"
        );
    }

    #[test]
    fn a_state_enum_with_the_five_states_fits_and_each_missing_label_is_named() {
        let mut columns = PHASE1.to_vec();
        columns[3] = ("state", "job_state");
        let found = table(&columns, &[]);
        let all = labels(&[
            "queued",
            "leased",
            "retry_waiting",
            "succeeded",
            "dead_letter",
            "cancelled",
        ]);
        assert_eq!(job_queue_misfits(&found, Some(&all)), Vec::<String>::new());
        let without = labels(&["queued", "retry_waiting", "succeeded"]);
        let misfits = job_queue_misfits(&found, Some(&without));
        assert_eq!(misfits.len(), 2, "{misfits:#?}");
        assert!(
            misfits[0].starts_with("state's enum type job_state has no label 'leased' ("),
            "{misfits:#?}"
        );
        assert!(
            misfits[1].starts_with("state's enum type job_state has no label 'dead_letter' ("),
            "{misfits:#?}"
        );
    }

    #[test]
    fn a_state_neither_text_nor_an_enum_is_refused() {
        let mut columns = PHASE1.to_vec();
        columns[3] = ("state", "integer");
        let misfits = job_queue_misfits(&table(&columns, &[]), None);
        assert_eq!(misfits.len(), 1, "{misfits:#?}");
        assert!(
            misfits[0]
                .starts_with("column state is integer, not text or character varying or an enum"),
            "{misfits:#?}"
        );
    }
}
