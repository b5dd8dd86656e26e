//! The real binary: a daemon whose output is collected line by line, its
//! environment, one-shot runs, logfmt decoding of what it wrote, and a
//! stand-in for systemd's notify socket.

use std::collections::HashMap;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt as _, BufReader};

use super::statsd::wait_more;
use super::{TempDir, wait_until};

/// Decodes a logfmt line into a map (asserting it decodes at all).
pub fn fields(line: &str) -> HashMap<String, String> {
    lease_sweeper::testing::logfmt::decode_line(line)
        .unwrap_or_else(|| panic!("not a logfmt line: {line:?}"))
        .into_iter()
        .collect()
}

/// Lines whose `message` is `name`.
pub fn events(lines: &[String], name: &str) -> Vec<HashMap<String, String>> {
    lines
        .iter()
        .map(|l| fields(l))
        .filter(|f| f.get("message").map(String::as_str) == Some(name))
        .collect()
}

/// The real binary, built by cargo for this test run.
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_lease-sweeper"))
}

/// The real daemon running `run`, its stdout collected line by line.
pub struct Daemon {
    pub child: tokio::process::Child,
    lines: Arc<Mutex<Vec<String>>>,
    /// The stdout and stderr readers; each ends at its pipe's end of file.
    readers: Vec<tokio::task::JoinHandle<()>>,
    /// Stdout while no one reads it (`spawn_with_blocked_stdout`).
    held_stdout: Option<tokio::process::ChildStdout>,
}

impl Daemon {
    /// Starts `lease-sweeper run` with exactly these environment variables
    /// (plus PATH), so nothing from the developer's shell leaks in.
    pub fn spawn(env: &[(&str, &str)]) -> Self {
        Self::spawn_args(&["run"], env)
    }

    pub fn spawn_args(args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn_program(&binary(), args, env)
    }

    /// Like `spawn`, but nothing reads its stdout until `unblock_stdout`: once
    /// the pipe's buffer (64 KiB) is full, every write blocks, as behind a
    /// stalled journald or log collector. Its stderr is read as usual.
    pub fn spawn_with_blocked_stdout(env: &[(&str, &str)]) -> Self {
        Self::start(&binary(), &["run"], env, false)
    }

    /// Like `spawn_args` with another program in front (e.g. `runuser`).
    pub fn spawn_program(program: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::start(program, args, env, true)
    }

    fn start(
        program: &std::path::Path,
        args: &[&str],
        env: &[(&str, &str)],
        read_stdout: bool,
    ) -> Self {
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawning lease-sweeper");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stdout = child.stdout.take().unwrap();
        let mut daemon = Self {
            child,
            lines,
            readers: Vec::new(),
            held_stdout: None,
        };
        let stderr = daemon.child.stderr.take().unwrap();
        daemon.read(Box::new(stderr));
        if read_stdout {
            daemon.read(Box::new(stdout));
        } else {
            daemon.held_stdout = Some(stdout);
        }
        daemon
    }

    fn read(&mut self, stream: Box<dyn tokio::io::AsyncRead + Unpin + Send>) {
        let sink = self.lines.clone();
        self.readers.push(tokio::spawn(async move {
            let mut reader = BufReader::new(stream).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                sink.lock().unwrap().push(line);
            }
        }));
    }

    /// Starts reading the stdout `spawn_with_blocked_stdout` held back.
    pub fn unblock_stdout(&mut self) {
        let stdout = self.held_stdout.take().expect("stdout was held back");
        self.read(Box::new(stdout));
    }

    pub fn pid(&self) -> i32 {
        self.child.id().expect("daemon still running") as i32
    }

    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// Lines so far for which `pred` holds, counted in place: polling a
    /// drain of 100,000s of lines must not copy them all every 20 ms (that
    /// took CPU from the daemon under test on a 2-core machine).
    pub fn count_lines(&self, pred: impl Fn(&str) -> bool) -> usize {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| pred(l))
            .count()
    }

    pub fn signal(&self, signal: i32) {
        let signal = Signal::try_from(signal).expect("a signal number");
        let _ = kill(Pid::from_raw(self.pid()), signal);
    }

    pub async fn wait_for_event(&self, name: &str, timeout: Duration) {
        wait_until(timeout, &format!("daemon event {name}"), || async {
            !events(&self.lines(), name).is_empty()
        })
        .await;
    }

    /// Waits until the daemon has written at least `n` lines of event `name`.
    pub async fn wait_for_events(&self, name: &str, n: usize, timeout: Duration) {
        wait_until(timeout, &format!("{n} {name} lines"), || async {
            events(&self.lines(), name).len() >= n
        })
        .await;
    }

    /// Stops it as systemd or Docker would (SIGTERM), waits up to 10 s for
    /// its exit and returns the exit code and every line it wrote.
    pub async fn stop(&mut self) -> (Option<i32>, Vec<String>) {
        self.signal(libc::SIGTERM);
        let (code, _) = self.wait_exit(Duration::from_secs(10)).await;
        (code, self.lines())
    }

    /// Waits for exit; returns the code and how long it took.
    pub async fn wait_exit(&mut self, timeout: Duration) -> (Option<i32>, Duration) {
        let start = Instant::now();
        let status = tokio::time::timeout(timeout, self.child.wait())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "daemon did not exit within {timeout:?}; output:\n{}",
                    self.lines().join("\n")
                )
            })
            .expect("waiting for the daemon");
        let took = start.elapsed();
        // Its pipes are closed now: the readers end once they hold every line.
        for reader in std::mem::take(&mut self.readers) {
            tokio::time::timeout(Duration::from_secs(10), reader)
                .await
                .expect("the daemon's output ends after its exit")
                .expect("reading the daemon's output");
        }
        (status.code(), took)
    }
}

/// The environment of a daemon sweeping `url` and sending StatsD to the
/// capture on `statsd_port`.
pub fn daemon_env<'a>(url: &'a str, statsd_port: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("LOCKDB_URL", url),
        ("STATSD_HOST", "127.0.0.1"),
        ("STATSD_PORT", statsd_port),
    ]
}

/// A stand-in for systemd's notify socket: every datagram, with its arrival.
pub struct NotifySocket {
    _dir: TempDir,
    pub path: PathBuf,
    messages: Arc<Mutex<Vec<(Instant, String)>>>,
    stop: Arc<AtomicBool>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl NotifySocket {
    pub fn bind() -> Self {
        let dir = TempDir::new("notify");
        let path = dir.0.join("notify.sock");
        let socket = UnixDatagram::bind(&path).expect("binding the notify socket");
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let messages = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (sink, done) = (messages.clone(), stop.clone());
        let reader = std::thread::spawn(move || {
            let mut buf = vec![0u8; 4096];
            loop {
                match socket.recv(&mut buf) {
                    Ok(n) => {
                        let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                        sink.lock().unwrap().push((Instant::now(), text));
                    }
                    // Asked to stop and the socket is empty: all is read.
                    Err(_) if done.load(Ordering::SeqCst) => break,
                    Err(_) => {}
                }
            }
        });
        Self {
            _dir: dir,
            path,
            messages,
            stop,
            reader: Some(reader),
        }
    }

    /// `daemon_env` plus `NOTIFY_SOCKET` pointing here: the environment
    /// systemd gives a `Type=notify` unit.
    pub fn daemon_env<'a>(&'a self, url: &'a str, statsd_port: &'a str) -> Vec<(&'a str, &'a str)> {
        let mut env = daemon_env(url, statsd_port);
        env.push(("NOTIFY_SOCKET", self.path.to_str().unwrap()));
        env
    }

    /// Reads every datagram already sent (for example by a daemon that has
    /// exited) and stops listening: after this, `messages` is final.
    pub async fn finish(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(reader) = self.reader.take() {
            tokio::task::spawn_blocking(move || reader.join())
                .await
                .expect("joining the notify reader")
                .expect("the notify reader does not panic");
        }
    }

    /// The datagrams received so far, with the time each arrived.
    pub fn messages(&self) -> Vec<(Instant, String)> {
        self.messages.lock().unwrap().clone()
    }

    /// The arrival times of datagrams carrying the assignment `state`.
    pub fn arrivals(&self, state: &str) -> Vec<Instant> {
        self.messages()
            .into_iter()
            .filter(|(_, m)| m.lines().any(|l| l == state))
            .map(|(t, _)| t)
            .collect()
    }

    /// `WATCHDOG=1` pings so far. The daemon pings each time every service
    /// loop has finished a pass, failed or not (`progress`), so this counts
    /// passes where nothing else does: a failing pass sends no gauge.
    pub fn watchdogs(&self) -> usize {
        self.arrivals("WATCHDOG=1").len()
    }

    /// Waits until `n` more `WATCHDOG=1` pings arrived: every service loop
    /// has finished at least `n` more passes, whether they failed or not.
    pub async fn wait_watchdogs(&self, n: usize) {
        wait_more(n, "WATCHDOG=1 (passes of every loop)", || self.watchdogs()).await;
    }
}

impl Drop for NotifySocket {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Runs the real binary with `args` against `url`; returns its exit code and
/// all its output (stdout and stderr).
pub async fn run_binary(args: &[&str], url: &str) -> (Option<i32>, String) {
    let mut d = Daemon::spawn_args(args, &[("LOCKDB_URL", url)]);
    let (code, _) = d.wait_exit(Duration::from_secs(60)).await;
    (code, d.lines().join("\n"))
}
