//! Load for the etcd step of `scripts/bench` (`scripts/bench.d/etcd.sh`):
//! lock holders made with etcd's own Lock RPC, a steady lock/unlock
//! workload beside them, and the report that sets what the holders saw
//! against the sidecars' `lease_expired` lines. Not part of the product.
//!
//! ```text
//! etcd_load hold  --endpoint URL --out DIR [--ttl S] [--kill N] [--release N]
//!                 [--revoke N] [--unlock-revoke N] [--prefix P] [--pace R]
//! etcd_load churn --endpoint URL --out FILE [--rate R] [--workers W] [--ttl S]
//! etcd_load report --deletes DIR/deletes.tsv [--act-ms MS] SIDECAR.out...
//! ```
//!
//! `hold` watches `<prefix>/`, then makes every holder: a lease of its own
//! (TTL `--ttl`), `Lock(<prefix>/<group>/<i>, lease)`, and a keep-alive
//! stream renewing the lease every TTL/3 (as etcd's own client does). It
//! writes `DIR/ready` once all hold, then waits for a signal. SIGUSR1: each
//! group does its thing, in interleaved order (kill, release, revoke,
//! unlock-revoke, kill, ...): `kill` stops its keep-alive (the holder
//! dies; etcd deletes its key when the lease runs out), `release` unlocks
//! and goes on renewing its lease, `revoke` revokes its lease while it
//! holds, `unlock-revoke` unlocks, stops renewing and revokes at once
//! (what `etcdctl lock` does when its command ends); with `--pace R`, one
//! holder after another, R a second, instead of all at once. It then waits for
//! the deletion of every holder's key and writes `DIR/deletes.tsv` (key,
//! group, lease hex, epoch ms at which its watch saw the deletion, the
//! deletion's revision) and `DIR/summary.json`. SIGTERM: writes the
//! summary and exits, the holders left to expire.
//!
//! `churn` runs `--workers` sessions (a lease each, kept alive) that
//! together lock and unlock `--rate` names a second on a fixed schedule,
//! each name `<prefix>/<worker>/<j mod 50>`, until SIGTERM, then writes
//! what it did to `--out` (JSON).
//!
//! `report` reads the holders' `deletes.tsv` and the sidecars' stdout and
//! prints one JSON object: lines by verdict and by group, duplicates, and
//! for the killed group the delay from each deletion (as the holders'
//! watch saw it) to its line's `ts`, which carries milliseconds on the
//! same host clock.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use etcd_client::{Client, EventType, LockOptions, WatchOptions};
use futures_util::StreamExt as _;
use serde_json::json;
use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(about = "etcd lock load for scripts/bench.d/etcd.sh")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Hold locks, and at SIGUSR1 kill, release or revoke them.
    Hold(Hold),
    /// Lock and unlock other names at a steady rate until SIGTERM.
    Churn(Churn),
    /// Holders' deletions against the sidecars' lines, as JSON.
    Report(Report),
}

#[derive(clap::Args)]
struct Hold {
    #[arg(long)]
    endpoint: String,
    #[arg(long)]
    out: PathBuf,
    #[arg(long, default_value = "bench")]
    prefix: String,
    #[arg(long, default_value_t = 2)]
    ttl: i64,
    #[arg(long, default_value_t = 0)]
    kill: usize,
    #[arg(long, default_value_t = 0)]
    release: usize,
    #[arg(long, default_value_t = 0)]
    revoke: usize,
    #[arg(long, default_value_t = 0)]
    unlock_revoke: usize,
    /// Client connections the holders are spread over.
    #[arg(long, default_value_t = 4)]
    conns: usize,
    /// Holders being made at once.
    #[arg(long, default_value_t = 128)]
    parallel: usize,
    /// Seconds to wait for every deletion after SIGUSR1.
    #[arg(long, default_value_t = 180)]
    timeout: u64,
    /// Holders acting a second after SIGUSR1, one after another (0: all at
    /// once).
    #[arg(long, default_value_t = 0.0)]
    pace: f64,
}

#[derive(clap::Args)]
struct Churn {
    #[arg(long)]
    endpoint: String,
    #[arg(long)]
    out: PathBuf,
    #[arg(long, default_value = "churn")]
    prefix: String,
    /// Lock+unlock pairs a second.
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    #[arg(long, default_value_t = 16)]
    workers: usize,
    #[arg(long, default_value_t = 10)]
    ttl: i64,
}

#[derive(clap::Args)]
struct Report {
    #[arg(long)]
    deletes: PathBuf,
    /// When the holders were signalled (epoch ms), for the time to the last line.
    #[arg(long)]
    act_ms: Option<i64>,
    /// The sidecars' stdout files.
    lines: Vec<PathBuf>,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Cmd::Report(r) = &cli.cmd {
        return report(r);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = rt.block_on(async {
        match cli.cmd {
            Cmd::Hold(h) => hold(h).await,
            Cmd::Churn(c) => churn(c).await,
            Cmd::Report(_) => unreachable!(),
        }
    });
    // Keep-alive and watch tasks are not waited for.
    match result {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("etcd_load: {e:#}");
            std::process::exit(1)
        }
    }
}

/// The next of SIGUSR1 / SIGTERM / SIGINT.
struct SignalWait(signal_hook_tokio::Signals);

impl SignalWait {
    fn new() -> anyhow::Result<Self> {
        Ok(Self(signal_hook_tokio::Signals::new([
            SIGUSR1, SIGTERM, SIGINT,
        ])?))
    }
    async fn next(&mut self) -> i32 {
        self.0.next().await.unwrap_or(SIGTERM)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Group {
    Kill,
    Release,
    Revoke,
    UnlockRevoke,
}

impl Group {
    fn name(self) -> &'static str {
        match self {
            Group::Kill => "kill",
            Group::Release => "release",
            Group::Revoke => "revoke",
            Group::UnlockRevoke => "unlock-revoke",
        }
    }
}

struct Holder {
    group: Group,
    key: Vec<u8>,
    lease: i64,
    conn: usize,
    stop: CancellationToken,
}

#[derive(Default)]
struct Counters {
    /// Keep-alive streams that failed or saw the lease gone before SIGUSR1,
    /// by what went wrong.
    lost_before_act: BTreeMap<&'static str, u64>,
    /// Longest a renewal took to be answered (ms), and the longest time
    /// between two answered renewals of one lease (ms), before SIGUSR1.
    renew_max_ms: u64,
    gap_max_ms: u64,
    acted: bool,
}

/// Deletions the watch saw: key → (epoch ms, revision).
type Seen = Arc<Mutex<HashMap<Vec<u8>, (i64, i64)>>>;

async fn hold(h: Hold) -> anyhow::Result<()> {
    std::fs::create_dir_all(&h.out)?;
    let mut signals = SignalWait::new()?;
    let mut clients = Vec::new();
    for _ in 0..h.conns.max(1) {
        clients.push(
            Client::connect([h.endpoint.as_str()], None)
                .await
                .context("connecting to etcd")?,
        );
    }
    // The watch first: every deletion under the prefix, as it arrives.
    let seen: Seen = Arc::default();
    let deleted = Arc::new(tokio::sync::Notify::new());
    {
        let mut c = clients[0].clone();
        let prefix = format!("{}/", h.prefix);
        let mut stream = c
            .watch(prefix, Some(WatchOptions::new().with_prefix()))
            .await
            .context("opening the watch")?;
        let (seen, deleted) = (seen.clone(), deleted.clone());
        tokio::spawn(async move {
            while let Ok(Some(resp)) = stream.message().await {
                let at = now_ms();
                let mut s = seen.lock().unwrap();
                for ev in resp.events() {
                    if ev.event_type() == EventType::Delete
                        && let Some(kv) = ev.kv()
                    {
                        s.entry(kv.key().to_vec())
                            .or_insert((at, kv.mod_revision()));
                    }
                }
                drop(s);
                deleted.notify_one();
            }
            eprintln!("etcd_load: the watch ended");
        });
    }

    // Interleaved: kill 0, release 0, revoke 0, unlock-revoke 0, kill 1, ...
    let mut plan = Vec::new();
    let most = h.kill.max(h.release).max(h.revoke).max(h.unlock_revoke);
    for i in 0..most {
        for (g, n) in [
            (Group::Kill, h.kill),
            (Group::Release, h.release),
            (Group::Revoke, h.revoke),
            (Group::UnlockRevoke, h.unlock_revoke),
        ] {
            if i < n {
                plan.push((g, i));
            }
        }
    }
    let total = plan.len();
    let counters = Arc::new(Mutex::new(Counters::default()));
    let period = Duration::from_millis((h.ttl * 1000 / 3).max(100) as u64);
    let t0 = Instant::now();
    let made: Vec<anyhow::Result<Holder>> =
        futures_util::stream::iter(plan.into_iter().enumerate())
            .map(|(n, (group, i))| {
                let conn = n % clients.len();
                let mut c = clients[conn].clone();
                let name = format!("{}/{}/{i}", h.prefix, group.name());
                let (ttl, counters) = (h.ttl, counters.clone());
                async move {
                    let lease = c.lease_grant(ttl, None).await?.id();
                    let locked = c
                        .lock(name, Some(LockOptions::new().with_lease(lease)))
                        .await?;
                    let (mut keeper, mut answers) = c.lease_keep_alive(lease).await?;
                    let stop = CancellationToken::new();
                    let task_stop = stop.clone();
                    tokio::spawn(async move {
                        // Renewals spread evenly over the period whatever
                        // the order the holders came up in (golden-ratio
                        // phases): etcd sees a steady rate, not waves.
                        let phase = (n as f64 * 0.618_034).fract().max(0.01);
                        let mut tick = tokio::time::interval_at(
                            tokio::time::Instant::now() + period.mul_f64(phase),
                            period,
                        );
                        let mut last = Instant::now();
                        loop {
                            tokio::select! {
                                () = task_stop.cancelled() => return,
                                _ = tick.tick() => {}
                            }
                            let sent = Instant::now();
                            let lost = if keeper.keep_alive().await.is_err() {
                                Some("send")
                            } else {
                                match answers.message().await {
                                    Ok(Some(a)) if a.ttl() > 0 => None,
                                    Ok(Some(_)) => Some("lease gone"),
                                    Ok(None) => Some("stream ended"),
                                    Err(_) => Some("stream failed"),
                                }
                            };
                            let mut k = counters.lock().unwrap();
                            if k.acted {
                                if lost.is_some() {
                                    return;
                                }
                                continue;
                            }
                            if let Some(why) = lost {
                                *k.lost_before_act.entry(why).or_default() += 1;
                                return;
                            }
                            k.renew_max_ms = k.renew_max_ms.max(sent.elapsed().as_millis() as u64);
                            k.gap_max_ms = k.gap_max_ms.max(last.elapsed().as_millis() as u64);
                            last = Instant::now();
                        }
                        // The keeper and its stream are dropped here: etcd
                        // hears no more of this lease.
                    });
                    Ok(Holder {
                        group,
                        key: locked.key().to_vec(),
                        lease,
                        conn,
                        stop,
                    })
                }
            })
            .buffer_unordered(h.parallel.max(1))
            .collect()
            .await;
    let setup_secs = t0.elapsed().as_secs_f64();
    let mut holders = Vec::with_capacity(total);
    for m in made {
        holders.push(m.context("making a holder")?);
    }
    // Back in plan order, so the actions interleave.
    holders.sort_by_key(|x| {
        let rest = String::from_utf8_lossy(&x.key).into_owned();
        let i: usize = rest
            .rsplit('/')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        (i, x.group as u8)
    });
    std::fs::write(h.out.join("ready"), format!("{total} {setup_secs:.3}\n"))?;
    eprintln!("etcd_load: {total} holders in {setup_secs:.1} s");

    let sig = signals.next().await;
    let act_ms = now_ms();
    counters.lock().unwrap().acted = true;
    let mut summary = {
        let k = counters.lock().unwrap();
        json!({
            "holders": total,
            "ttl": h.ttl,
            "setup_secs": setup_secs,
            "lost_before_act": k.lost_before_act.values().sum::<u64>(),
            "lost_why": k.lost_before_act,
            "renew_max_ms": k.renew_max_ms,
            "renewal_gap_max_ms": k.gap_max_ms,
        })
    };
    if sig != SIGUSR1 {
        std::fs::write(h.out.join("summary.json"), summary.to_string())?;
        return Ok(());
    }
    let action_errors = Arc::new(Mutex::new(0u64));
    let acting = tokio::time::Instant::now();
    for (i, x) in holders.iter().enumerate() {
        if h.pace > 0.0 {
            tokio::time::sleep_until(acting + Duration::from_secs_f64(i as f64 / h.pace)).await;
        }
        let mut c = clients[x.conn].clone();
        let (key, lease, errors) = (x.key.clone(), x.lease, action_errors.clone());
        match x.group {
            Group::Kill => x.stop.cancel(),
            Group::Release => {
                tokio::spawn(async move {
                    if c.unlock(key).await.is_err() {
                        *errors.lock().unwrap() += 1;
                    }
                });
            }
            Group::Revoke => {
                x.stop.cancel();
                tokio::spawn(async move {
                    if c.lease_revoke(lease).await.is_err() {
                        *errors.lock().unwrap() += 1;
                    }
                });
            }
            Group::UnlockRevoke => {
                let stop = x.stop.clone();
                tokio::spawn(async move {
                    let unlocked = c.unlock(key).await.is_ok();
                    stop.cancel();
                    if !unlocked || c.lease_revoke(lease).await.is_err() {
                        *errors.lock().unwrap() += 1;
                    }
                });
            }
        }
    }
    // Every holder's key goes: wait for the watch to have seen them all.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(h.timeout);
    loop {
        if seen.lock().unwrap().len() >= total {
            break;
        }
        tokio::select! {
            () = deleted.notified() => {}
            () = tokio::time::sleep_until(deadline) => break,
            s = signals.next() => if s != SIGUSR1 { break },
        }
    }
    let seen = seen.lock().unwrap().clone();
    let mut tsv = String::new();
    let mut unseen = 0;
    for x in &holders {
        match seen.get(&x.key) {
            Some((at, rev)) => tsv.push_str(&format!(
                "{}\t{}\t{:x}\t{at}\t{rev}\n",
                String::from_utf8_lossy(&x.key),
                x.group.name(),
                x.lease
            )),
            None => unseen += 1,
        }
    }
    std::fs::write(h.out.join("deletes.tsv"), tsv)?;
    summary["act_ms"] = json!(act_ms);
    summary["unseen"] = json!(unseen);
    summary["action_errors"] = json!(*action_errors.lock().unwrap());
    std::fs::write(h.out.join("summary.json"), summary.to_string())?;
    eprintln!("etcd_load: {} deletions seen, {unseen} not", seen.len());
    Ok(())
}

async fn churn(c: Churn) -> anyhow::Result<()> {
    let mut signals = SignalWait::new()?;
    let client = Client::connect([c.endpoint.as_str()], None)
        .await
        .context("connecting to etcd")?;
    let stop = CancellationToken::new();
    let stats: Arc<Mutex<ChurnStats>> = Arc::default();
    let workers = c.workers.max(1);
    let start = tokio::time::Instant::now() + Duration::from_millis(200);
    let started = Instant::now() + Duration::from_millis(200);
    let mut tasks = Vec::new();
    for w in 0..workers {
        let mut cl = client.clone();
        let (stop, stats, prefix, rate, ttl) =
            (stop.clone(), stats.clone(), c.prefix.clone(), c.rate, c.ttl);
        tasks.push(tokio::spawn(async move {
            let lease = cl.lease_grant(ttl, None).await?.id();
            let (mut keeper, mut answers) = cl.lease_keep_alive(lease).await?;
            let ka_stop = stop.clone();
            tokio::spawn(async move {
                let period = Duration::from_millis((ttl * 1000 / 3) as u64);
                loop {
                    tokio::select! {
                        () = ka_stop.cancelled() => return,
                        () = tokio::time::sleep(period) => {}
                    }
                    if keeper.keep_alive().await.is_err() || answers.message().await.is_err() {
                        return;
                    }
                }
            });
            for j in 0u64.. {
                let due =
                    start + Duration::from_secs_f64((j as f64 * workers as f64 + w as f64) / rate);
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep_until(due) => {}
                }
                let late = tokio::time::Instant::now().saturating_duration_since(due);
                let name = format!("{prefix}/{w}/{}", j % 50);
                let t = Instant::now();
                let r = cl
                    .lock(name, Some(LockOptions::new().with_lease(lease)))
                    .await;
                let lock_ms = t.elapsed().as_secs_f64() * 1000.0;
                let Ok(r) = r else {
                    stats.lock().unwrap().errors += 1;
                    continue;
                };
                let t = Instant::now();
                let u = cl.unlock(r.key().to_vec()).await;
                let unlock_ms = t.elapsed().as_secs_f64() * 1000.0;
                let mut s = stats.lock().unwrap();
                if u.is_err() {
                    s.errors += 1;
                }
                s.ops += 1;
                s.lock_ms.push(lock_ms);
                s.unlock_ms.push(unlock_ms);
                s.late_max_ms = s.late_max_ms.max(late.as_secs_f64() * 1000.0);
            }
            anyhow::Ok(())
        }));
    }
    loop {
        if signals.next().await != SIGUSR1 {
            break;
        }
    }
    stop.cancel();
    let secs = started.elapsed().as_secs_f64();
    let mut s = stats.lock().unwrap();
    let (ops, errors, late) = (s.ops, s.errors, s.late_max_ms);
    let lock = pcts(&mut s.lock_ms);
    let unlock = pcts(&mut s.unlock_ms);
    let out = json!({
        "ops": ops,
        "secs": secs,
        "rate": ops as f64 / secs,
        "errors": errors,
        "late_max_ms": late,
        "lock_ms": lock,
        "unlock_ms": unlock,
    });
    std::fs::write(&c.out, out.to_string())?;
    drop(tasks);
    Ok(())
}

#[derive(Default)]
struct ChurnStats {
    ops: u64,
    errors: u64,
    late_max_ms: f64,
    lock_ms: Vec<f64>,
    unlock_ms: Vec<f64>,
}

/// p50, p99 and max, by the rank `round(p * (n - 1))` (as
/// `scripts/bench.d/overdue_stats.py`).
fn pcts<T: Copy + PartialOrd + serde::Serialize>(v: &mut [T]) -> serde_json::Value {
    if v.is_empty() {
        return json!(null);
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let at = |p: f64| v[((p * (v.len() - 1) as f64).round() as usize).min(v.len() - 1)];
    json!({"n": v.len(), "min": at(0.0), "p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": at(1.0)})
}

/// `2026-11-29T20:45:58.123Z` → epoch ms.
fn ts_ms(ts: &str) -> Option<i64> {
    let b = ts.as_bytes();
    if b.len() < 23 || b[4] != b'-' || b[10] != b'T' || b[19] != b'.' {
        return None;
    }
    let n = |r: std::ops::Range<usize>| ts.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (n(0..4)?, n(5..7)?, n(8..10)?);
    let (hh, mm, ss, ms) = (n(11..13)?, n(14..16)?, n(17..19)?, n(20..23)?);
    // Days from the civil date (H. Hinnant's days_from_civil).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 24 + hh) * 60 + mm) * 60_000 + ss * 1000 + ms)
}

struct Line {
    ts: i64,
    key: String,
    reaped_by: String,
    overdue: i64,
    sidecar: usize,
}

fn report(r: &Report) -> anyhow::Result<()> {
    // key → (group, seen ms, revision)
    let mut deletes: HashMap<String, (String, i64, i64)> = HashMap::new();
    for row in std::fs::read_to_string(&r.deletes)
        .with_context(|| format!("reading {}", r.deletes.display()))?
        .lines()
    {
        let f: Vec<&str> = row.split('\t').collect();
        if f.len() != 5 {
            bail!("bad row in {}: {row}", r.deletes.display());
        }
        deletes.insert(
            f[0].to_owned(),
            (f[1].to_owned(), f[3].parse()?, f[4].parse()?),
        );
    }
    let mut lines = Vec::new();
    let mut other_warn = 0;
    for (i, path) in r.lines.iter().enumerate() {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        for l in text.lines() {
            if !l.contains(" message=lease_expired ") {
                if l.contains("level=warn") || l.contains("level=error") {
                    other_warn += 1;
                }
                continue;
            }
            let mut f: HashMap<&str, &str> = HashMap::new();
            for pair in l.split(' ') {
                if let Some((k, v)) = pair.split_once('=') {
                    f.insert(k, v);
                }
            }
            lines.push(Line {
                ts: f.get("ts").and_then(|t| ts_ms(t)).unwrap_or(0),
                key: f.get("lockKey").copied().unwrap_or("").to_owned(),
                reaped_by: f.get("reapedBy").copied().unwrap_or("").to_owned(),
                overdue: f
                    .get("overdueMillis")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(-1),
                sidecar: i,
            });
        }
    }
    let mut per_key: HashMap<&str, u32> = HashMap::new();
    for l in &lines {
        *per_key.entry(l.key.as_str()).or_default() += 1;
    }
    let duplicates: u32 = per_key.values().map(|n| n - 1).sum();
    let strays = per_key
        .keys()
        .filter(|k| !deletes.contains_key(**k))
        .count();
    // group → verdict → count (first line of each key)
    let mut by_group: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    let mut first: HashMap<&str, &Line> = HashMap::new();
    for l in &lines {
        first.entry(l.key.as_str()).or_insert(l);
    }
    for (key, (group, _, _)) in &deletes {
        let verdict = first
            .get(key.as_str())
            .map_or("none", |l| l.reaped_by.as_str());
        *by_group
            .entry(group.clone())
            .or_default()
            .entry(verdict.to_owned())
            .or_default() += 1;
    }
    let mut per_sidecar = vec![0u64; r.lines.len()];
    for l in &lines {
        per_sidecar[l.sidecar] += 1;
    }
    // The killed holders: delay, deletion spread, last line.
    let mut delays = Vec::new();
    let mut overdue = Vec::new();
    let mut kill_seen: Vec<i64> = Vec::new();
    for (key, (group, seen, _)) in &deletes {
        if group != "kill" {
            continue;
        }
        kill_seen.push(*seen);
        if let Some(l) = first.get(key.as_str()) {
            delays.push(l.ts - seen);
            overdue.push(l.overdue);
        }
    }
    kill_seen.sort_unstable();
    let kill_lines: Vec<i64> = lines
        .iter()
        .filter(|l| deletes.get(&l.key).is_some_and(|d| d.0 == "kill"))
        .map(|l| l.ts)
        .collect();
    let last_line = kill_lines.iter().copied().max();
    let spread = match (kill_seen.first(), kill_seen.last()) {
        (Some(a), Some(b)) => json!({
            "first_ms": a, "last_ms": b, "secs": (b - a) as f64 / 1000.0,
            "per_sec": if b > a { (kill_seen.len() - 1) as f64 * 1000.0 / (b - a) as f64 } else { 0.0 },
        }),
        _ => json!(null),
    };
    let out = json!({
        "deletions": deletes.len(),
        "lines": lines.len(),
        "keys_with_lines": per_key.len(),
        "duplicates": duplicates,
        "strays": strays,
        "other_warn_or_error_lines": other_warn,
        "per_sidecar": per_sidecar,
        "by_group": by_group,
        "kill": {
            "n": kill_seen.len(),
            "with_line": delays.len(),
            "delay_ms": pcts(&mut delays),
            "overdue_ms": pcts(&mut overdue),
            "deletions": spread,
            "last_line_after_first_deletion_s": match (last_line, kill_seen.first()) {
                (Some(l), Some(f)) => json!((l - f) as f64 / 1000.0), _ => json!(null) },
            "last_line_after_last_deletion_s": match (last_line, kill_seen.last()) {
                (Some(l), Some(f)) => json!((l - f) as f64 / 1000.0), _ => json!(null) },
            "last_line_after_act_s": match (last_line, r.act_ms) {
                (Some(l), Some(a)) => json!((l - a) as f64 / 1000.0), _ => json!(null) },
        },
    });
    println!("{out}");
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_line_timestamp_is_epoch_milliseconds() {
        assert_eq!(super::ts_ms("1970-01-01T00:00:00.000Z"), Some(0));
        assert_eq!(
            super::ts_ms("2026-11-29T20:45:58.123Z"),
            Some(1_795_985_158_123)
        );
    }
}
