//! Sidecars as a fleet, against real etcd and the real binary: several
//! sidecars on one etcd report each expiry and revoke exactly once between
//! them (the claims under `lease-sweeper/claims/` say who did); a sidecar
//! killed with SIGKILL and started again under the same `HOSTNAME` reports
//! what died while it was away, from its resume point, and nothing from
//! before it again; and another sidecar's unconfirmed claim is waited on
//! while its owner's liveness key lasts, taken over and reported once it is
//! gone, and left alone once its owner's resume point passed it.
//!
//! The helpers at the top are shared with `faults`.

use std::collections::BTreeMap;
use std::time::Duration;

use etcd_client::{Client, EventType, GetOptions, WatchOptions};

use super::cluster::EtcdCluster;
use super::holders::{Holder, try_lock_keys};
use crate::support::{Daemon, events, poll, wait_until};

/// Long enough for any wait of these tests: expiries, a sidecar's start,
/// its liveness key running out (10 s) and its idle resume point (10 s).
pub(super) const WAIT: Duration = Duration::from_secs(30);

/// How long the resume points of several sidecars that shared a storm may
/// take to pass it: a 10 s round per change of owner along its claims.
const SETTLE: Duration = Duration::from_secs(60);

/// `lease-sweeper run` following `cluster` as the sidecar `name` (its
/// `HOSTNAME`), with `extra` variables.
pub(super) fn sidecar(cluster: &EtcdCluster, name: &str, extra: &[(&str, &str)]) -> Daemon {
    let env = cluster.env();
    Daemon::spawn(&sidecar_env(&env, name, extra))
}

/// The environment `sidecar` starts the daemon with.
pub(super) fn sidecar_env<'a>(
    env: &'a [(String, String)],
    name: &'a str,
    extra: &[(&'a str, &'a str)],
) -> Vec<(&'a str, &'a str)> {
    let mut vars: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    vars.push(("HOSTNAME", name));
    vars.extend_from_slice(extra);
    vars
}

/// The current revision.
pub(super) async fn revision(client: &Client) -> i64 {
    poll(WAIT, "the current revision", || async {
        let got = client
            .clone()
            .get("lease-sweeper-test/revision", None)
            .await
            .map_err(|e| e.to_string())?;
        Ok(got.header().map_or(0, |h| h.revision()))
    })
    .await
}

/// Waits until sidecar `name` follows etcd: it wrote its liveness key after
/// revision `after` (read before it was started), which it does once the
/// revision its watch starts from is fixed, so every change from here on
/// reaches it.
pub(super) async fn wait_following(client: &Client, name: &str, after: i64, daemon: &Daemon) {
    let key = format!("lease-sweeper/alive/{name}");
    poll(WAIT, &format!("sidecar {name} following"), || async {
        let got = client
            .clone()
            .get(key.as_str(), None)
            .await
            .map_err(|e| e.to_string())?;
        match got.kvs().first() {
            Some(kv) if kv.mod_revision() > after => Ok(()),
            _ => Err(format!("output:\n{}", daemon.lines().join("\n"))),
        }
    })
    .await
}

/// A reported expiry: `(lockKey, token)`, with its `reapedBy`.
pub(super) type Line = ((String, String), String);

/// Every `lease_expired` line in `lines`, in order; each must be etcd's.
pub(super) fn reported(lines: &[String]) -> Vec<Line> {
    events(lines, "lease_expired")
        .into_iter()
        .map(|f| {
            assert_eq!(f["backend"], "etcd", "{f:?}");
            (
                (f["lockKey"].clone(), f["token"].clone()),
                f["reapedBy"].clone(),
            )
        })
        .collect()
}

/// How many times `holder` is in `lines` (by lockKey and token).
pub(super) fn times(lines: &[Line], holder: &Holder) -> usize {
    let id = (holder.key.clone(), holder.create_revision.to_string());
    lines.iter().filter(|(k, _)| *k == id).count()
}

/// The claims: `(deletion revision, create revision)` → owner (the value
/// without the ` reported` its owner adds once the line is out).
async fn claims(client: &Client) -> BTreeMap<(i64, i64), String> {
    let prefix = "lease-sweeper/claims/";
    let got = poll(WAIT, "the claims", || async {
        client
            .clone()
            .get(prefix, Some(GetOptions::new().with_prefix()))
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    got.kvs()
        .iter()
        .map(|kv| {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let (rev, created) = key[prefix.len()..].split_once('/').expect("rev/create");
            let value = String::from_utf8_lossy(kv.value());
            let owner = value.strip_suffix(" reported").unwrap_or(&value).to_owned();
            ((rev.parse().unwrap(), created.parse().unwrap()), owner)
        })
        .collect()
}

/// The deletion revision of `holder` as its claim names it (`None`: not
/// claimed).
fn claimed_at(claims: &BTreeMap<(i64, i64), String>, holder: &Holder) -> Option<i64> {
    claims
        .keys()
        .find(|(_, created)| *created == holder.create_revision)
        .map(|(rev, _)| *rev)
}

/// Waits until each of `holders` is claimed; returns the claims and the
/// last of their deletions.
pub(super) async fn wait_claimed(
    client: &Client,
    holders: &[&Holder],
) -> (BTreeMap<(i64, i64), String>, i64) {
    poll(WAIT, "a claim for each holder", || async {
        let claims = claims(client).await;
        let revs: Option<Vec<i64>> = holders.iter().map(|h| claimed_at(&claims, h)).collect();
        match revs.and_then(|r| r.into_iter().max()) {
            Some(last) => Ok((claims, last)),
            None => Err(format!("{claims:?}")),
        }
    })
    .await
}

/// Sidecar `name`'s resume point, if it wrote one.
pub(super) async fn resume_point(client: &Client, name: &str) -> Option<i64> {
    let key = format!("lease-sweeper/resume/{name}");
    let got = poll(WAIT, "a resume point", || async {
        client
            .clone()
            .get(key.as_str(), None)
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    got.kvs().first().map(|kv| {
        String::from_utf8_lossy(kv.value())
            .parse()
            .expect("a revision")
    })
}

/// Waits until sidecar `name`'s resume point is at or past `revision`:
/// everything up to there is settled for it (reported, or confirmed as
/// another's), so it will write nothing more about it.
pub(super) async fn wait_resumed_past(client: &Client, name: &str, revision: i64) {
    wait_until(
        WAIT,
        &format!("{name}'s resume point at {revision} or later"),
        || async {
            resume_point(client, name)
                .await
                .is_some_and(|r| r >= revision)
        },
    )
    .await
}

/// Waits until etcd deleted every one of `holders`' keys.
pub(super) async fn wait_deleted(client: &Client, holders: &[&Holder]) {
    poll(WAIT, "the holders' keys deleted", || async {
        let keys = try_lock_keys(client, "locks/").await?;
        let left: Vec<&str> = holders
            .iter()
            .filter(|h| keys.iter().any(|k| k.key == h.key))
            .map(|h| h.key.as_str())
            .collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("still there: {left:?}"))
        }
    })
    .await
}

/// The revision at which `key`, created at `created`, was deleted, read
/// from etcd's history (which must still hold it).
pub(super) async fn deleted_at(client: &Client, key: &str, created: i64) -> i64 {
    let options = WatchOptions::new().with_start_revision(created);
    let mut stream = client
        .clone()
        .watch(key, Some(options))
        .await
        .unwrap_or_else(|e| panic!("watching the history of {key}: {e}"));
    let found = tokio::time::timeout(WAIT, async {
        loop {
            let message = stream.message().await.expect("the history").expect("open");
            if let Some(ev) = message
                .events()
                .iter()
                .find(|e| e.event_type() == EventType::Delete)
            {
                return ev.kv().expect("a deleted key").mod_revision();
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no deletion of {key} in etcd's history"));
    // Dropping the stream ends the watch.
    drop(stream);
    found
}

/// Acquires `n` holders `locks/<what>-<i>` on leases of `ttl` seconds.
pub(super) async fn holders(client: &Client, what: &str, n: usize, ttl: i64) -> Vec<Holder> {
    let mut out = Vec::new();
    for i in 0..n {
        out.push(Holder::acquire(client, &format!("locks/{what}-{i}"), ttl).await);
    }
    out
}

/// Kills every one of `holders` (their keep-alives stop).
pub(super) fn kill_all(holders: &mut [Holder]) {
    for holder in holders {
        holder.kill();
    }
}

/// Stops `daemon` with SIGTERM; it must exit 0.
pub(super) async fn stop(daemon: &mut Daemon) -> Vec<String> {
    let (code, lines) = daemon.stop().await;
    assert_eq!(code, Some(0), "{}", lines.join("\n"));
    lines
}

/// Kills `daemon` with SIGKILL and reaps it; returns what it wrote.
pub(super) async fn kill9(daemon: &mut Daemon) -> Vec<String> {
    daemon.signal(libc::SIGKILL);
    daemon.wait_exit(WAIT).await;
    daemon.lines()
}

#[tokio::test]
async fn three_sidecars_report_each_expiry_and_revoke_exactly_once_between_them() {
    let cluster = EtcdCluster::one().await;
    let client = cluster.client().await;
    let names = ["side-1", "side-2", "side-3"];
    let before = revision(&client).await;
    let mut sidecars: Vec<Daemon> = names.iter().map(|n| sidecar(&cluster, n, &[])).collect();
    for (name, daemon) in names.iter().zip(&sidecars) {
        wait_following(&client, name, before, daemon).await;
    }
    let mut died = holders(&client, "died", 30, 1).await;
    let mut revoked = holders(&client, "revoked", 5, 2).await;
    let mut released = holders(&client, "released", 5, 2).await;

    kill_all(&mut died);
    for holder in &mut revoked {
        holder.revoke().await;
    }
    for holder in &mut released {
        holder.release().await;
    }

    let all: Vec<&Holder> = died.iter().chain(&revoked).chain(&released).collect();
    wait_deleted(&client, &all).await;
    let reporting: Vec<&Holder> = died.iter().chain(&revoked).collect();
    let (claimed, last) = wait_claimed(&client, &reporting).await;
    // Once every resume point has passed the last deletion, no sidecar has
    // anything of these left to report or to settle. Each passes another's
    // claims only once that one's resume point has: this takes a 10 s round
    // per change of owner along the claims (two or three here).
    wait_until(
        SETTLE,
        "every resume point past the last deletion",
        || async {
            for name in names {
                if resume_point(&client, name).await.is_none_or(|r| r < last) {
                    return false;
                }
            }
            true
        },
    )
    .await;
    let mut outputs = Vec::new();
    for daemon in &mut sidecars {
        outputs.push(reported(&stop(daemon).await));
    }
    let all_lines: Vec<Line> = outputs.concat();
    assert_eq!(claimed.len(), reporting.len(), "{claimed:?}");
    assert_eq!(all_lines.len(), reporting.len(), "{all_lines:?}");
    for (holder, reaped_by) in died
        .iter()
        .map(|h| (h, "expiry"))
        .chain(revoked.iter().map(|h| (h, "revoke")))
    {
        assert_eq!(
            times(&all_lines, holder),
            1,
            "{} in {all_lines:?}",
            holder.key
        );
        // The sidecar that wrote the line is the one named in its claim.
        let rev = claimed_at(&claimed, holder).unwrap();
        let owner = &claimed[&(rev, holder.create_revision)];
        let by = names
            .iter()
            .position(|n| n == owner)
            .expect("a sidecar's name");
        let line = outputs[by]
            .iter()
            .find(|((key, _), _)| *key == holder.key)
            .unwrap_or_else(|| panic!("{owner} claimed {} and did not report it", holder.key));
        assert_eq!(line.1, reaped_by, "{}", holder.key);
    }
    for holder in &released {
        assert_eq!(
            times(&all_lines, holder),
            0,
            "released {} reported",
            holder.key
        );
    }
}

/// The shape of a crash: group A is reported and passed by the resume
/// point; the sidecar is killed with SIGKILL; group B dies while it is away
/// (one of B claimed in its name by hand, as if it had won that claim and
/// died before writing the line); started again under the same name, it
/// reports every one of B once, and nothing of A again.
#[tokio::test]
async fn sidecar_killed_and_restarted_reports_what_died_while_away_once() {
    let cluster = EtcdCluster::one().await;
    let mut client = cluster.client().await;
    let mut group_a = holders(&client, "a", 5, 1).await;
    let mut group_b = holders(&client, "b", 5, 1).await;
    let before = revision(&client).await;
    let mut first = sidecar(&cluster, "side-1", &[]);
    wait_following(&client, "side-1", before, &first).await;
    kill_all(&mut group_a);
    let a_refs: Vec<&Holder> = group_a.iter().collect();
    let (_, last_a) = wait_claimed(&client, &a_refs).await;
    wait_resumed_past(&client, "side-1", last_a).await;
    let first_lines = reported(&kill9(&mut first).await);
    for holder in &group_a {
        assert_eq!(times(&first_lines, holder), 1, "{first_lines:?}");
    }

    kill_all(&mut group_b);
    let b_refs: Vec<&Holder> = group_b.iter().collect();
    wait_deleted(&client, &b_refs).await;
    let saved = resume_point(&client, "side-1").await.expect("saved");
    let mut b_deleted = Vec::new();
    for holder in &group_b {
        b_deleted.push(deleted_at(&client, &holder.key, holder.create_revision).await);
    }
    assert!(
        b_deleted.iter().all(|rev| *rev > saved),
        "{b_deleted:?} after {saved}"
    );
    let hand_claimed = format!(
        "lease-sweeper/claims/{}/{}",
        b_deleted[0], group_b[0].create_revision
    );
    client.put(hand_claimed, "side-1", None).await.unwrap();
    let restart = revision(&client).await;
    let mut second = sidecar(&cluster, "side-1", &[]);
    wait_following(&client, "side-1", restart, &second).await;

    let last_b = *b_deleted.iter().max().unwrap();
    wait_resumed_past(&client, "side-1", last_b).await;
    let second_lines = reported(&stop(&mut second).await);
    assert_eq!(second_lines.len(), group_b.len(), "{second_lines:?}");
    for holder in &group_b {
        assert_eq!(times(&first_lines, holder), 0, "{first_lines:?}");
        assert_eq!(times(&second_lines, holder), 1, "{second_lines:?}");
    }
    let claims = claims(&client).await;
    for (holder, rev) in group_b.iter().zip(&b_deleted) {
        assert_eq!(claims[&(*rev, holder.create_revision)], "side-1");
    }
}

/// Another sidecar's claim on a deletion, as etcd holds it between the
/// claim and that sidecar's resume point passing it. The deletions are
/// made while the reporting sidecar (side-2) is stopped, so their claims
/// can be written by hand, as their owners would have written them, before
/// side-2 starts again from its resume point and reads those deletions:
/// side-1 was killed with SIGKILL right after it started (its liveness key
/// lasts up to 10 s more) and "claimed" group X; side-3, which no longer
/// runs, "claimed" group Z and its resume point passed them.
#[tokio::test]
async fn dead_sidecars_unconfirmed_claims_are_taken_over_once_its_liveness_key_is_gone() {
    let cluster = EtcdCluster::one().await;
    let mut client = cluster.client().await;
    let mut group_a = holders(&client, "a", 2, 1).await;
    let mut group_x = holders(&client, "x", 3, 1).await;
    let mut group_z = holders(&client, "z", 2, 1).await;
    let before = revision(&client).await;
    let mut side_2 = sidecar(&cluster, "side-2", &[]);
    wait_following(&client, "side-2", before, &side_2).await;
    kill_all(&mut group_a);
    let a_refs: Vec<&Holder> = group_a.iter().collect();
    let (_, last_a) = wait_claimed(&client, &a_refs).await;
    wait_resumed_past(&client, "side-2", last_a).await;
    let first_lines = reported(&stop(&mut side_2).await);
    assert_eq!(first_lines.len(), group_a.len(), "{first_lines:?}");
    let before = revision(&client).await;
    let mut side_1 = sidecar(&cluster, "side-1", &[]);
    wait_following(&client, "side-1", before, &side_1).await;
    kill9(&mut side_1).await;
    let alive = client
        .get("lease-sweeper/alive/side-1", None)
        .await
        .unwrap()
        .kvs()[0]
        .create_revision();

    for holder in group_x.iter_mut().chain(&mut group_z) {
        holder.kill();
    }
    let dying: Vec<&Holder> = group_x.iter().chain(&group_z).collect();
    wait_deleted(&client, &dying).await;
    let mut deleted = Vec::new();
    for holder in &dying {
        deleted.push(deleted_at(&client, &holder.key, holder.create_revision).await);
    }
    for (holder, rev) in dying.iter().zip(&deleted) {
        let owner = if holder.name.starts_with("locks/x") {
            "side-1"
        } else {
            "side-3"
        };
        let key = format!("lease-sweeper/claims/{rev}/{}", holder.create_revision);
        client.put(key, owner, None).await.unwrap();
    }
    let last = *deleted.iter().max().unwrap();
    client
        .put("lease-sweeper/resume/side-3", last.to_string(), None)
        .await
        .unwrap();
    let restart = revision(&client).await;
    let mut side_2 = sidecar(&cluster, "side-2", &[]);
    wait_following(&client, "side-2", restart, &side_2).await;

    // While side-1's liveness key lasts, its claims wait: nothing of X is
    // written (the lines are read before the key is looked at).
    let looks = std::cell::Cell::new(0);
    poll(WAIT, "side-1's liveness key gone", || async {
        let lines = reported(&side_2.lines());
        let got = client
            .clone()
            .get("lease-sweeper/alive/side-1", None)
            .await
            .map_err(|e| e.to_string())?;
        if got.kvs().is_empty() {
            return Ok(());
        }
        looks.set(looks.get() + 1);
        for holder in &group_x {
            assert_eq!(
                times(&lines, holder),
                0,
                "taken over while alive: {lines:?}"
            );
        }
        Err(String::new())
    })
    .await;
    assert!(
        looks.get() > 50,
        "side-1's key was gone within a pass of side-2 following"
    );
    // Its resume point passes the last deletion only once every claim on
    // them is settled: X taken over and reported, Z confirmed as side-3's.
    wait_resumed_past(&client, "side-2", last).await;
    let lines = reported(&stop(&mut side_2).await);
    let claims = claims(&client).await;
    let alive_gone = deleted_at(&client, "lease-sweeper/alive/side-1", alive).await;
    assert_eq!(lines.len(), group_x.len(), "{lines:?}");
    for (holder, rev) in dying.iter().zip(&deleted) {
        let taken = holder.name.starts_with("locks/x");
        assert_eq!(times(&lines, holder), usize::from(taken), "{lines:?}");
        let key = format!("lease-sweeper/claims/{rev}/{}", holder.create_revision);
        let got = client.get(key, None).await.unwrap();
        let claim = &got.kvs()[0];
        if taken {
            assert_eq!(
                claim.value_str().unwrap(),
                "side-2 reported",
                "taken over, then marked reported once its line was out"
            );
            // Taken over only after side-1's liveness key was gone.
            assert!(
                claim.mod_revision() > alive_gone,
                "{claim:?} vs {alive_gone}"
            );
        } else {
            assert_eq!(claim.value_str().unwrap(), "side-3");
        }
        let value = claim.value_str().unwrap();
        assert_eq!(
            claims[&(*rev, holder.create_revision)],
            value.strip_suffix(" reported").unwrap_or(value)
        );
    }
    assert!(lines.iter().all(|(_, by)| by == "expiry"), "{lines:?}");
    for holder in &group_a {
        assert_eq!(times(&lines, holder), 0, "A again: {lines:?}");
    }
}
