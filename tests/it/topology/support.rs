//! Plumbing for the topology tests: a real PgBouncer
//! started as an unprivileged user, certificates made with openssl, running
//! the real binary as another OS user, and reading the reported keys back.
//!
//! It owns no tests; the modules beside it do. Its one assertion,
//! `assert_each_once`, is the exactly-once check they share.

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::unistd::{User, geteuid};

use crate::support::{TempDir, events, free_port, wait_listening};

/// uid/gid of the `postgres` user when we are root (PgBouncer and
/// PostgreSQL refuse to run as root), else `None` (run as ourselves).
pub fn unprivileged() -> Option<(u32, u32)> {
    if !geteuid().is_root() {
        return None;
    }
    let user = User::from_name("postgres")
        .expect("looking up the `postgres` user")
        .expect("running as root needs a `postgres` user");
    Some((user.uid.as_raw(), user.gid.as_raw()))
}

/// `/usr/sbin/<name>` when it exists (not on every user's PATH), else `name`.
pub fn sbin(name: &str) -> PathBuf {
    let full = Path::new("/usr/sbin").join(name);
    if full.is_file() {
        full
    } else {
        PathBuf::from(name)
    }
}

/// A real PgBouncer on loopback, in front of one database.
pub struct Bouncer {
    pub port: u16,
    child: tokio::process::Child,
    dir: TempDir,
}

impl Bouncer {
    /// Starts PgBouncer with `pool_mode` and `pool_size` server connections
    /// for database `dbname`, reached at `server` (a socket directory or a
    /// host) and `server_port`, logging in as `user` with trust.
    /// No `ignore_startup_parameters`: a client sending a parameter
    /// PgBouncer does not know is refused, as in a default install.
    pub async fn start(
        server: &str,
        server_port: u16,
        dbname: &str,
        user: &str,
        pool_mode: &str,
        pool_size: u32,
    ) -> Self {
        let owner = unprivileged();
        let dir = TempDir::shared("pgbouncer", owner);
        let port = free_port();
        fs::write(dir.join("userlist.txt"), format!("\"{user}\" \"\"\n")).unwrap();
        fs::write(
            dir.join("pgbouncer.ini"),
            format!(
                "[databases]\n\
                 {dbname} = host={server} port={server_port} dbname={dbname} user={user}\n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {port}\n\
                 unix_socket_dir =\n\
                 auth_type = trust\n\
                 auth_file = {}\n\
                 pool_mode = {pool_mode}\n\
                 default_pool_size = {pool_size}\n\
                 min_pool_size = 0\n\
                 reserve_pool_size = 0\n\
                 max_client_conn = 200\n\
                 server_reset_query =\n\
                 log_connections = 0\n\
                 log_disconnections = 0\n",
                dir.join("userlist.txt").display()
            ),
        )
        .unwrap();
        for f in ["userlist.txt", "pgbouncer.ini"] {
            fs::set_permissions(dir.join(f), fs::Permissions::from_mode(0o644)).unwrap();
        }
        let mut cmd = tokio::process::Command::new(sbin("pgbouncer"));
        cmd.arg(dir.join("pgbouncer.ini"))
            .current_dir(&*dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                fs::File::create(dir.join("pgbouncer.log")).unwrap(),
            ))
            .kill_on_drop(true);
        if let Some((uid, gid)) = owner {
            cmd.uid(uid).gid(gid);
        }
        let child = cmd
            .spawn()
            .expect("starting pgbouncer (Debian: apt-get install pgbouncer)");
        wait_listening(port, "pgbouncer").await;
        Self { port, child, dir }
    }

    /// What PgBouncer logged (errors it saw from clients and servers).
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        // Its directory goes with `dir`.
        let _ = self.child.start_kill();
    }
}

/// Runs openssl with `args` (split on spaces) in `dir`, failing the test
/// with its output.
fn openssl(dir: &Path, args: &str) {
    let out = Command::new("openssl")
        .args(args.split_whitespace())
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("running openssl (Debian: apt-get install openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Certificates made for one test: a CA, a server certificate it signed
/// for `localhost` only, and an unrelated CA.
pub struct Certs {
    /// Where they are; removed with `Certs`.
    _dir: TempDir,
    pub ca: PathBuf,
    pub wrong_ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    /// A client certificate for role `certuser`, signed by `ca`.
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl Certs {
    /// Makes them in a directory owned by `owner` (the server reads the key,
    /// which must be its own and 0600).
    pub fn make(owner: Option<(u32, u32)>) -> Self {
        let dir = TempDir::shared("tls", None);
        let ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
        for (name, cn) in [
            ("ca", "lease-sweeper-test-CA"),
            ("wrong-ca", "someone-elses-CA"),
        ] {
            openssl(
                &dir,
                &format!(
                    "req -x509 {ec} -keyout {name}.key -out {name}.crt -days 2 -subj /CN={cn}"
                ),
            );
        }
        // Each leaf certificate: a key and a request for its CN, signed by
        // `ca` with its extensions. X.509 v3 (extensions) for the client
        // too, which rustls requires: without -extfile OpenSSL 3.0 signs a
        // v1 certificate.
        for (name, cn, ext) in [
            (
                "server",
                "localhost",
                "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\n",
            ),
            (
                "client",
                "certuser",
                "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
            ),
        ] {
            openssl(
                &dir,
                &format!("req {ec} -keyout {name}.key -out {name}.csr -subj /CN={cn}"),
            );
            fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
            openssl(
                &dir,
                &format!(
                    "x509 -req -in {name}.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
                     -out {name}.crt -days 2 -extfile {name}.ext"
                ),
            );
        }
        for key in ["server.key", "client.key"] {
            fs::set_permissions(dir.join(key), fs::Permissions::from_mode(0o600)).unwrap();
        }
        if let Some((uid, gid)) = owner {
            for f in ["server.key", "server.crt"] {
                std::os::unix::fs::chown(dir.join(f), Some(uid), Some(gid)).unwrap();
            }
        }
        Self {
            ca: dir.join("ca.crt"),
            wrong_ca: dir.join("wrong-ca.crt"),
            server_cert: dir.join("server.crt"),
            server_key: dir.join("server.key"),
            client_cert: dir.join("client.crt"),
            client_key: dir.join("client.key"),
            _dir: dir,
        }
    }
}

/// `lockKey` of every `lease_expired` line.
pub fn lease_keys(lines: &[String]) -> Vec<String> {
    events(lines, "lease_expired")
        .into_iter()
        .map(|f| f["lockKey"].clone())
        .collect()
}

/// Asserts each key appears exactly once over all daemons' lines.
pub fn assert_each_once(all: &[String], expected: usize, prefix: &str) {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for k in all.iter().filter(|k| k.starts_with(prefix)) {
        *seen.entry(k.as_str()).or_default() += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "reported more than once: {twice:?}");
    assert_eq!(seen.len(), expected, "distinct {prefix}* reported");
}

/// The socket directory (or host), port and user of a test database URL.
pub fn server_of(url: &str) -> (String, u16, String) {
    let u = url::Url::parse(url).unwrap();
    let host = u
        .query_pairs()
        .find(|(k, _)| k == "host")
        .map(|(_, v)| v.into_owned())
        .or_else(|| u.host_str().map(str::to_owned))
        .unwrap();
    (host, u.port().unwrap_or(5432), u.username().to_owned())
}
