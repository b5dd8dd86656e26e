//! The SQL files `migrate` and `remove` run, embedded at build time: the
//! stand-in lock server and job substrate (created only where none exists),
//! the sidecar's functions (one file each, the one place its current text
//! lives), the one loop over the functions a database records (drop or
//! pin), its triggers on `lock_entry`, and its removal. The versioned
//! tables, role and grants are `migrations/`, embedded by `pg::migrate`.
//! No logic: `pg::migrate` decides what runs when.

/// The stand-in lock server: `lock_session`, `lock_entry`, its indexes and
/// its reference statements. Only where no `lock_entry` exists.
pub const LOCK_SERVER: &str = include_str!("../../sql/lock_server.sql");

/// The stand-in job substrate: the queue's tables, settings and statements.
/// Only where no `job_queue` exists.
pub const JOB_SUBSTRATE: &str = include_str!("../../sql/job_substrate.sql");

/// The sidecar's triggers on `lock_entry` (takeovers, late releases).
pub const LOCK_ENTRY_HOOKS: &str = include_str!("../../sql/lock_entry_hooks.sql");

/// The job queue's gate rows and the daemon's SELECT on it, where there is
/// a queue; applied by every `migrate`, so a queue that comes later is
/// adopted.
pub const JOB_QUEUE_ACCESS: &str = include_str!("../../sql/job_queue_access.sql");

/// Takes the sidecar out of the database (`lease-sweeper remove`).
pub const REMOVE: &str = include_str!("../../sql/remove.sql");

/// The one loop over the functions the database records: drops those not
/// kept (the names in `lease_sweeper.kept`: `migrate` keeps what the binary
/// ships, `remove` nothing) and pins the kept definers' `search_path` to
/// the schema they were installed into.
pub const SIDECAR_FUNCTIONS: &str = include_str!("../../sql/sidecar_functions.sql");

/// Functions the binary no longer ships but `migrate` keeps in the database
/// for one release more, so the daemons of the release before, still
/// running during a rolling upgrade, keep finding what they call; the
/// `migrate` of the release after drops them (it no longer lists them
/// here). Empty while no shipped function has been retired.
pub const RETIRED: &[&str] = &[];

/// Every function of the sidecar: its name (the file's, and the key of its
/// row in `lease_sweeper_sql`) and its file's text.
pub const FUNCTIONS: &[(&str, &str)] = &[
    (
        "fn_job_dry_run_object",
        include_str!("../../sql/functions/fn_job_dry_run_object.sql"),
    ),
    (
        "fn_job_queue_has_columns",
        include_str!("../../sql/functions/fn_job_queue_has_columns.sql"),
    ),
    (
        "fn_job_reap_handoff_abandoned",
        include_str!("../../sql/functions/fn_job_reap_handoff_abandoned.sql"),
    ),
    (
        "fn_job_reap_handoff_claim",
        include_str!("../../sql/functions/fn_job_reap_handoff_claim.sql"),
    ),
    (
        "fn_job_reap_handoff_recover",
        include_str!("../../sql/functions/fn_job_reap_handoff_recover.sql"),
    ),
    (
        "fn_job_reap_ids",
        include_str!("../../sql/functions/fn_job_reap_ids.sql"),
    ),
    (
        "fn_job_reap_stale_leases_apply",
        include_str!("../../sql/functions/fn_job_reap_stale_leases_apply.sql"),
    ),
    (
        "fn_job_reap_stale_leases_apply_handed_off",
        include_str!("../../sql/functions/fn_job_reap_stale_leases_apply_handed_off.sql"),
    ),
    (
        "fn_job_reap_stale_leases_dry_run",
        include_str!("../../sql/functions/fn_job_reap_stale_leases_dry_run.sql"),
    ),
    (
        "fn_job_reaper_gate_refusal",
        include_str!("../../sql/functions/fn_job_reaper_gate_refusal.sql"),
    ),
    (
        "fn_job_reaper_limit_refusal",
        include_str!("../../sql/functions/fn_job_reaper_limit_refusal.sql"),
    ),
    (
        "fn_job_stale_lease_count",
        include_str!("../../sql/functions/fn_job_stale_lease_count.sql"),
    ),
    (
        "lease_epoch_millis",
        include_str!("../../sql/functions/lease_epoch_millis.sql"),
    ),
    (
        "lease_overdue_millis",
        include_str!("../../sql/functions/lease_overdue_millis.sql"),
    ),
    (
        "lock_drain_takeovers",
        include_str!("../../sql/functions/lock_drain_takeovers.sql"),
    ),
    (
        "lock_entry_record_release",
        include_str!("../../sql/functions/lock_entry_record_release.sql"),
    ),
    (
        "lock_entry_record_renewal",
        include_str!("../../sql/functions/lock_entry_record_renewal.sql"),
    ),
    (
        "lock_entry_record_takeover",
        include_str!("../../sql/functions/lock_entry_record_takeover.sql"),
    ),
    (
        "lock_handoff_claim",
        include_str!("../../sql/functions/lock_handoff_claim.sql"),
    ),
    (
        "lock_handoff_recover",
        include_str!("../../sql/functions/lock_handoff_recover.sql"),
    ),
    (
        "lock_held_count_get",
        include_str!("../../sql/functions/lock_held_count_get.sql"),
    ),
    (
        "lock_held_counted",
        include_str!("../../sql/functions/lock_held_counted.sql"),
    ),
    (
        "lock_reap_batch",
        include_str!("../../sql/functions/lock_reap_batch.sql"),
    ),
    (
        "lock_sweep_probe",
        include_str!("../../sql/functions/lock_sweep_probe.sql"),
    ),
    (
        "signal_handoff_grace",
        include_str!("../../sql/functions/signal_handoff_grace.sql"),
    ),
];

#[cfg(test)]
mod tests {
    use super::FUNCTIONS;

    /// A file added to sql/functions/ is applied only once it is listed
    /// here; one listed but gone would not build.
    #[test]
    fn every_function_file_is_listed() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/sql/functions");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        let listed: Vec<String> = FUNCTIONS.iter().map(|(n, _)| format!("{n}.sql")).collect();
        assert_eq!(files, listed);
    }

    /// Each file defines the function it is named for, so the name that
    /// records its text is the function's own.
    #[test]
    fn each_file_defines_its_namesake() {
        for (name, text) in FUNCTIONS {
            assert!(
                text.contains(&format!("CREATE OR REPLACE FUNCTION {name}(")),
                "{name}.sql"
            );
        }
    }
}
