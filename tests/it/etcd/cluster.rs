//! Real etcd on loopback: one member, a static three-member cluster, or one
//! member that speaks TLS and wants a client certificate. Each member has its
//! own data directory and free client and peer ports; every member still
//! running is killed and reaped when the cluster is dropped, so no etcd
//! outlives its test.
//!
//! It also owns what a test does to the cluster as an operator would: kill a
//! member, start it again on the same data, compact, turn on auth with the
//! users and roles the etcd backend is meant to run with, and hand out the
//! `ETCDCTL_*` environment both etcdctl and the daemon read.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use etcd_client::{
    Certificate, Client, CompactionOptions, ConnectOptions, Identity, Permission, TlsOptions,
};

use crate::support::{TempDir, free_port, poll, tool};

/// The `root` user's password, once `enable_auth` has run.
pub const ROOT_PASSWORD: &str = "root-pw";
/// The user lock holders run as: read and write on `locks/`.
pub const LOCKER_USER: &str = "locker";
pub const LOCKER_PASSWORD: &str = "locker-pw";
/// The user the daemon runs as: read on `locks/`, read and write on
/// `lease-sweeper/`, and nothing else.
pub const SWEEPER_USER: &str = "sweeper";
pub const SWEEPER_PASSWORD: &str = "sweeper-pw";

/// Raft timings in milliseconds, ten times shorter than etcd's defaults, so
/// a killed leader is replaced within about a second. They also set the
/// shortest lease etcd grants (one and a half election timeouts, rounded
/// up to a whole second): 1 s here, where the defaults give 2 s.
const HEARTBEAT_MS: u32 = 50;
const ELECTION_MS: u32 = 500;

/// How long a member may take to start (or start again) and answer.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The certificates of a TLS cluster, made for it with openssl.
pub struct TlsFiles {
    /// The throwaway CA that signed the server's and the client's
    /// certificates.
    pub ca: PathBuf,
    /// A client certificate the server accepts, and its key.
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
}

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    /// `None` while killed.
    process: Option<Child>,
}

/// A running etcd cluster of real members.
pub struct EtcdCluster {
    /// Data directories, logs and certificates; removed after the members
    /// are gone (fields drop after `Drop::drop`).
    dir: TempDir,
    members: Vec<Member>,
    tls: Option<TlsFiles>,
    /// Set by `enable_auth`: `client` and `env` then act as `root`.
    auth: bool,
}

impl EtcdCluster {
    /// One member.
    pub async fn one() -> Self {
        Self::start(1, false).await
    }

    /// Three members in one static cluster (`--initial-cluster`).
    pub async fn three() -> Self {
        Self::start(3, false).await
    }

    /// One member serving https only to clients with a certificate its CA
    /// signed (`--client-cert-auth`); see `tls`.
    pub async fn one_tls() -> Self {
        Self::start(1, true).await
    }

    async fn start(size: usize, tls: bool) -> Self {
        let dir = TempDir::new("etcd");
        let tls = tls.then(|| make_certs(&dir.join("tls")));
        let members = (0..size)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                process: None,
            })
            .collect();
        let mut cluster = Self {
            dir,
            members,
            tls,
            auth: false,
        };
        // All first, then the waits: a member of three answers only once a
        // quorum has elected a leader.
        for i in 0..size {
            cluster.spawn_member(i);
        }
        for i in 0..size {
            cluster.wait_member(i).await;
        }
        cluster
    }

    /// The certificates when this cluster speaks TLS.
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }

    /// Member `i`'s client URL.
    pub fn member_endpoint(&self, i: usize) -> String {
        format!(
            "{}://127.0.0.1:{}",
            self.scheme(),
            self.members[i].client_port
        )
    }

    /// Every member's client URL, comma-separated: what `ETCDCTL_ENDPOINTS`
    /// takes.
    pub fn endpoints(&self) -> String {
        (0..self.members.len())
            .map(|i| self.member_endpoint(i))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The `ETCDCTL_*` variables that reach this cluster, for etcdctl and
    /// the daemon alike: the endpoints, the certificates when TLS, and
    /// `root`'s credentials once auth is on.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = self.connection_env();
        if self.auth {
            env.push(("ETCDCTL_USER".into(), format!("root:{ROOT_PASSWORD}")));
        }
        env
    }

    /// `env` as `user` instead of `root` (`ETCDCTL_USER=user:password`).
    pub fn env_as(&self, user: &str, password: &str) -> Vec<(String, String)> {
        let mut env = self.connection_env();
        env.push(("ETCDCTL_USER".into(), format!("{user}:{password}")));
        env
    }

    fn connection_env(&self) -> Vec<(String, String)> {
        let mut env = vec![("ETCDCTL_ENDPOINTS".to_string(), self.endpoints())];
        if let Some(tls) = &self.tls {
            for (name, path) in [
                ("ETCDCTL_CACERT", &tls.ca),
                ("ETCDCTL_CERT", &tls.client_cert),
                ("ETCDCTL_KEY", &tls.client_key),
            ] {
                env.push((name.into(), path.display().to_string()));
            }
        }
        env
    }

    /// Connection options for this cluster: the CA and client certificate
    /// when TLS; no per-request timeout, since a Lock call may rightly wait
    /// for as long as the lock is held.
    pub fn connect_options(&self) -> ConnectOptions {
        let options = ConnectOptions::new().with_connect_timeout(Duration::from_secs(2));
        match &self.tls {
            Some(tls) => options.with_tls(
                TlsOptions::new()
                    .ca_certificate(Certificate::from_pem(read(&tls.ca)))
                    .identity(Identity::from_pem(
                        read(&tls.client_cert),
                        read(&tls.client_key),
                    )),
            ),
            None => options,
        }
    }

    /// A client of every member; `root` once auth is on.
    pub async fn client(&self) -> Client {
        if self.auth {
            return self.client_as("root", ROOT_PASSWORD).await;
        }
        connect(&self.endpoints(), self.connect_options()).await
    }

    /// A client of every member, logged in as `user`.
    pub async fn client_as(&self, user: &str, password: &str) -> Client {
        connect(
            &self.endpoints(),
            self.connect_options().with_user(user, password),
        )
        .await
    }

    /// A client of the members running now (`root` once auth is on).
    /// etcd-client's balancer keeps sending a share of requests to a killed
    /// member's endpoint, each failing with `Unavailable` ("tcp connect
    /// error"), so a test that must not retry uses this one after a kill.
    pub async fn running_client(&self) -> Client {
        let running: Vec<String> = (0..self.members.len())
            .filter(|&i| self.members[i].process.is_some())
            .map(|i| self.member_endpoint(i))
            .collect();
        let mut options = self.connect_options();
        if self.auth {
            options = options.with_user("root", ROOT_PASSWORD);
        }
        connect(&running.join(","), options).await
    }

    /// A client of member `i` alone (`root` once auth is on): what that one
    /// member answers, not whichever the balancer picks.
    pub async fn member_client(&self, i: usize) -> Client {
        let mut options = self.connect_options();
        if self.auth {
            options = options.with_user("root", ROOT_PASSWORD);
        }
        connect(&self.member_endpoint(i), options).await
    }

    /// The process ids of the members running now.
    pub fn pids(&self) -> Vec<u32> {
        self.members
            .iter()
            .filter_map(|m| m.process.as_ref().map(Child::id))
            .collect()
    }

    /// Kills member `i` with SIGKILL (no clean shutdown, as a crash or the
    /// OOM killer would) and reaps it.
    pub fn kill_member(&mut self, i: usize) {
        let mut process = self.members[i]
            .process
            .take()
            .unwrap_or_else(|| panic!("member {i} is not running"));
        let _ = process.kill();
        let _ = process.wait();
    }

    /// Starts killed member `i` again on its data directory and ports, and
    /// waits until it answers with a leader. Same flags as at first: with a
    /// WAL in its data directory etcd ignores the `--initial-cluster*` ones.
    pub async fn restart_member(&mut self, i: usize) {
        assert!(
            self.members[i].process.is_none(),
            "member {i} is still running"
        );
        self.spawn_member(i);
        self.wait_member(i).await;
    }

    /// The index of the member that leads now: the running member whose
    /// status names itself the leader; `None` while none does.
    pub async fn leader_index(&self) -> Option<usize> {
        for (i, member) in self.members.iter().enumerate() {
            if member.process.is_none() {
                continue;
            }
            if let Ok(status) = self.probe_client(i).await.status().await
                && status.header().map(|h| h.member_id()) == Some(status.leader())
            {
                return Some(i);
            }
        }
        None
    }

    /// Waits until a running member leads, and returns its index. A write
    /// sent to a follower that still counts on a just-killed leader hangs
    /// for etcd's request timeout (5 s plus two election timeouts: 6 s
    /// here) and fails "etcdserver: request timed out"; after this it
    /// does not.
    pub async fn wait_leader(&self) -> usize {
        poll(START_TIMEOUT, "a leader", || async {
            self.leader_index().await.ok_or_else(String::new)
        })
        .await
    }

    /// Compacts the history at the current revision and waits for the
    /// physical compaction, so every older revision is gone; returns that
    /// revision. With nothing written since the last compaction it is a
    /// no-op.
    pub async fn compact_to_current(&self) -> i64 {
        let mut client = self.client().await;
        let revision = client
            .get("lease-sweeper-test/compact", None)
            .await
            .expect("reading the current revision")
            .header()
            .expect("a response header")
            .revision();
        match client
            .compact(revision, Some(CompactionOptions::new().with_physical()))
            .await
        {
            Ok(_) => {}
            // Already compacted there: nothing was written since.
            Err(e)
                if e.to_string()
                    .contains("required revision has been compacted") => {}
            Err(e) => panic!("compacting at {revision}: {e}"),
        }
        revision
    }

    /// Turns on auth with the users the etcd backend runs with: `root`
    /// (role `root`, `ROOT_PASSWORD`), `locker` (read and write on
    /// `locks/`) for lock holders, and `sweeper`, whose role may only read
    /// `locks/` and read and write `lease-sweeper/`. From here on `client`
    /// and `env` log in as `root`.
    pub async fn enable_auth(&mut self) {
        let mut c = self.client().await;
        c.user_add("root", ROOT_PASSWORD, None)
            .await
            .expect("adding user root");
        c.role_add("root").await.expect("adding role root");
        c.user_grant_role("root", "root")
            .await
            .expect("granting root to root");
        let roles = [
            (
                LOCKER_USER,
                LOCKER_PASSWORD,
                vec![Permission::read_write("locks/").with_prefix()],
            ),
            (
                SWEEPER_USER,
                SWEEPER_PASSWORD,
                vec![
                    Permission::read("locks/").with_prefix(),
                    Permission::read_write("lease-sweeper/").with_prefix(),
                ],
            ),
        ];
        for (user, password, permissions) in roles {
            // Each user has a role of its own name.
            c.role_add(user).await.expect("adding a role");
            for permission in permissions {
                c.role_grant_permission(user, permission)
                    .await
                    .expect("granting a permission");
            }
            c.user_add(user, password, None)
                .await
                .expect("adding a user");
            c.user_grant_role(user, user)
                .await
                .expect("granting a user its role");
        }
        c.auth_enable().await.expect("enabling auth");
        self.auth = true;
    }

    /// What member `i` has logged so far.
    pub fn member_log(&self, i: usize) -> String {
        fs::read_to_string(self.log_path(i)).unwrap_or_default()
    }

    fn log_path(&self, i: usize) -> PathBuf {
        self.dir.join(format!("{}.log", self.members[i].name))
    }

    fn spawn_member(&mut self, i: usize) {
        let initial_cluster = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let client_url = self.member_endpoint(i);
        let member = &self.members[i];
        let peer_url = format!("http://127.0.0.1:{}", member.peer_port);
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(i))
            .expect("opening a member's log");
        let mut cmd = Command::new(tool("etcd", "etcd-server"));
        // Nothing from the developer's ETCD_* variables (etcd reads them all).
        cmd.env_clear()
            .arg("--name")
            .arg(&member.name)
            .arg("--data-dir")
            .arg(self.dir.join(&member.name))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &initial_cluster])
            .args(["--initial-cluster-state", "new"])
            // Unique to this cluster: members of two tests' clusters that
            // found each other's ports would refuse to join.
            .args(["--initial-cluster-token", &self.dir.display().to_string()])
            .args(["--heartbeat-interval", &HEARTBEAT_MS.to_string()])
            .args(["--election-timeout", &ELECTION_MS.to_string()])
            .args(["--logger", "zap", "--log-outputs", "stderr"]);
        if let Some(tls) = &self.tls {
            cmd.arg("--client-cert-auth")
                .arg("--trusted-ca-file")
                .arg(&tls.ca)
                .arg("--cert-file")
                .arg(&tls.server_cert)
                .arg("--key-file")
                .arg(&tls.server_key);
        }
        let process = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting etcd (Debian: apt-get install etcd-server)");
        self.members[i].process = Some(process);
    }

    /// A client of member `i` alone that gives up on a request after a
    /// second: for asking whether it answers.
    async fn probe_client(&self, i: usize) -> Client {
        connect(
            &self.member_endpoint(i),
            self.connect_options()
                .with_timeout(Duration::from_secs(1))
                .with_connect_timeout(Duration::from_secs(1)),
        )
        .await
    }

    /// Waits until member `i` answers a status call and knows a leader;
    /// fails at once, with its log, if it exits.
    async fn wait_member(&mut self, i: usize) {
        let what = format!("etcd member {i} at {}", self.member_endpoint(i));
        let probe = self.probe_client(i).await;
        let members = &mut self.members;
        let log = self.dir.join(format!("{}.log", members[i].name));
        poll(START_TIMEOUT, &what, || {
            let mut probe = probe.clone();
            let exited = members[i]
                .process
                .as_mut()
                .and_then(|p| p.try_wait().ok().flatten());
            let log = &log;
            async move {
                if let Some(status) = exited {
                    panic!(
                        "etcd member {i} exited ({status}):\n{}",
                        fs::read_to_string(log).unwrap_or_default()
                    );
                }
                match probe.status().await {
                    Ok(s) if s.leader() != 0 => Ok(()),
                    Ok(_) => Err("no leader yet".into()),
                    Err(e) => Err(e.to_string()),
                }
            }
        })
        .await;
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for member in &mut self.members {
            if let Some(mut process) = member.process.take() {
                let _ = process.kill();
                let _ = process.wait();
            }
        }
    }
}

/// A client of `endpoints` (comma-separated). Connecting only builds the
/// channel (and logs in when `options` has a user); nothing is sent until
/// the first request.
async fn connect(endpoints: &str, options: ConnectOptions) -> Client {
    let list: Vec<&str> = endpoints.split(',').collect();
    Client::connect(&list, Some(options))
        .await
        .unwrap_or_else(|e| panic!("connecting to etcd at {endpoints}: {e}"))
}

fn read(path: &Path) -> Vec<u8> {
    fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Runs openssl with `args` (split on spaces) in `dir`, failing the test
/// with its output.
fn openssl(dir: &Path, args: &str) {
    let out = Command::new(tool("openssl", "openssl"))
        .args(args.split_whitespace())
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("running openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A throwaway CA in `dir`, a server certificate it signed for 127.0.0.1
/// and localhost, and a client certificate it signed.
fn make_certs(dir: &Path) -> TlsFiles {
    fs::create_dir_all(dir).unwrap();
    let ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    openssl(
        dir,
        &format!("req -x509 {ec} -keyout ca-key.pem -out ca.pem -days 2 -subj /CN=etcd-test-CA"),
    );
    // X.509 v3 for both leaves (without -extfile OpenSSL signs v1, which
    // rustls refuses). The server's certificate is a client's too: etcd's
    // own gRPC gateway dials the gRPC server with it, and --client-cert-auth
    // asks every client for one.
    // The client's CN is no etcd user's name: with auth on, etcd would
    // take a certificate's CN as the user it logs in.
    for (name, cn, ext) in [
        (
            "server",
            "localhost",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
             extendedKeyUsage=serverAuth,clientAuth\n",
        ),
        (
            "client",
            "lease-sweeper-test-client",
            "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
        ),
    ] {
        openssl(
            dir,
            &format!("req {ec} -keyout {name}-key.pem -out {name}.csr -subj /CN={cn}"),
        );
        fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
        openssl(
            dir,
            &format!(
                "x509 -req -in {name}.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial \
                 -out {name}.pem -days 2 -extfile {name}.ext"
            ),
        );
    }
    TlsFiles {
        ca: dir.join("ca.pem"),
        client_cert: dir.join("client.pem"),
        client_key: dir.join("client-key.pem"),
        server_cert: dir.join("server.pem"),
        server_key: dir.join("server-key.pem"),
    }
}
