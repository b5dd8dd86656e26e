//! The etcd backend's test harness against real etcd: members on loopback
//! (`cluster`), lock holders made with etcd's own Lock RPC and CLI
//! (`holders`), and the self-tests here that prove the harness does what
//! the backend's tests will lean on: keys laid out as etcd lays them out,
//! holders that die, release and revoke as etcd sees it, a cluster that
//! survives a killed member, TLS with client certificates, and auth that
//! confines the daemon's user.

// The harness serves the backend's tests too; what only they use is not
// dead.
#![allow(dead_code)]

pub(crate) mod cluster;
pub(crate) mod holders;

// The backend's own tests, by what each proves.
mod access;
mod faults;
mod fleet;
mod signal;

use std::time::{Duration, Instant};

use etcd_client::{
    Certificate, Client, ConnectOptions, GetOptions, LeaseTimeToLiveOptions, TlsOptions,
};

use crate::support::{poll, wait_until};
use cluster::{EtcdCluster, LOCKER_PASSWORD, LOCKER_USER, SWEEPER_PASSWORD, SWEEPER_USER};
use holders::{EtcdctlLock, Holder, LockKey, Waiter, gone_after, lease_ttl, lock_key, lock_keys};

/// Long enough for any lease of these tests to expire and be deleted.
const EXPIRY_TIMEOUT: Duration = Duration::from_secs(15);

/// Runs etcdctl with exactly `env` (plus PATH); returns whether it
/// succeeded and all it wrote.
async fn etcdctl(env: &[(String, String)], args: &[&str]) -> (bool, String) {
    let out = tokio::process::Command::new(crate::support::tool("etcdctl", "etcd-client"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().map(|(k, v)| (k, v)))
        .args(args)
        .output()
        .await
        .expect("running etcdctl");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// Waits until `deadline`, failing as soon as `lease` is seen gone: a
/// lease alive past the moment it would have expired unrenewed was renewed.
async fn alive_until(client: &Client, lease: i64, deadline: Instant) {
    poll(
        EXPIRY_TIMEOUT,
        "the lease alive past its deadline",
        || async {
            let ttl = lease_ttl(client, lease).await;
            assert!(ttl >= 0, "lease {lease:x} expired");
            if Instant::now() > deadline {
                Ok(())
            } else {
                Err(format!("TTL {ttl}"))
            }
        },
    )
    .await
}

#[tokio::test]
async fn lock_rpc_holder_writes_name_slash_lease_hex_on_its_lease() {
    let cluster = EtcdCluster::one().await;
    let client = cluster.client().await;

    let holder = Holder::acquire(&client, "locks/a", 3).await;

    assert_eq!(holder.key, format!("locks/a/{:x}", holder.lease));
    assert_eq!(holder.key, lock_key("locks/a", holder.lease));
    assert_eq!(
        lock_keys(&client, "locks/").await,
        vec![LockKey {
            key: holder.key.clone(),
            lease: holder.lease,
            create_revision: holder.create_revision,
        }]
    );
    let value = client.clone().get(holder.key.as_str(), None).await.unwrap();
    assert_eq!(value.kvs()[0].value(), b"", "the Lock RPC writes no value");
    let lease = client
        .clone()
        .lease_time_to_live(
            holder.lease,
            Some(LeaseTimeToLiveOptions::new().with_keys()),
        )
        .await
        .unwrap();
    assert_eq!(lease.granted_ttl(), 3);
    assert_eq!(lease.keys(), [holder.key.as_bytes().to_vec()]);
    // `env` is what etcdctl (and the daemon) need to find the same key.
    let (ok, out) = etcdctl(
        &cluster.env(),
        &["get", "--prefix", "--keys-only", "locks/"],
    )
    .await;
    assert!(ok, "{out}");
    assert_eq!(out.trim(), holder.key);
}

/// The timings `cluster` starts etcd with let it grant a 1 s lease as asked
/// (with etcd's default timings the floor is 2 s). TimeToLive truncates
/// what is left to whole seconds, so a live 1 s lease reads 0; only -1
/// means gone.
#[tokio::test]
async fn one_second_lease_granted_as_asked_reads_ttl_zero_until_gone() {
    let cluster = EtcdCluster::one().await;
    let mut client = cluster.client().await;

    let lease = client.lease_grant(1, None).await.unwrap();

    assert_eq!(lease.ttl(), 1);
    let left = client.lease_time_to_live(lease.id(), None).await.unwrap();
    assert_eq!((left.granted_ttl(), left.ttl()), (1, 0));
    wait_until(EXPIRY_TIMEOUT, "the 1 s lease gone", || async {
        lease_ttl(&client, lease.id()).await == -1
    })
    .await;
}

#[tokio::test]
async fn killed_holder_key_deleted_by_etcd_after_its_ttl() {
    let cluster = EtcdCluster::one().await;
    let client = cluster.client().await;
    let mut holder = Holder::acquire(&client, "locks/dies", 2).await;

    let killed = Instant::now();
    holder.kill();

    let took = gone_after(&client, &holder.key, killed, EXPIRY_TIMEOUT).await;
    // The last renewal came at most a third of the TTL before the kill, so
    // the key lived on for most of a TTL: etcd expired it, nothing else.
    assert!(
        took >= Duration::from_millis(1_000),
        "gone {took:?} after the kill"
    );
    assert_eq!(lease_ttl(&client, holder.lease).await, -1);
}

#[tokio::test]
async fn released_holder_key_gone_while_its_lease_lives_on() {
    let cluster = EtcdCluster::one().await;
    let client = cluster.client().await;
    let mut holder = Holder::acquire(&client, "locks/released", 2).await;

    holder.release().await;

    assert_eq!(lock_keys(&client, "locks/").await, vec![]);
    // Still renewed after the unlock: alive past its first TTL (plus the
    // half second etcd may take to notice an expiry).
    alive_until(
        &client,
        holder.lease,
        holder.granted_at + Duration::from_millis(2_500),
    )
    .await;
    assert_eq!(lock_keys(&client, "locks/").await, vec![]);
}

#[tokio::test]
async fn revoked_holder_key_gone_and_lease_ttl_minus_one() {
    let cluster = EtcdCluster::one().await;
    let client = cluster.client().await;
    let mut holder = Holder::acquire(&client, "locks/revoked", 3).await;

    holder.revoke().await;

    assert_eq!(lock_keys(&client, "locks/").await, vec![]);
    assert_eq!(lease_ttl(&client, holder.lease).await, -1);
}

#[tokio::test]
async fn waiter_queues_behind_holder_and_acquires_on_release() {
    let cluster = EtcdCluster::one().await;
    let client = cluster.client().await;
    let mut holder = Holder::acquire(&client, "locks/q", 3).await;

    let mut waiter = Waiter::queue(&client, "locks/q", 3).await;

    assert_eq!(waiter.key, lock_key("locks/q", waiter.lease));
    assert!(waiter.create_revision > holder.create_revision);
    let keys = lock_keys(&client, "locks/q/").await;
    assert_eq!(
        keys.iter().map(|k| k.key.as_str()).collect::<Vec<_>>(),
        [holder.key.as_str(), waiter.key.as_str()]
    );
    assert_eq!(keys[1].lease, waiter.lease);
    assert!(
        !waiter.returned(),
        "the waiter's Lock call is still blocked"
    );
    holder.release().await;
    assert_eq!(waiter.acquired(Duration::from_secs(10)).await, waiter.key);
}

#[tokio::test]
async fn killed_waiter_key_deleted_at_once_while_its_lease_lives() {
    let cluster = EtcdCluster::one().await;
    let client = cluster.client().await;
    let _holder = Holder::acquire(&client, "locks/w", 10).await;
    let mut waiter = Waiter::queue(&client, "locks/w", 10).await;

    let killed = Instant::now();
    waiter.kill();

    // The server cancels the abandoned Lock call and deletes its key
    // itself, long before the 10 s lease could expire.
    let took = gone_after(&client, &waiter.key, killed, Duration::from_secs(5)).await;
    assert!(
        lease_ttl(&client, waiter.lease).await > 0,
        "gone after {took:?}"
    );
}

#[tokio::test]
async fn etcdctl_lock_holder_killed_key_deleted_after_its_session_ttl() {
    let cluster = EtcdCluster::one().await;
    let client = cluster.client().await;
    let mut cli = EtcdctlLock::spawn(&cluster, "locks/cli", 2).await;
    cli.wait_holding(&client).await;
    assert_eq!(cli.key, lock_key("locks/cli", cli.lease));
    let session = client
        .clone()
        .lease_time_to_live(cli.lease, None)
        .await
        .unwrap();
    assert_eq!(
        session.granted_ttl(),
        2,
        "etcdctl lock --ttl is the session's"
    );
    let pgid = cli.pgid().unwrap() as i32;

    let killed = Instant::now();
    cli.kill();

    let took = gone_after(&client, &cli.key, killed, EXPIRY_TIMEOUT).await;
    assert!(
        took >= Duration::from_millis(1_000),
        "gone {took:?} after the kill"
    );
    assert_eq!(lease_ttl(&client, cli.lease).await, -1);
    // Its `sleep` went with it (reaped by init once killed).
    wait_until(
        Duration::from_secs(5),
        "etcdctl's process group gone",
        || async { nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), None).is_err() },
    )
    .await;
}

#[tokio::test]
async fn three_members_serve_through_a_killed_leader_and_take_it_back() {
    let mut cluster = EtcdCluster::three().await;
    assert_eq!(cluster.endpoints().split(',').count(), 3);
    let client = cluster.client().await;
    let before = Holder::acquire(&client, "locks/ha-before", 2).await;
    let leader = cluster.leader_index().await.expect("a leader");

    let killed = Instant::now();
    cluster.kill_member(leader);

    let new_leader = cluster.wait_leader().await;
    assert_ne!(new_leader, leader);
    // Through every endpoint, the killed one's included: a request the
    // balancer sends there fails, and the next may land on a live member.
    poll(
        Duration::from_secs(15),
        "a write through the others",
        || {
            let mut client = client.clone();
            async move {
                client
                    .put("written-without-the-old-leader", "yes", None)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            }
        },
    )
    .await;
    let survivors = cluster.running_client().await;
    let after = Holder::acquire(&survivors, "locks/ha-after", 2).await;
    cluster.restart_member(leader).await;
    let back = cluster.member_client(leader).await;
    poll(
        Duration::from_secs(15),
        "the restarted member caught up",
        || {
            let mut back = back.clone();
            let key = after.key.clone();
            async move {
                let got = back
                    .get(key, Some(GetOptions::new().with_serializable()))
                    .await
                    .map_err(|e| e.to_string())?;
                if got.kvs().is_empty() {
                    Err("not there yet".into())
                } else {
                    Ok(())
                }
            }
        },
    )
    .await;
    // The holder from before the kill renews its lease through it. The
    // new leader gives every lease a full TTL again (plus an election
    // timeout) when it takes over, within a second of the kill here; 5 s
    // after the kill only renewals can have kept a 2 s lease.
    alive_until(&survivors, before.lease, killed + Duration::from_secs(5)).await;
    assert_eq!(lock_keys(&survivors, "locks/ha-before/").await.len(), 1);
}

#[tokio::test]
async fn tls_client_certificate_accepted_and_a_client_without_one_refused() {
    let cluster = EtcdCluster::one_tls().await;
    assert!(cluster.endpoints().starts_with("https://127.0.0.1:"));
    let tls = cluster.tls().unwrap();

    let mut client = cluster.client().await;
    client.put("locks/tls", "x", None).await.unwrap();
    let (ok, out) = etcdctl(&cluster.env(), &["get", "--print-value-only", "locks/tls"]).await;
    assert!(ok, "{out}");
    assert_eq!(out.trim(), "x");

    let ca_only =
        TlsOptions::new().ca_certificate(Certificate::from_pem(std::fs::read(&tls.ca).unwrap()));
    let refused = match Client::connect(
        [cluster.endpoints()],
        Some(ConnectOptions::new().with_tls(ca_only)),
    )
    .await
    {
        Ok(mut anonymous) => anonymous.get("locks/tls", None).await.map(drop),
        Err(e) => Err(e),
    };
    assert!(
        refused.is_err(),
        "a client without a certificate was served"
    );
    let without_cert: Vec<_> = cluster
        .env()
        .into_iter()
        .filter(|(k, _)| k != "ETCDCTL_CERT" && k != "ETCDCTL_KEY")
        .collect();
    let (ok, out) = etcdctl(
        &without_cert,
        &[
            "--dial-timeout=1s",
            "--command-timeout=2s",
            "get",
            "locks/tls",
        ],
    )
    .await;
    assert!(!ok, "etcdctl without a certificate was served: {out}");
}

#[tokio::test]
async fn auth_sweeper_reads_locks_and_writes_only_its_own_prefix() {
    let mut cluster = EtcdCluster::one().await;
    cluster.enable_auth().await;
    let locker = cluster.client_as(LOCKER_USER, LOCKER_PASSWORD).await;
    let holder = Holder::acquire(&locker, "locks/a", 3).await;
    let mut sweeper = cluster.client_as(SWEEPER_USER, SWEEPER_PASSWORD).await;

    assert_eq!(lock_keys(&sweeper, "locks/").await[0].key, holder.key);
    sweeper.put("lease-sweeper/x", "mine", None).await.unwrap();
    let denied = |what: &str, result: Result<(), etcd_client::Error>| {
        let e = result.expect_err(what).to_string();
        assert!(e.contains("etcdserver: permission denied"), "{what}: {e}");
    };
    denied(
        "a write to locks/x",
        sweeper.put("locks/x", "no", None).await.map(drop),
    );
    denied(
        "deleting the holder's key",
        sweeper.delete(holder.key.as_str(), None).await.map(drop),
    );
    // Revoking a lease needs write permission on every key attached to it.
    denied(
        "revoking the holder's lease",
        sweeper.lease_revoke(holder.lease).await.map(drop),
    );
    assert_eq!(lock_keys(&sweeper, "locks/").await[0].key, holder.key);
    // Without a user nothing is served at all.
    let mut anonymous = Client::connect([cluster.endpoints()], None).await.unwrap();
    let e = anonymous.get("locks/", None).await.unwrap_err().to_string();
    assert!(e.contains("user name is empty"), "{e}");
    // The root login `env` carries works for etcdctl.
    let (ok, out) = etcdctl(
        &cluster.env(),
        &["get", "--prefix", "--keys-only", "locks/"],
    )
    .await;
    assert!(ok, "{out}");
    assert_eq!(out.trim(), holder.key);
}

#[tokio::test]
async fn compact_to_current_removes_every_older_revision() {
    let cluster = EtcdCluster::one().await;
    let mut client = cluster.client().await;
    let first = client.put("k", "1", None).await.unwrap();
    let old = first.header().unwrap().revision();
    client.put("k", "2", None).await.unwrap();

    let compacted = cluster.compact_to_current().await;

    assert!(compacted > old);
    let e = client
        .get("k", Some(GetOptions::new().with_revision(old)))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("required revision has been compacted"), "{e}");
    assert_eq!(
        cluster.compact_to_current().await,
        compacted,
        "a no-op again"
    );
}

#[tokio::test]
async fn dropped_cluster_leaves_no_etcd_running() {
    let cluster = EtcdCluster::three().await;
    let pids = cluster.pids();
    assert_eq!(pids.len(), 3);

    drop(cluster);

    for pid in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "etcd {pid} outlived its cluster"
        );
    }
}
