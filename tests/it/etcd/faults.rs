//! A sidecar through etcd's faults, against real etcd and the real binary:
//! history compacted past its resume point while it was stopped (it says
//! exactly what it missed, in a line and in `lock_events_missed_total`,
//! and goes on), the leader of three members killed under it, the only
//! member killed and started again under its watch, once while idle and
//! once in the middle of reporting 3,000 revokes. Through each, every
//! expiry etcd still has a record of is reported exactly once, and the
//! daemon keeps running, saying when its sweeps fail and when they
//! recover. Last, a sidecar killed for good after it reported an expiry:
//! its peer must not report that expiry again.

use std::time::Duration;

use etcd_client::{PutOptions, Txn, TxnOp};

use super::cluster::EtcdCluster;
use super::fleet::{
    Line, WAIT, deleted_at, holders, kill_all, reported, resume_point, revision, sidecar,
    sidecar_env, stop, times, wait_claimed, wait_deleted, wait_following, wait_resumed_past,
};
use super::holders::Holder;
use crate::observability::support::{daemon_with_endpoint, scrape, value};
use crate::support::{events, poll, wait_until};

const MISSED: &str = "lock_events_missed_total{backend=\"etcd\"}";
const HELD: &str = "lock_held_current{backend=\"etcd\"}";

/// Waits until every one of `holders` is claimed and `name`'s resume point
/// has passed the last of their deletions: nothing about them is left for
/// it to write.
async fn wait_settled(client: &etcd_client::Client, name: &str, holders: &[&Holder]) {
    let (_, last) = wait_claimed(client, holders).await;
    wait_resumed_past(client, name, last).await;
}

/// Asserts each of `holders` is in `lines` exactly once.
fn once_each(lines: &[Line], holders: &[&Holder]) {
    for holder in holders {
        assert_eq!(times(lines, holder), 1, "{} in {lines:?}", holder.key);
    }
}

/// Asserts that the sweep failed at least once and that every
/// `sweep_failed` line is followed by a `sweep_recovered` one.
fn failed_then_recovered(lines: &[String]) {
    let names: Vec<String> = lines
        .iter()
        .filter_map(|l| crate::support::fields(l).get("message").cloned())
        .collect();
    let last_failed = names.iter().rposition(|m| m == "sweep_failed");
    let last_recovered = names.iter().rposition(|m| m == "sweep_recovered");
    match (last_failed, last_recovered) {
        (Some(f), Some(r)) => assert!(f < r, "sweep_failed after the last recovery:\n{lines:?}"),
        _ => panic!(
            "no sweep_failed then sweep_recovered:\n{}",
            lines.join("\n")
        ),
    }
}

#[tokio::test]
async fn history_compacted_past_resume_point_is_reported_missed_once_and_sweeping_goes_on() {
    let cluster = EtcdCluster::one().await;
    let mut client = cluster.client().await;
    let env = cluster.env();
    let mut group_a = holders(&client, "a", 3, 1).await;
    let mut group_b = holders(&client, "b", 3, 1).await;
    let before = revision(&client).await;
    let mut first = sidecar(&cluster, "side-1", &[]);
    wait_following(&client, "side-1", before, &first).await;
    kill_all(&mut group_a);
    let a_refs: Vec<&Holder> = group_a.iter().collect();
    wait_settled(&client, "side-1", &a_refs).await;
    let first_lines = reported(&stop(&mut first).await);
    once_each(&first_lines, &a_refs);
    let saved = resume_point(&client, "side-1").await.expect("saved");

    kill_all(&mut group_b);
    let b_refs: Vec<&Holder> = group_b.iter().collect();
    wait_deleted(&client, &b_refs).await;
    let mut b_deleted = Vec::new();
    for holder in &group_b {
        b_deleted.push(deleted_at(&client, &holder.key, holder.create_revision).await);
    }
    for i in 0..10 {
        client.put("other/key", i.to_string(), None).await.unwrap();
    }
    let compacted = cluster.compact_to_current().await;
    assert!(saved < compacted, "{saved} {compacted}");
    let restart = revision(&client).await;
    let (mut second, addr) = daemon_with_endpoint(&sidecar_env(&env, "side-1", &[])).await;
    wait_following(&client, "side-1", restart, &second).await;

    second
        .wait_for_event("etcd_events_missed", Duration::from_secs(15))
        .await;
    let missed = events(&second.lines(), "etcd_events_missed").remove(0);
    assert_eq!(missed["level"], "error", "{missed:?}");
    let field = |name: &str| -> i64 { missed[name].parse().expect("a number") };
    let (from, to, n) = (
        field("fromRevision"),
        field("toRevision"),
        field("missedRevisions"),
    );
    assert_eq!(from, saved + 1, "{missed:?}");
    assert!(to >= compacted, "{missed:?} compacted at {compacted}");
    assert_eq!(n, to - from + 1, "{missed:?}");
    assert!(n > 0, "{missed:?}");
    for rev in &b_deleted {
        assert!(
            (from..=to).contains(rev),
            "B's deletion at {rev}: {missed:?}"
        );
    }
    poll(WAIT, "the missed revisions counted", || async {
        let got = value(&scrape(addr).await, MISSED);
        if got == Some(n as f64) {
            Ok(())
        } else {
            Err(format!("{MISSED} = {got:?}"))
        }
    })
    .await;

    let mut group_c = holders(&client, "c", 3, 1).await;
    kill_all(&mut group_c);
    let c_refs: Vec<&Holder> = group_c.iter().collect();
    wait_settled(&client, "side-1", &c_refs).await;
    assert_eq!(value(&scrape(addr).await, MISSED), Some(n as f64));
    let output = stop(&mut second).await;
    let lines = reported(&output);
    assert_eq!(lines.len(), group_c.len(), "{lines:?}");
    once_each(&lines, &c_refs);
    assert_eq!(events(&output, "etcd_events_missed").len(), 1);
}

#[tokio::test]
async fn leader_member_killed_expiries_around_and_after_reported_once_and_daemon_runs_on() {
    let mut cluster = EtcdCluster::three().await;
    let client = cluster.client().await;
    let mut around = holders(&client, "around", 5, 1).await;
    let before = revision(&client).await;
    let mut side = sidecar(&cluster, "side-1", &[]);
    wait_following(&client, "side-1", before, &side).await;
    let leader = cluster.leader_index().await.expect("a leader");

    kill_all(&mut around);
    cluster.kill_member(leader);

    cluster.wait_leader().await;
    let survivors = cluster.running_client().await;
    let mut after = holders(&survivors, "after", 5, 1).await;
    kill_all(&mut after);
    let all: Vec<&Holder> = around.iter().chain(&after).collect();
    wait_deleted(&survivors, &all).await;
    wait_settled(&survivors, "side-1", &all).await;
    assert!(
        side.child.try_wait().unwrap().is_none(),
        "the daemon exited:\n{}",
        side.lines().join("\n")
    );
    let output = stop(&mut side).await;
    let lines = reported(&output);
    assert_eq!(lines.len(), all.len(), "{lines:?}");
    once_each(&lines, &all);
    if !events(&output, "sweep_failed").is_empty() {
        failed_then_recovered(&output);
    }
}

#[tokio::test]
async fn only_member_killed_and_restarted_sweep_fails_recovers_and_reports_once() {
    let mut cluster = EtcdCluster::one().await;
    let client = cluster.client().await;
    let mut around = holders(&client, "around", 3, 1).await;
    let before = revision(&client).await;
    let mut side = sidecar(&cluster, "side-1", &[]);
    wait_following(&client, "side-1", before, &side).await;

    kill_all(&mut around);
    cluster.kill_member(0);
    side.wait_for_event("sweep_failed", WAIT).await;
    cluster.restart_member(0).await;
    side.wait_for_event("sweep_recovered", WAIT).await;

    let client = cluster.client().await;
    let mut after = holders(&client, "after", 3, 1).await;
    kill_all(&mut after);
    let all: Vec<&Holder> = around.iter().chain(&after).collect();
    wait_deleted(&client, &all).await;
    wait_settled(&client, "side-1", &all).await;
    let output = stop(&mut side).await;
    failed_then_recovered(&output);
    let failed = events(&output, "sweep_failed").remove(0);
    assert_eq!(failed["level"], "error", "{failed:?}");
    assert!(failed["error"].contains("watch"), "{failed:?}");
    let lines = reported(&output);
    assert_eq!(lines.len(), all.len(), "{lines:?}");
    once_each(&lines, &all);
}

/// Locks held on one lease, the way one client session holds many: keys
/// `locks/many-<i>/<lease hex>` with the lease and no value, as the Lock RPC
/// writes them, put 125 to a transaction. Revoking the lease deletes them
/// all at one revision: one watch response, 3,000 lease questions, three
/// batches of claims and lines.
async fn locks_on_one_lease(client: &mut etcd_client::Client, n: usize) -> (i64, Vec<String>) {
    let lease = client.lease_grant(60, None).await.unwrap().id();
    let keys: Vec<String> = (0..n)
        .map(|i| format!("locks/many-{i}/{lease:x}"))
        .collect();
    for chunk in keys.chunks(125) {
        let puts: Vec<TxnOp> = chunk
            .iter()
            .map(|k| TxnOp::put(k.as_str(), "", Some(PutOptions::new().with_lease(lease))))
            .collect();
        client.txn(Txn::new().and_then(puts)).await.unwrap();
    }
    (lease, keys)
}

#[tokio::test]
async fn only_member_killed_in_the_middle_of_a_mass_revoke_each_still_reported_once() {
    let mut cluster = EtcdCluster::one().await;
    let mut client = cluster.client().await;
    let before = revision(&client).await;
    let env = cluster.env();
    let (mut side, addr) = daemon_with_endpoint(&sidecar_env(&env, "side-1", &[])).await;
    wait_following(&client, "side-1", before, &side).await;
    // Written while it follows: it asks the lease's deadline as the first
    // lock comes to hold. Waited for, not assumed: all 3,000 held, then two
    // more passes, so the question was asked and answered before the revoke.
    let (lease, keys) = locks_on_one_lease(&mut client, 3_000).await;
    let passes = "lease_sweeper_pass_duration_seconds_count{service=\"lock_sweeper\"}";
    let held_at = poll(WAIT, "all 3,000 held", || async {
        let text = scrape(addr).await;
        match (value(&text, HELD), value(&text, passes)) {
            (Some(3_000.0), Some(n)) => Ok(n),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    wait_until(WAIT, "two more passes", || async {
        value(&scrape(addr).await, passes).is_some_and(|n| n >= held_at + 2.0)
    })
    .await;

    client.lease_revoke(lease).await.unwrap();
    // The first batch's lines are out: the next batches' claims are being
    // sent when the only member dies.
    side.wait_for_events("lease_expired", 1, WAIT).await;
    let at_kill = reported(&side.lines()).len();
    cluster.kill_member(0);
    side.wait_for_event("sweep_failed", WAIT).await;
    cluster.restart_member(0).await;

    let client = cluster.client().await;
    let now = revision(&client).await;
    wait_resumed_past(&client, "side-1", now).await;
    let output = stop(&mut side).await;
    assert!(at_kill < keys.len(), "all reported before the kill");
    failed_then_recovered(&output);
    let lines = reported(&output);
    assert_eq!(lines.len(), keys.len());
    let mut seen: Vec<&str> = lines.iter().map(|((key, _), _)| key.as_str()).collect();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), keys.len(), "some reported twice");
    // The deadline, 60 s ahead, was known: each was revoked.
    assert!(lines.iter().all(|(_, by)| by == "revoke"), "{lines:?}");
}

/// side-1 reports O and Q and finishes the batch, but its resume point
/// stays short of Q, since P, deleted between them, is claimed by a peer
/// (side-3) that is alive and has not confirmed it: the state right after
/// a storm shared by several sidecars. side-1 is then killed for good; its
/// peer side-2, reading the same deletions, must not report Q again.
/// side-1 and side-2 start from a resume point written by hand (as if they
/// had stopped there), and side-3's claim and liveness key are written by
/// hand, so the order of claims is fixed.
#[tokio::test]
async fn expiry_reported_by_a_sidecar_later_killed_is_not_reported_again_by_its_peer() {
    let cluster = EtcdCluster::one().await;
    let mut client = cluster.client().await;
    let mut trio = holders(&client, "opq", 3, 1).await;
    let start = revision(&client).await;
    let side_3 = client.lease_grant(60, None).await.unwrap().id();
    let alive = PutOptions::new().with_lease(side_3);
    client
        .put("lease-sweeper/alive/side-3", "", Some(alive))
        .await
        .unwrap();
    let mut deleted = Vec::new();
    for holder in &mut trio {
        holder.kill();
        wait_deleted(&client, &[&*holder]).await;
        deleted.push(deleted_at(&client, &holder.key, holder.create_revision).await);
    }
    let (o, p, q) = (&trio[0], &trio[1], &trio[2]);
    let p_claim = format!("lease-sweeper/claims/{}/{}", deleted[1], p.create_revision);
    client.put(p_claim, "side-3", None).await.unwrap();
    for name in ["side-1", "side-2"] {
        let key = format!("lease-sweeper/resume/{name}");
        client.put(key, start.to_string(), None).await.unwrap();
    }
    let before = revision(&client).await;
    let mut side_1 = sidecar(&cluster, "side-1", &[]);
    wait_following(&client, "side-1", before, &side_1).await;
    // Its batch is done: the lines, then the resume point, short of P.
    wait_until(WAIT, "side-1's resume point moved", || async {
        resume_point(&client, "side-1").await == Some(deleted[1] - 1)
    })
    .await;
    let lines_1 = reported(&super::fleet::kill9(&mut side_1).await);
    assert_eq!(
        (times(&lines_1, o), times(&lines_1, q)),
        (1, 1),
        "{lines_1:?}"
    );
    let before = revision(&client).await;
    let mut side_2 = sidecar(&cluster, "side-2", &[]);
    wait_following(&client, "side-2", before, &side_2).await;

    wait_until(WAIT, "side-1's liveness key gone", || async {
        let got = client.clone().get("lease-sweeper/alive/side-1", None).await;
        got.is_ok_and(|g| g.kvs().is_empty())
    })
    .await;
    // side-3 confirms P: side-2 then settles everything up to Q.
    let confirmed = deleted[1].to_string();
    client
        .put("lease-sweeper/resume/side-3", confirmed, None)
        .await
        .unwrap();
    wait_resumed_past(&client, "side-2", deleted[2]).await;
    let lines_2 = reported(&stop(&mut side_2).await);
    assert_eq!(times(&lines_2, o), 0, "{lines_2:?}");
    assert_eq!(times(&lines_2, p), 0, "{lines_2:?}");
    assert_eq!(
        times(&lines_2, q),
        0,
        "side-1 reported {} and finished its batch; side-2 reported it again",
        q.key
    );
}
