//! A throwaway local PostgreSQL cluster, for `demo` and the test suite.
//!
//! Owns finding PostgreSQL's server binaries, `initdb` into a fresh temporary
//! directory, running the postmaster (as the unprivileged `postgres` user when
//! we are root, since PostgreSQL refuses to run as root), stopping and
//! restarting it, and removing everything afterwards. The postmaster listens
//! on a Unix socket inside that directory only, so clusters never collide on a
//! port, and it dies with the thread that started it even if we are killed.
//! It is never used by `run`, which talks to the operator's database.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::prctl::set_pdeathsig;
use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, User, geteuid};

/// How long the postmaster may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a stop may take before we give up waiting.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// The port only names the socket file (`.s.PGSQL.5432`); no TCP is opened
/// unless a test asks for it (`start_tcp`).
const SOCKET_PORT: u16 = 5432;
/// The superuser `initdb` creates; trust authentication on the socket.
pub const SUPERUSER: &str = "postgres";

/// Settings for a disposable cluster: durability off, as it is thrown away.
const SETTINGS: &[(&str, &str)] = &[
    ("listen_addresses", ""),
    ("fsync", "off"),
    ("synchronous_commit", "off"),
    ("full_page_writes", "off"),
    ("max_connections", "200"),
    // Lets tests leave a prepared transaction behind (a standby needs at
    // least its primary's value, and gets the same defaults).
    ("max_prepared_transactions", "10"),
    ("unix_socket_permissions", "0777"),
];

#[derive(Debug, thiserror::Error)]
pub enum ThrowawayError {
    #[error(
        "PostgreSQL server binaries (initdb, postgres) not found; install PostgreSQL's server package \
         (Debian: postgresql-15) or set PG_BINDIR to the directory holding them"
    )]
    NoBinaries,
    #[error(
        "running as root, but neither a `postgres` nor a `nobody` user exists to run PostgreSQL as; create one or set DATABASE_URL"
    )]
    NoUnprivilegedUser,
    #[error("{what} failed: {cause}")]
    Io { what: String, cause: io::Error },
    #[error("{what} failed ({status}); its output:\n{output}")]
    Command {
        what: String,
        status: String,
        output: String,
    },
    #[error("PostgreSQL did not become ready within {secs} s; its log:\n{log}")]
    NotReady { secs: u64, log: String },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> ThrowawayError {
    let what = what.into();
    move |cause| ThrowawayError::Io { what, cause }
}

/// How to stop the postmaster.
#[derive(Debug, Clone, Copy)]
pub enum StopMode {
    /// SIGINT: roll back open transactions, disconnect clients, shut down.
    Fast,
    /// SIGQUIT: stop at once, as after a crash (`pg_ctl -m immediate`).
    Immediate,
}

/// A running (or stopped) throwaway cluster; dropping it removes everything.
pub struct ThrowawayPg {
    root: PathBuf,
    bin: PathBuf,
    run_as: Option<(u32, u32)>,
    settings: Vec<(String, String)>,
    postmaster: Option<Postmaster>,
    /// The socket's name (`.s.PGSQL.<port>`) and, with TCP on, the port.
    port: u16,
}

struct Postmaster {
    pid: i32,
    exited: mpsc::Receiver<()>,
}

impl ThrowawayPg {
    /// Creates and starts a cluster with the default settings.
    pub fn start() -> Result<Self, ThrowawayError> {
        Self::start_with(&[])
    }

    /// Creates and starts a cluster; `extra` settings go on the postmaster's
    /// command line (`-c name=value`), after the defaults.
    pub fn start_with(extra: &[(&str, &str)]) -> Result<Self, ThrowawayError> {
        let mut pg = Self::prepare(SOCKET_PORT, extra)?;
        pg.initdb()?;
        pg.start_again()?;
        Ok(pg)
    }

    /// Like `start_with`, but also listening on loopback TCP at `port` (for
    /// tests of TCP-only things: TLS, a pooler, a streaming standby).
    pub fn start_tcp(port: u16, extra: &[(&str, &str)]) -> Result<Self, ThrowawayError> {
        let mut all = vec![("listen_addresses", "127.0.0.1")];
        all.extend_from_slice(extra);
        let mut pg = Self::prepare(port, &all)?;
        pg.initdb()?;
        pg.start_again()?;
        Ok(pg)
    }

    /// A streaming hot standby of `primary` (which must listen on TCP),
    /// cloned with `pg_basebackup -R`, listening on loopback TCP at `port`.
    pub fn standby_of(primary: &ThrowawayPg, port: u16) -> Result<Self, ThrowawayError> {
        let mut extra: Vec<(&str, &str)> = vec![("listen_addresses", "127.0.0.1")];
        extra.extend(
            primary
                .settings
                .iter()
                .filter(|(k, _)| !SETTINGS.iter().any(|(d, _)| d == k) && k != "listen_addresses")
                .map(|(k, v)| (k.as_str(), v.as_str())),
        );
        let mut pg = Self::prepare(port, &extra)?;
        let output = pg
            .command("pg_basebackup")
            .arg("-D")
            .arg(pg.data_dir())
            .args(["-R", "-X", "stream", "-c", "fast", "-h", "127.0.0.1"])
            .args(["-p", &primary.port.to_string(), "-U", SUPERUSER])
            .stdin(Stdio::null())
            .output()
            .map_err(io_err("running pg_basebackup"))?;
        if !output.status.success() {
            return Err(ThrowawayError::Command {
                what: "pg_basebackup".into(),
                status: output.status.to_string(),
                output: format!(
                    "{}{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                ),
            });
        }
        pg.start_again()?;
        Ok(pg)
    }

    /// A fresh directory owned by the user PostgreSQL will run as.
    fn prepare(port: u16, extra: &[(&str, &str)]) -> Result<Self, ThrowawayError> {
        let bin = find_bindir().ok_or(ThrowawayError::NoBinaries)?;
        let run_as = unprivileged_user()?;
        let root = std::env::temp_dir().join(format!(
            "lease-sweeper-pg-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        fs::create_dir_all(&root).map_err(io_err(format!("creating {}", root.display())))?;
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).map_err(io_err("chmod"))?;
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(&root, Some(uid), Some(gid))
                .map_err(io_err(format!("handing {} to uid {uid}", root.display())))?;
        }
        let settings = SETTINGS
            .iter()
            .chain(extra.iter())
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Ok(Self {
            root,
            bin,
            run_as,
            settings,
            postmaster: None,
            port,
        })
    }

    /// The port of the socket (and of TCP, with `start_tcp`).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The uid/gid PostgreSQL runs as when we are root (files it must read,
    /// such as TLS keys, are handed to it).
    pub fn run_as(&self) -> Option<(u32, u32)> {
        self.run_as
    }

    /// The directory holding the socket (use as `host` / `PGHOST`).
    pub fn socket_dir(&self) -> &Path {
        &self.root
    }

    pub fn data_dir(&self) -> PathBuf {
        self.root.join("data")
    }

    /// A connection URL for `database` as the superuser, over the socket.
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://{SUPERUSER}@localhost:{}/{database}?host={}",
            self.port,
            self.root.display()
        )
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(program));
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid).gid(gid);
        }
        cmd.current_dir(&self.root)
            .env("LC_ALL", "C.UTF-8")
            .env_remove("PGDATA");
        cmd
    }

    fn initdb(&self) -> Result<(), ThrowawayError> {
        let output = self
            .command("initdb")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-U", SUPERUSER, "-A", "trust", "-E", "UTF8", "--no-sync"])
            .stdin(Stdio::null())
            .output()
            .map_err(io_err("running initdb"))?;
        if !output.status.success() {
            return Err(ThrowawayError::Command {
                what: "initdb".into(),
                status: output.status.to_string(),
                output: format!(
                    "{}{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                ),
            });
        }
        Ok(())
    }

    /// Starts the postmaster on the existing data directory (again, after a
    /// stop) and waits until it accepts connections.
    pub fn start_again(&mut self) -> Result<(), ThrowawayError> {
        if self.postmaster.is_some() {
            return Ok(());
        }
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(io_err("opening the PostgreSQL log"))?;
        let mut cmd = self.command("postgres");
        cmd.arg("-D")
            .arg(self.data_dir())
            .arg("-k")
            .arg(&self.root)
            .arg("-p")
            .arg(self.port.to_string());
        for (k, v) in &self.settings {
            cmd.arg("-c").arg(format!("{k}={v}"));
        }
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().map_err(io_err("log"))?)
            .stderr(log);
        // No safe API runs code between fork and exec: std's pre_exec is
        // unsafe, and the parent-death signal can only be set in the child.
        // SAFETY: the closure makes one prctl(2) call, which is
        // async-signal-safe, allocates nothing and takes no lock; it runs in
        // the forked child after the uid change (which would otherwise clear
        // the setting).
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(|| set_pdeathsig(Signal::SIGQUIT).map_err(io::Error::from));
        }
        // The postmaster is tied to the thread that forks it (PDEATHSIG), so a
        // dedicated thread forks it and waits for it: it outlives test threads
        // and dies only with the process or the postmaster.
        let (pid_tx, pid_rx) = mpsc::channel();
        let (exit_tx, exit_rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("throwaway-pg".into())
            .spawn(move || match cmd.spawn() {
                Ok(mut child) => {
                    let _ = pid_tx.send(Ok(child.id() as i32));
                    let _ = child.wait();
                    let _ = exit_tx.send(());
                }
                Err(e) => {
                    let _ = pid_tx.send(Err(e));
                }
            })
            .map_err(io_err("spawning the keeper thread"))?;
        let pid = pid_rx
            .recv()
            .map_err(|_| ThrowawayError::Io {
                what: "starting postgres".into(),
                cause: io::Error::other("keeper thread died"),
            })?
            .map_err(io_err("starting postgres"))?;
        self.postmaster = Some(Postmaster {
            pid,
            exited: exit_rx,
        });
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> Result<(), ThrowawayError> {
        let deadline = Instant::now() + START_TIMEOUT;
        let pid_file = self.data_dir().join("postmaster.pid");
        loop {
            if let Ok(text) = fs::read_to_string(&pid_file) {
                // Line 8 of postmaster.pid is the server's status (PG ≥ 10);
                // a hot standby accepting connections says `standby`.
                if matches!(
                    text.lines().nth(7).map(str::trim),
                    Some("ready" | "standby")
                ) {
                    return Ok(());
                }
            }
            let exited = self
                .postmaster
                .as_ref()
                .is_none_or(|p| p.exited.try_recv().is_ok());
            if exited || Instant::now() > deadline {
                self.postmaster = None;
                return Err(ThrowawayError::NotReady {
                    secs: START_TIMEOUT.as_secs(),
                    log: self.log_tail(),
                });
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Stops the postmaster and waits for it to exit.
    pub fn stop(&mut self, mode: StopMode) {
        if let Some(pm) = self.postmaster.take() {
            let signal = match mode {
                StopMode::Fast => Signal::SIGINT,
                StopMode::Immediate => Signal::SIGQUIT,
            };
            // Fails only if it has exited already, which the wait then sees.
            let _ = kill(Pid::from_raw(pm.pid), signal);
            let _ = pm.exited.recv_timeout(STOP_TIMEOUT);
        }
    }

    fn log_path(&self) -> PathBuf {
        self.root.join("postgres.log")
    }

    /// Everything PostgreSQL logged so far.
    pub fn log_text(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The last lines PostgreSQL logged, for error messages.
    pub fn log_tail(&self) -> String {
        let text = fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl ThrowawayPg {
    /// Stops the postmaster at once and removes the directory. Also what
    /// `Drop` does; callable through a shared handle (a test suite's static
    /// cluster at process exit).
    pub fn destroy(&mut self) {
        self.stop(StopMode::Immediate);
        let _ = fs::remove_dir_all(&self.root);
    }
}

impl Drop for ThrowawayPg {
    fn drop(&mut self) {
        self.destroy();
    }
}

/// `PG_BINDIR`, else the newest `/usr/lib/postgresql/<major>/bin` (Debian,
/// Ubuntu), else the directory `pg_config --bindir` names, else `PATH`.
fn find_bindir() -> Option<PathBuf> {
    let has_initdb = |dir: &Path| dir.join("initdb").is_file() && dir.join("postgres").is_file();
    if let Some(dir) = std::env::var_os("PG_BINDIR").map(PathBuf::from) {
        return has_initdb(&dir).then_some(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let major = e.file_name().to_str()?.parse::<u32>().ok()?;
            Some((major, e.path().join("bin")))
        })
        .filter(|(_, dir)| has_initdb(dir))
        .collect();
    versions.sort();
    if let Some((_, dir)) = versions.pop() {
        return Some(dir);
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if has_initdb(&dir) {
            return Some(dir);
        }
    }
    std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .find(|dir| has_initdb(dir))
}

/// `None` when we are not root; otherwise the uid/gid to run PostgreSQL as.
fn unprivileged_user() -> Result<Option<(u32, u32)>, ThrowawayError> {
    if !geteuid().is_root() {
        return Ok(None);
    }
    for name in ["postgres", "nobody"] {
        // getpwnam_r: test threads may look users up at the same time.
        if let Ok(Some(user)) = User::from_name(name) {
            return Ok(Some((user.uid.as_raw(), user.gid.as_raw())));
        }
    }
    Err(ThrowawayError::NoUnprivilegedUser)
}
