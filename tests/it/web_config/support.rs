//! Plumbing for the web-configuration tests: a throwaway PKI made with the
//! real `openssl`, bcrypt hashes from the real `htpasswd`, the web config
//! file itself, `lease-sweeper check`'s line about it, `promtool`'s verdict,
//! and TLS clients (`curl`, `openssl s_client`), and a daemon serving a web
//! config. It starts no Prometheus: `observability::support` has that.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::{TempDir, binary, tool};

/// The variable naming the web configuration file.
pub const WEB_CONFIG_VAR: &str = "LEASE_SWEEPER_WEB_CONFIG_FILE";
/// The subject of `check`'s line about that file.
pub const CHECK_SUBJECT: &str = "metrics endpoint web config";
/// The user every test scrapes as, and its password.
pub const USER: &str = "scraper";
pub const PASSWORD: &str = "correct-horse-7";

/// Serial numbers of the two server certificates, so a test can tell which
/// one the endpoint served.
pub const SERVER_SERIAL: &str = "1001";
pub const SERVER2_SERIAL: &str = "2002";

/// A throwaway PKI in a directory of its own (mode 0755, every file
/// readable, so an unprivileged reader is refused only where a test says so):
/// - `ca.crt`: the CA every good certificate chains to;
/// - `server.crt`/`server.key`: for 127.0.0.1 and localhost, serial 1001;
/// - `server2.crt`/`server2.key`: the same names, serial 2002 (a rotation);
/// - `expired.crt`/`expired.key`: the same names, expired a year ago;
/// - `client.crt`/`client.key`: a client certificate from `ca.crt`;
/// - `rogue-ca.crt`, `rogue-client.crt`/`rogue-client.key`: a client
///   certificate from an unrelated CA.
///
/// `server.crt` with `server2.key` is a key that does not match its cert.
pub struct Pki {
    pub dir: TempDir,
}

impl Pki {
    pub fn new() -> Self {
        let pki = Self {
            dir: TempDir::shared("pki", None),
        };
        pki.key("ca");
        pki.ca("ca");
        pki.key("rogue-ca");
        pki.ca("rogue-ca");
        let server = "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n\
                      extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n";
        let client = "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n\
                      extendedKeyUsage=clientAuth\n";
        pki.leaf("server", "ca", SERVER_SERIAL, server, false);
        pki.leaf("server2", "ca", SERVER2_SERIAL, server, false);
        pki.leaf("expired", "ca", "3003", server, true);
        pki.leaf("client", "ca", "4004", client, false);
        pki.leaf("rogue-client", "rogue-ca", "5005", client, false);
        pki
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// A file's text, as a string (for comparing what was served, and for
    /// making sure no private key ever shows up in an error).
    pub fn text(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).unwrap()
    }

    /// The day a certificate stops being valid, as `YYYY-MM-DD`.
    pub fn not_after(&self, name: &str) -> String {
        let out = Command::new(tool("openssl", "openssl"))
            .args(["x509", "-noout", "-enddate", "-dateopt", "iso_8601", "-in"])
            .arg(self.path(name))
            .output()
            .expect("running openssl");
        let text = String::from_utf8(out.stdout).unwrap();
        text.trim()
            .strip_prefix("notAfter=")
            .and_then(|d| d.get(..10))
            .unwrap_or_else(|| panic!("no notAfter in {text:?}"))
            .to_owned()
    }

    /// The base64 lines of a private key: none may appear in any output.
    pub fn key_secrets(&self, name: &str) -> Vec<String> {
        self.text(name)
            .lines()
            .filter(|l| !l.starts_with("-----") && l.len() > 16)
            .map(str::to_owned)
            .collect()
    }

    fn key(&self, name: &str) {
        self.openssl(
            &[
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-out",
                &format!("{name}.key"),
            ],
            false,
        );
        readable(&self.path(&format!("{name}.key")));
    }

    fn ca(&self, name: &str) {
        self.openssl(
            &[
                "req",
                "-x509",
                "-new",
                "-key",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.crt"),
                "-days",
                "3650",
                "-subj",
                &format!("/CN=lease-sweeper test {name}"),
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
            false,
        );
    }

    /// A key and a certificate signed by `ca` with these extensions; an
    /// `expired` one is made as if a year and a month ago, valid for 30 days.
    fn leaf(&self, name: &str, ca: &str, serial: &str, extensions: &str, expired: bool) {
        self.key(name);
        std::fs::write(self.path(&format!("{name}.ext")), extensions).unwrap();
        self.openssl(
            &[
                "req",
                "-new",
                "-key",
                &format!("{name}.key"),
                "-subj",
                &format!("/CN={name}"),
                "-out",
                &format!("{name}.csr"),
            ],
            false,
        );
        self.openssl(
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                &format!("{ca}.crt"),
                "-CAkey",
                &format!("{ca}.key"),
                "-set_serial",
                &format!("0x{serial}"),
                "-days",
                "30",
                "-extfile",
                &format!("{name}.ext"),
                "-out",
                &format!("{name}.crt"),
            ],
            expired,
        );
    }

    /// Runs `openssl args` in the PKI's directory (under `faketime` 400 days
    /// back when `back_in_time`), failing the test with what it said.
    pub fn openssl(&self, args: &[&str], back_in_time: bool) {
        let openssl = tool("openssl", "openssl");
        let mut cmd = if back_in_time {
            let mut c = Command::new(tool("faketime", "faketime"));
            c.args(["-f", "-400d"]).arg(openssl);
            c
        } else {
            Command::new(openssl)
        };
        let out = cmd
            .args(args)
            .current_dir(&self.dir.0)
            .stdin(Stdio::null())
            .output()
            .expect("running openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Makes a file readable by everyone (openssl writes keys 0600): only the
/// test that means to refuse a reader takes the bits away.
pub fn readable(path: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
}

/// The bcrypt hash `htpasswd` makes of `password` at cost 4 (`$2y$04$…`):
/// the lowest cost the toolkit accepts, so the tests stay quick.
pub fn bcrypt(password: &str) -> String {
    htpasswd(USER, password, 4)
}

/// The bcrypt hash `htpasswd` makes for `user` and `password` at `cost`.
pub fn htpasswd(user: &str, password: &str, cost: u32) -> String {
    let out = Command::new(tool("htpasswd", "apache2-utils"))
        .args(["-nbBC", &cost.to_string(), user, password])
        .output()
        .expect("running htpasswd");
    assert!(out.status.success(), "htpasswd failed");
    let line = String::from_utf8(out.stdout).unwrap();
    let hash = line
        .trim()
        .strip_prefix(&format!("{user}:"))
        .expect("htpasswd prints user:hash")
        .to_owned();
    assert!(hash.starts_with(&format!("$2y${cost:02}$")), "{hash}");
    hash
}

/// Writes `text` as `name` in `dir` (replacing it in one rename, as an
/// operator's config management does) and returns its path.
pub fn write_config(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    let tmp = path.with_file_name(format!(
        ".{}.tmp",
        path.file_name().unwrap().to_string_lossy()
    ));
    std::fs::write(&tmp, text).unwrap();
    readable(&tmp);
    std::fs::rename(&tmp, &path).unwrap();
    path
}

/// A web config serving TLS with the PKI's server certificate (absolute
/// paths) and `extra` lines appended to `tls_server_config`, then `rest`.
pub fn tls_config(pki: &Pki, extra: &str, rest: &str) -> String {
    format!(
        "tls_server_config:\n  cert_file: {}\n  key_file: {}\n{extra}{rest}",
        pki.path("server.crt").display(),
        pki.path("server.key").display(),
    )
}

/// `tls_config` with `extra`, and the one test user with `PASSWORD`.
pub fn tls_and_password(pki: &Pki, extra: &str) -> String {
    tls_config(pki, extra, &users(&bcrypt(PASSWORD)))
}

/// The `basic_auth_users` section with the one test user and this hash.
pub fn users(hash: &str) -> String {
    format!("basic_auth_users:\n  {USER}: '{hash}'\n")
}

/// What `lease-sweeper check` said about the web config file: its status
/// word (`ok`, `warn`, `FAIL`), the rest of the line, and all it printed.
#[derive(Debug)]
pub struct CheckLine {
    pub status: String,
    pub detail: String,
    pub output: String,
}

/// Runs `lease-sweeper check` in `cwd` with `file` as the web config
/// (endpoint address set, database `url`), as `as_user` when given (via
/// setpriv), and returns its line about that file; fails the test when
/// there is none.
pub async fn check_web_config(
    url: &str,
    file: &Path,
    as_user: Option<u32>,
    cwd: &Path,
) -> CheckLine {
    let bin = binary();
    let mut cmd = match as_user {
        Some(uid) => {
            let mut c = tokio::process::Command::new(tool("setpriv", "util-linux"));
            c.arg(format!("--reuid={uid}"))
                .arg(format!("--regid={uid}"))
                .arg("--clear-groups")
                .arg(&bin);
            c
        }
        None => tokio::process::Command::new(&bin),
    };
    cmd.arg("check")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("LOCKDB_URL", url)
        .env("LEASE_SWEEPER_METRICS_ADDR", "127.0.0.1:0")
        .env(WEB_CONFIG_VAR, file)
        .current_dir(cwd)
        .stdin(Stdio::null());
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("check finishes within 60 s")
        .expect("running lease-sweeper check");
    let output = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let prefix = format!("{CHECK_SUBJECT}: ");
    output
        .lines()
        .find_map(|line| {
            let (status, rest) = line.split_once(' ')?;
            let detail = rest.trim_start().strip_prefix(&prefix)?;
            Some(CheckLine {
                status: status.to_owned(),
                detail: detail.to_owned(),
                output: output.clone(),
            })
        })
        .unwrap_or_else(|| panic!("no `{CHECK_SUBJECT}` line from check:\n{output}"))
}

/// `promtool check web-config file` in `cwd` (as `as_user` when given):
/// whether it accepted the file, and what it said.
pub fn promtool_accepts(file: &Path, as_user: Option<u32>, cwd: &Path) -> (bool, String) {
    let promtool = tool("promtool", "prometheus");
    let mut cmd = match as_user {
        Some(uid) => {
            let mut c = Command::new(tool("setpriv", "util-linux"));
            c.arg(format!("--reuid={uid}"))
                .arg(format!("--regid={uid}"))
                .arg("--clear-groups")
                .arg(promtool);
            c
        }
        None => Command::new(promtool),
    };
    let out = cmd
        .args(["check", "web-config"])
        .arg(file)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output()
        .expect("running promtool");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

/// What `curl` got: its exit code (0, or why the transfer failed: 35, 56,
/// 60, … for TLS), the HTTP status (0 when none came back), the response
/// head and the body.
pub struct Fetched {
    pub exit: i32,
    pub status: u16,
    pub head: String,
    pub body: String,
    /// curl's own words on a failure, for failure messages.
    pub stderr: String,
}

/// Failure messages show the start of the body only: a scrape is long.
impl std::fmt::Debug for Fetched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let body: String = self.body.chars().take(200).collect();
        write!(
            f,
            "curl exit {}, status {}, head {:?}, body {body:?}…, stderr {:?}",
            self.exit, self.status, self.head, self.stderr
        )
    }
}

impl Fetched {
    /// curl's exit codes for a connection that failed in TLS: the
    /// handshake (35), the peer's certificate (60), a TLS alert or reset
    /// read after the handshake (56), a reply that was no HTTP (52).
    pub fn failed_in_tls(&self) -> bool {
        self.status == 0 && matches!(self.exit, 35 | 52 | 56 | 60)
    }
}

/// `curl` to `url` with these extra arguments (`--cacert`, `--cert`, …).
pub async fn curl(url: &str, args: &[&str]) -> Fetched {
    const MARK: &str = "\n@@status@@";
    let out = tokio::process::Command::new(tool("curl", "curl"))
        .args(["-sS", "-i", "--max-time", "10", "-w"])
        .arg(format!("{MARK}%{{http_code}}"))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("running curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (response, status) = text.rsplit_once(MARK).unwrap_or((&text, "0"));
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((response, ""));
    Fetched {
        exit: out.status.code().unwrap_or(-1),
        status: status.trim().parse().unwrap_or(0),
        head: head.to_owned(),
        body: body.to_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The leaf certificate the endpoint at `port` serves (PEM, as
/// `openssl s_client` prints it), or None when no handshake completed.
pub async fn served_certificate(port: u16) -> Option<String> {
    let out = tokio::process::Command::new(tool("openssl", "openssl"))
        .args(["s_client", "-connect"])
        .arg(format!("127.0.0.1:{port}"))
        .args(["-servername", "localhost"])
        .stdin(Stdio::null())
        .output()
        .await
        .expect("running openssl s_client");
    let text = String::from_utf8_lossy(&out.stdout);
    let start = text.find("-----BEGIN CERTIFICATE-----")?;
    let end = text[start..].find("-----END CERTIFICATE-----")? + start;
    Some(format!("{}-----END CERTIFICATE-----\n", &text[start..end]))
}

/// The uid of `nobody`, to read a file as a user its mode refuses; None
/// when the tests already run unprivileged (the mode refuses them itself).
pub fn unprivileged_reader() -> Option<u32> {
    nix::unistd::geteuid().is_root().then_some(65_534)
}

/// What every test serving a web config starts from, made in this order:
/// a throwaway database, a statsd capture and a fresh PKI.
pub async fn parts() -> (crate::support::TestDb, crate::support::StatsdCapture, Pki) {
    let db = crate::support::TestDb::new().await;
    let statsd = crate::support::StatsdCapture::start().await;
    (db, statsd, Pki::new())
}

/// Writes `text` as `web.yml` in the PKI's directory and starts a daemon on
/// `db` sending to `statsd` with it (`daemon_with_web_config`).
pub async fn serve(
    db: &crate::support::TestDb,
    statsd: &crate::support::StatsdCapture,
    pki: &Pki,
    text: &str,
) -> (crate::support::Daemon, std::net::SocketAddr) {
    let web = write_config(&pki.dir, "web.yml", text);
    daemon_with_web_config(&db.url, &statsd.port.to_string(), &web).await
}

/// `tls_server_config` lines asking every client for a certificate the
/// PKI's CA signed (the `extra` of `tls_config`).
pub fn require_client_cert(pki: &Pki) -> String {
    format!(
        "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {}\n",
        pki.path("ca.crt").display()
    )
}

/// Stops the daemon and asserts it exited 0 having rejected no web config
/// while running; what it logged.
pub async fn stop_with_no_rejection(mut daemon: crate::support::Daemon) -> Vec<String> {
    let (code, lines) = daemon.stop().await;
    assert_eq!(code, Some(0));
    assert!(
        crate::support::events(&lines, "web_config_rejected").is_empty(),
        "{lines:?}"
    );
    lines
}

/// `daemon_env` plus the endpoint on a free loopback port and `web` as its
/// web config: the daemon and the address it logged in `metrics_listening`.
/// A daemon that never listens fails the test with what it wrote.
pub async fn daemon_with_web_config(
    url: &str,
    statsd_port: &str,
    web: &Path,
) -> (crate::support::Daemon, std::net::SocketAddr) {
    let web = web.to_str().unwrap();
    let mut env = crate::support::daemon_env(url, statsd_port);
    env.push((WEB_CONFIG_VAR, web));
    env.push((crate::observability::support::ADDR_VAR, "127.0.0.1:0"));
    let daemon = crate::support::Daemon::spawn(&env);
    let addr = crate::support::poll(
        Duration::from_secs(30),
        "the endpoint listening",
        || async {
            let lines = daemon.lines();
            match crate::support::events(&lines, "metrics_listening").first() {
                Some(listening) => Ok(listening["addr"]
                    .parse()
                    .expect("metrics_listening carries the bound address")),
                None => Err(format!("the daemon wrote:\n{}", lines.join("\n"))),
            }
        },
    )
    .await;
    (daemon, addr)
}

/// The endpoint's URL over TLS (the certificate names 127.0.0.1 too).
pub fn https_url(addr: std::net::SocketAddr) -> String {
    format!("https://{addr}/metrics")
}

/// A path as curl's argument.
pub fn arg(path: PathBuf) -> String {
    path.display().to_string()
}

/// What one `openssl s_client` request for /metrics got: whether the TLS
/// session was resumed, and whether the answer was a 200.
#[derive(Debug, PartialEq, Eq)]
pub struct Session {
    pub resumed: bool,
    pub ok: bool,
}

/// `GET /metrics` over `openssl s_client` to loopback `port`, trusting
/// `ca`, with `args` (`-cert`/`-key`, `-sess_out FILE`, `-sess_in FILE`).
pub async fn s_client_get(port: u16, ca: &Path, args: &[&str]) -> Session {
    use tokio::io::AsyncWriteExt as _;
    let mut child = tokio::process::Command::new(tool("openssl", "openssl"))
        .args(["s_client", "-connect"])
        .arg(format!("127.0.0.1:{port}"))
        .args(["-servername", "localhost", "-ign_eof", "-CAfile"])
        .arg(ca)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("running openssl s_client");
    let mut stdin = child.stdin.take().unwrap();
    // The request goes out once the handshake is done; `-ign_eof` keeps the
    // client until the server closes, so the whole answer is read.
    let _ = stdin
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await;
    drop(stdin);
    let out = tokio::time::timeout(Duration::from_secs(15), child.wait_with_output())
        .await
        .expect("s_client finishes within 15 s")
        .expect("s_client output");
    let text = String::from_utf8_lossy(&out.stdout);
    Session {
        resumed: text.lines().any(|l| l.starts_with("Reused,")),
        ok: text.lines().any(|l| l.starts_with("HTTP/1.1 200")),
    }
}

/// Held by each flood test for its whole run, so two floods never overlap:
/// each bounds how late the sweep runs under its own load, not under the
/// other's on top (the machine has two cores).
pub static ONE_FLOOD_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
