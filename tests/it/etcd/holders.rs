//! Lock holders made the way etcd's own clients make them, for the daemon
//! to find, watch and report: a holder of etcd's Lock RPC on a lease it
//! keeps alive, a waiter queued behind it, `etcdctl lock` as a child
//! process, and the listing of what a lock's prefix holds.
//!
//! etcd's Lock RPC writes the key `<name>/<lease id in lowercase hex>` with
//! the lease attached and an empty value (a name that ends in `/` gets
//! `<name>/` plus another `/`); the lowest create revision under `<name>/`
//! holds the lock, the others wait. A holder dies when its lease does: etcd
//! then deletes the key itself.

use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use etcd_client::{Client, GetOptions, LockOptions};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::task::JoinHandle;

use super::cluster::EtcdCluster;
use crate::support::{TempDir, poll, tool};

/// How long a holder's setup may take (grant, Lock, read back).
const SETUP_TIMEOUT: Duration = Duration::from_secs(15);

/// One key under a lock's prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockKey {
    pub key: String,
    pub lease: i64,
    pub create_revision: i64,
}

/// The keys under `prefix`, in queue order (create revision): the holder of
/// a lock first, then its waiters.
pub async fn lock_keys(client: &Client, prefix: &str) -> Vec<LockKey> {
    try_lock_keys(client, prefix)
        .await
        .unwrap_or_else(|e| panic!("listing {prefix}: {e}"))
}

/// `lock_keys` that leaves a failure to the caller: what a wait uses, since
/// a request may fail while the cluster changes leader ("etcdserver: leader
/// changed") or lands on a killed member.
pub async fn try_lock_keys(client: &Client, prefix: &str) -> Result<Vec<LockKey>, String> {
    let got = client
        .clone()
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .map_err(|e| format!("listing {prefix}: {e}"))?;
    let mut keys: Vec<LockKey> = got
        .kvs()
        .iter()
        .map(|kv| LockKey {
            key: String::from_utf8_lossy(kv.key()).into_owned(),
            lease: kv.lease(),
            create_revision: kv.create_revision(),
        })
        .collect();
    keys.sort_by_key(|k| k.create_revision);
    Ok(keys)
}

/// The key etcd's Lock RPC writes for lock `name` on `lease`.
pub fn lock_key(name: &str, lease: i64) -> String {
    format!("{name}/{lease:x}")
}

/// What etcd says is left of `lease`: its remaining TTL in whole seconds,
/// -1 once it has expired or been revoked.
pub async fn lease_ttl(client: &Client, lease: i64) -> i64 {
    client
        .clone()
        .lease_time_to_live(lease, None)
        .await
        .unwrap_or_else(|e| panic!("TimeToLive of lease {lease:x}: {e}"))
        .ttl()
}

/// Grants a lease of `ttl_secs` and keeps it alive from a spawned task.
async fn live_lease(client: &Client, ttl_secs: i64) -> (i64, JoinHandle<()>) {
    let lease = client
        .clone()
        .lease_grant(ttl_secs, None)
        .await
        .expect("granting a lease")
        .id();
    let keeper = tokio::spawn(keep_alive(client.clone(), lease, ttl_secs));
    (lease, keeper)
}

/// Renews `lease` every third of its TTL, as etcd's own clients do, until
/// aborted or the lease is gone. A renewal that fails (a member killed
/// under the stream, or the balancer picking its endpoint) is tried again
/// on a new stream at once, so a kill elsewhere does not kill the holder.
async fn keep_alive(mut client: Client, lease: i64, ttl_secs: i64) {
    let every = Duration::from_millis(ttl_secs.max(1) as u64 * 1000 / 3);
    let retry = Duration::from_millis(50);
    let mut stream = None;
    loop {
        if stream.is_none() {
            stream = client.lease_keep_alive(lease).await.ok();
        }
        let renewed = match &mut stream {
            Some((keeper, responses)) => match keeper.keep_alive().await {
                Ok(()) => responses.message().await,
                Err(e) => Err(e),
            },
            None => Ok(None),
        };
        // Pacing, not a wait for a condition: the renewal interval, or the
        // pause before trying a failed renewal again.
        let pause = match renewed {
            // TTL 0: the lease is gone (revoked); nothing left to keep.
            Ok(Some(r)) if r.ttl() <= 0 => return,
            Ok(Some(_)) => every,
            Ok(None) | Err(_) => {
                stream = None;
                retry
            }
        };
        tokio::time::sleep(pause).await;
    }
}

/// A holder of etcd's Lock RPC: its own lease, kept alive until it is
/// killed (or dropped).
pub struct Holder {
    client: Client,
    pub name: String,
    /// `<name>/<lease hex>`, as the Lock RPC returned it.
    pub key: String,
    pub lease: i64,
    pub create_revision: i64,
    /// When the lease was asked for: it cannot expire before this plus its
    /// TTL.
    pub granted_at: Instant,
    keeper: Option<JoinHandle<()>>,
}

impl Holder {
    /// Takes lock `name` on a fresh lease of `ttl_secs`, waiting (with the
    /// Lock RPC) for whoever holds it now.
    pub async fn acquire(client: &Client, name: &str, ttl_secs: i64) -> Self {
        let granted_at = Instant::now();
        let (lease, keeper) = live_lease(client, ttl_secs).await;
        let locked = tokio::time::timeout(
            SETUP_TIMEOUT,
            client
                .clone()
                .lock(name, Some(LockOptions::new().with_lease(lease))),
        )
        .await
        .unwrap_or_else(|_| panic!("lock {name} not acquired within {SETUP_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("locking {name}: {e}"));
        let key = String::from_utf8(locked.key().to_vec()).expect("a UTF-8 lock key");
        let create_revision = created(client, &key).await;
        Self {
            client: client.clone(),
            name: name.to_string(),
            key,
            lease,
            create_revision,
            granted_at,
            keeper: Some(keeper),
        }
    }

    /// The holder dies: its keep-alives stop, nothing else. etcd deletes
    /// its key once the lease's TTL has run out after the last renewal.
    pub fn kill(&mut self) {
        if let Some(keeper) = self.keeper.take() {
            keeper.abort();
        }
    }

    /// Unlocks (the Unlock RPC deletes the key); the lease stays, and is
    /// still kept alive.
    pub async fn release(&mut self) {
        self.client
            .unlock(self.key.as_str())
            .await
            .unwrap_or_else(|e| panic!("unlocking {}: {e}", self.key));
    }

    /// Revokes the lease while the lock is held: etcd deletes the key with
    /// it at once.
    pub async fn revoke(&mut self) {
        self.kill();
        self.client
            .lease_revoke(self.lease)
            .await
            .unwrap_or_else(|e| panic!("revoking lease {:x}: {e}", self.lease));
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The create revision of `key`, which must exist.
async fn created(client: &Client, key: &str) -> i64 {
    let got = client
        .clone()
        .get(key, None)
        .await
        .unwrap_or_else(|e| panic!("reading {key}: {e}"));
    got.kvs()
        .first()
        .unwrap_or_else(|| panic!("{key} is not there"))
        .create_revision()
}

/// A Lock call waiting behind the holder of `name`, on a lease of its own
/// kept alive. Dropping it cancels the call and stops the keep-alives.
pub struct Waiter {
    pub name: String,
    /// `<name>/<lease hex>`: written when the call queued, not when it
    /// acquires.
    pub key: String,
    pub lease: i64,
    pub create_revision: i64,
    call: JoinHandle<Result<String, etcd_client::Error>>,
    keeper: JoinHandle<()>,
}

impl Waiter {
    /// Calls Lock on `name` from a spawned task and returns once its key is
    /// queued.
    pub async fn queue(client: &Client, name: &str, ttl_secs: i64) -> Self {
        let (lease, keeper) = live_lease(client, ttl_secs).await;
        let mut caller = client.clone();
        let lock_name = name.to_string();
        let call = tokio::spawn(async move {
            let locked = caller
                .lock(lock_name, Some(LockOptions::new().with_lease(lease)))
                .await?;
            Ok(String::from_utf8_lossy(locked.key()).into_owned())
        });
        let key = lock_key(name, lease);
        let create_revision = poll(SETUP_TIMEOUT, &format!("waiter {key} queued"), || {
            let (key, returned) = (key.clone(), call.is_finished());
            async move {
                let keys = try_lock_keys(client, &key).await?;
                match keys.iter().find(|k| k.key == key) {
                    Some(k) => Ok(k.create_revision),
                    // Refused (auth, a bad lease): it will never queue.
                    None if returned => panic!("the Lock call for {key} returned unqueued"),
                    None => Err(format!("keys there: {keys:?}")),
                }
            }
        })
        .await;
        Self {
            name: name.to_string(),
            key,
            lease,
            create_revision,
            call,
            keeper,
        }
    }

    /// Whether its Lock call has returned (acquired or failed).
    pub fn returned(&self) -> bool {
        self.call.is_finished()
    }

    /// Waits for its Lock call to acquire; returns the key it was given.
    pub async fn acquired(&mut self, timeout: Duration) -> String {
        tokio::time::timeout(timeout, &mut self.call)
            .await
            .unwrap_or_else(|_| panic!("waiter {} did not acquire within {timeout:?}", self.key))
            .expect("the waiter's task")
            .unwrap_or_else(|e| panic!("waiter {} failed: {e}", self.key))
    }

    /// The waiting process dies: its Lock call is cancelled and its
    /// keep-alives stop. etcd deletes the key at once (the server gives up
    /// the cancelled call and takes its key back), while the lease lives on
    /// until its TTL runs out.
    pub fn kill(&mut self) {
        self.call.abort();
        self.keeper.abort();
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `etcdctl lock <name> -- sleep 600`: etcd's own CLI holding a lock, in a
/// process group of its own so that its `sleep` dies with it.
pub struct EtcdctlLock {
    pub name: String,
    /// `<name>/<lease hex>`: the key it queued or holds.
    pub key: String,
    pub lease: i64,
    pub create_revision: i64,
    process: Option<Child>,
    /// Its stdout and stderr.
    _dir: TempDir,
}

impl EtcdctlLock {
    /// Starts it with the cluster's `env` and a session of `ttl_secs`
    /// (etcdctl 3.4's `--ttl`, 10 s unless given), and returns once its key
    /// is under `<name>/`: it may still be waiting there. The key is the one
    /// that was not there before, so two of them must not start at once on
    /// one lock.
    pub async fn spawn(cluster: &EtcdCluster, name: &str, ttl_secs: i64) -> Self {
        Self::spawn_with_env(cluster, &cluster.env(), name, ttl_secs).await
    }

    /// `spawn` with another environment (`EtcdCluster::env_as`).
    pub async fn spawn_with_env(
        cluster: &EtcdCluster,
        env: &[(String, String)],
        name: &str,
        ttl_secs: i64,
    ) -> Self {
        let client = cluster.client().await;
        let prefix = format!("{name}/");
        let before = lock_keys(&client, &prefix).await;
        let dir = TempDir::new("etcdctl-lock");
        let out = std::fs::File::create(dir.join("output")).unwrap();
        let mut cmd = Command::new(tool("etcdctl", "etcd-client"));
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(env.iter().map(|(k, v)| (k, v)))
            .arg("lock")
            .arg(format!("--ttl={ttl_secs}"))
            .arg(name)
            .args(["--", "sleep", "600"])
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        let mut process = cmd.spawn().expect("starting etcdctl lock");
        let found = poll(
            SETUP_TIMEOUT,
            &format!("etcdctl's key under {prefix}"),
            || {
                let exited = process.try_wait().ok().flatten();
                let (client, prefix, before, dir) = (&client, &prefix, &before, &dir);
                async move {
                    if let Some(status) = exited {
                        panic!(
                            "etcdctl lock exited ({status}): {}",
                            std::fs::read_to_string(dir.join("output")).unwrap_or_default()
                        );
                    }
                    try_lock_keys(client, prefix)
                        .await?
                        .into_iter()
                        .find(|k| !before.contains(k))
                        .ok_or_else(String::new)
                }
            },
        )
        .await;
        Self {
            name: name.to_string(),
            key: found.key,
            lease: found.lease,
            create_revision: found.create_revision,
            process: Some(process),
            _dir: dir,
        }
    }

    /// Waits until it holds the lock: its command (`sleep`) runs only then.
    pub async fn wait_holding(&self, client: &Client) {
        let key = self.key.clone();
        let prefix = format!("{}/", self.name);
        poll(SETUP_TIMEOUT, &format!("{key} holding"), || {
            let (key, prefix) = (&key, &prefix);
            async move {
                let keys = try_lock_keys(client, prefix).await?;
                match keys.first() {
                    Some(first) if &first.key == key => Ok(()),
                    _ => Err(format!("queue: {keys:?}")),
                }
            }
        })
        .await;
    }

    /// SIGKILLs etcdctl and its command and reaps etcdctl: the holder dies
    /// without unlocking, so its key stays until the session's lease
    /// expires.
    pub fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            let _ = killpg(Pid::from_raw(process.id() as i32), Signal::SIGKILL);
            let _ = process.wait();
        }
    }

    /// The process group's id while it runs.
    pub fn pgid(&self) -> Option<u32> {
        self.process.as_ref().map(Child::id)
    }
}

impl Drop for EtcdctlLock {
    fn drop(&mut self) {
        self.kill();
    }
}

/// How long after `since` `key` was seen gone (polled on `client`);
/// fails after `timeout`.
pub async fn gone_after(client: &Client, key: &str, since: Instant, timeout: Duration) -> Duration {
    poll(timeout, &format!("{key} deleted"), || async {
        let keys = try_lock_keys(client, key).await?;
        if keys.iter().any(|k| k.key == key) {
            Err(format!("still there: {keys:?}"))
        } else {
            Ok(since.elapsed())
        }
    })
    .await
}
