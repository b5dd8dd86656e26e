//! The scrape endpoint's web configuration file
//! (`LEASE_SWEEPER_WEB_CONFIG_FILE`): Prometheus's exporter-toolkit format,
//! the file node_exporter and Prometheus read with `--web.config.file`.
//!
//! Owns reading the file and the files it names (the edge: `file` parses,
//! `tls` builds, `auth` checks passwords, all without I/O of their own),
//! and keeping the configuration current: `Watch::current` is asked once
//! per connection, re-reads the files, and rebuilds only when their bytes
//! changed. A version that fails keeps the last good one serving (never
//! plain HTTP, never no auth) and is reported once per distinct problem
//! (again after the file is good once more). It does not serve or log
//! (`scrape` does) and does not read the environment (`config` does).

pub mod auth;
pub mod file;
pub mod tls;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

pub use file::{ClientAuth, Settings};

/// The variable naming the file.
pub const FILE_VAR: &str = "LEASE_SWEEPER_WEB_CONFIG_FILE";

/// Largest file read (the web configuration file, a certificate, a key, a
/// CA bundle): far above any real one, and a path mistakenly naming
/// `/dev/zero` or a huge file fails instead of filling memory.
pub const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// Reads at most `MAX_FILE_BYTES` of `path`; a longer file is an error.
fn read_bounded(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {MAX_FILE_BYTES} bytes, so not what it should be"),
        ));
    }
    Ok(bytes)
}

/// Distinct problems remembered (so each is logged once) until a good
/// version loads; past it the memory is cleared rather than grown.
const REMEMBERED_PROBLEMS: usize = 32;

/// Why the file cannot be used: which file, which key in it, what is
/// wrong and what to do. Never carries a hash, a password or key material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("web configuration file {file} ({FILE_VAR}): {field}: {problem}")]
pub struct WebConfigError {
    pub file: String,
    pub field: String,
    pub problem: String,
}

/// One good version of the file, ready to serve.
pub struct Active {
    /// None: plain HTTP.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    pub headers: Vec<(String, String)>,
    /// Empty: no authentication.
    pub users: BTreeMap<String, String>,
    pub client_auth: ClientAuth,
    /// The server certificate's notAfter, when TLS is on.
    pub not_after: Option<String>,
    /// Whether that moment has passed.
    pub expired: bool,
    /// What the toolkit accepts but weakens the endpoint (client
    /// certificates checked against no CA, or every public one).
    pub warnings: Vec<String>,
    digest: [u8; 32],
}

impl Active {
    /// A few words for `check` and the log: TLS on or off, client auth, users.
    pub fn summary(&self) -> String {
        let users = match self.users.len() {
            1 => "1 basic-auth user".to_owned(),
            n => format!("{n} basic-auth users"),
        };
        match &self.tls {
            Some(_) => format!(
                "TLS on (client_auth_type {}, certificate valid until {}), {users}",
                self.client_auth.name(),
                self.not_after.as_deref().unwrap_or("?")
            ),
            None => format!("TLS off (plain HTTP), {users}"),
        }
    }
}

/// Reads and builds the file at `path`, with every file it names.
pub fn load(path: &Path) -> Result<Active, WebConfigError> {
    let (digest, read) = read(path);
    read.and_then(|pending| pending.build(path, digest))
}

/// What reading found, before the (costlier) build: the settings and the
/// bytes of the files they name.
struct Pending {
    settings: Settings,
    /// The certificate, key and CA, when TLS is on.
    material: Option<tls::Material>,
}

impl Pending {
    fn build(self, path: &Path, digest: [u8; 32]) -> Result<Active, WebConfigError> {
        let Pending { settings, material } = self;
        let (Some(tls_settings), Some(mut material)) = (settings.tls, material) else {
            return Ok(Active {
                tls: None,
                headers: settings.headers,
                users: settings.users,
                client_auth: ClientAuth::NoClientCert,
                not_after: None,
                expired: false,
                warnings: Vec::new(),
                digest,
            });
        };
        if material.client_ca.is_none()
            && matches!(
                tls_settings.client_auth,
                ClientAuth::VerifyClientCertIfGiven | ClientAuth::RequireAndVerifyClientCert
            )
        {
            // The toolkit's fallback for a verifying type without a CA file.
            material.system_roots = rustls_native_certs::load_native_certs().certs;
        }
        let built = tls::build(&tls_settings, &material).map_err(|e| WebConfigError {
            file: path.display().to_string(),
            field: e.field,
            problem: e.problem,
        })?;
        Ok(Active {
            tls: Some(built.config),
            headers: settings.headers,
            users: settings.users,
            client_auth: tls_settings.client_auth,
            not_after: Some(built.not_after),
            expired: built.expired,
            warnings: built.warnings,
            digest,
        })
    }
}

/// Reads the file and the files it names, returning the digest of all
/// bytes read (and of each failure) with what was read or why it is bad.
/// Builds nothing: a caller whose digest is unchanged stops here.
fn read(path: &Path) -> ([u8; 32], Result<Pending, WebConfigError>) {
    let mut digest = Sha256::new();
    let fail = |field: &str, problem: String| WebConfigError {
        file: path.display().to_string(),
        field: field.to_owned(),
        problem,
    };
    let bytes = match read_bounded(path) {
        Ok(b) => b,
        Err(e) => {
            digest.update(e.to_string());
            return (
                digest.finalize().into(),
                Err(fail(
                    "(file)",
                    format!("cannot be read: {e}; check the path and that this user may read it"),
                )),
            );
        }
    };
    feed(&mut digest, path, Ok(&bytes));
    let dir = path.parent().unwrap_or(Path::new(""));
    let settings = match file::parse(&bytes, dir) {
        Ok(s) => s,
        Err(e) => return (digest.finalize().into(), Err(fail(&e.field, e.problem))),
    };
    let Some(tls_settings) = &settings.tls else {
        return (
            digest.finalize().into(),
            Ok(Pending {
                settings,
                material: None,
            }),
        );
    };
    let named = |field: &str, p: &Path, digest: &mut Sha256| {
        let read = read_bounded(p);
        feed(digest, p, read.as_deref().map_err(|e| e.to_string()));
        read.map_err(|e| {
            fail(
                &format!("tls_server_config.{field}"),
                format!(
                    "{} cannot be read: {e}; check the path (relative to the file's directory) \
                     and that this user may read it",
                    p.display()
                ),
            )
        })
    };
    let cert = named("cert_file", &tls_settings.cert_file, &mut digest);
    let key = named("key_file", &tls_settings.key_file, &mut digest);
    let ca = tls_settings
        .client_ca_file
        .as_deref()
        .map(|p| named("client_ca_file", p, &mut digest));
    let digest: [u8; 32] = digest.finalize().into();
    match (cert, key, ca.transpose()) {
        (Ok(cert), Ok(key), Ok(client_ca)) => (
            digest,
            Ok(Pending {
                settings,
                material: Some(tls::Material {
                    cert,
                    key,
                    client_ca,
                    system_roots: Vec::new(),
                }),
            }),
        ),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => (digest, Err(e)),
    }
}

/// Adds one file's path and its bytes (or why it could not be read).
fn feed(digest: &mut Sha256, path: &Path, bytes: Result<&[u8], String>) {
    let path = path.as_os_str().as_encoded_bytes();
    digest.update((path.len() as u64).to_be_bytes());
    digest.update(path);
    match bytes {
        Ok(b) => {
            digest.update([1]);
            digest.update((b.len() as u64).to_be_bytes());
            digest.update(b);
        }
        Err(e) => {
            digest.update([0]);
            digest.update(e.as_bytes());
        }
    }
}

/// The file as the endpoint serves it: the version in force, re-read on
/// each `current`.
pub struct Watch {
    path: PathBuf,
    active: Arc<Active>,
    /// The digest of the last version that failed, so an unchanged bad
    /// file is neither rebuilt nor logged again.
    last_bad: Option<[u8; 32]>,
    logged: HashSet<String>,
}

/// What `Watch::current` found, for the caller to log.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    /// Nothing new (or a bad version already reported).
    None,
    /// A new good version is in force.
    Loaded,
    /// A bad version, reported for the first time; the last good one stays.
    Rejected(WebConfigError),
}

impl Watch {
    /// Starts from the version `load` returned for `path`.
    pub fn new(path: PathBuf, active: Active) -> Self {
        Self {
            path,
            active: Arc::new(active),
            last_bad: None,
            logged: HashSet::new(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the endpoint speaks TLS (fixed for the daemon's life).
    pub fn is_tls(&self) -> bool {
        self.active.tls.is_some()
    }

    /// Re-reads the files and returns the version to serve with what
    /// changed. Turning TLS on or off takes a restart: a version that would
    /// do either is refused, so the endpoint never drops to plain HTTP.
    pub fn current(&mut self) -> (Arc<Active>, Change) {
        let (digest, read) = read(&self.path);
        if digest == self.active.digest {
            // Back to the version in force after a rejected one: the repair
            // is said, and a later break is a new problem to report.
            let repaired = self.last_bad.take().is_some();
            self.logged.clear();
            let change = if repaired {
                Change::Loaded
            } else {
                Change::None
            };
            return (self.active.clone(), change);
        }
        if Some(digest) == self.last_bad {
            return (self.active.clone(), Change::None);
        }
        let outcome = read.and_then(|pending| {
            let next = pending.build(&self.path, digest)?;
            if next.tls.is_some() != self.active.tls.is_some() {
                return Err(WebConfigError {
                    file: self.path.display().to_string(),
                    field: "tls_server_config".into(),
                    problem: if next.tls.is_some() {
                        "TLS was off when the daemon started; turning it on takes a restart \
                         (serving on as before)"
                    } else {
                        "TLS was on when the daemon started; turning it off takes a restart \
                         (serving on with TLS)"
                    }
                    .into(),
                });
            }
            Ok(next)
        });
        match outcome {
            Ok(next) => {
                self.active = Arc::new(next);
                self.last_bad = None;
                self.logged.clear();
                (self.active.clone(), Change::Loaded)
            }
            Err(e) => {
                self.last_bad = Some(digest);
                if self.logged.len() >= REMEMBERED_PROBLEMS {
                    self.logged.clear();
                }
                let first = self.logged.insert(e.to_string());
                let change = if first {
                    Change::Rejected(e)
                } else {
                    Change::None
                };
                (self.active.clone(), change)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "$2y$04$abcdefghijklmnopqrstuuJm1Dm3MjfPW1l0nOmNFSMdHGhFu7q6a";

    /// A directory of its own for one test, removed when the test ends.
    struct Scratch(PathBuf);

    impl Scratch {
        fn file(&self) -> PathBuf {
            self.0.join("web.yml")
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn scratch(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "lease-sweeper-web-config-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    #[test]
    fn an_unreadable_file_names_itself() {
        let dir = scratch("missing");
        let path = dir.file();
        let e = load(&path).err().unwrap();
        assert_eq!(e.field, "(file)");
        assert!(e.to_string().contains(&path.display().to_string()));
        assert!(e.to_string().contains(FILE_VAR));
    }

    #[test]
    fn an_endless_file_is_refused_not_read_whole() {
        let dir = scratch("endless");
        let path = dir.file();
        std::fs::write(
            &path,
            "tls_server_config:\n  cert_file: /dev/zero\n  key_file: /dev/zero\n",
        )
        .unwrap();
        let e = load(&path).err().unwrap();
        assert_eq!(e.field, "tls_server_config.cert_file");
        assert!(e.problem.contains("larger than"), "{}", e.problem);
        let e = load(Path::new("/dev/zero")).err().unwrap();
        assert_eq!(e.field, "(file)");
    }

    #[test]
    fn a_missing_certificate_names_the_field_and_the_path() {
        let dir = scratch("nocert");
        let path = dir.file();
        std::fs::write(
            &path,
            "tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\n",
        )
        .unwrap();
        let e = load(&path).err().unwrap();
        assert_eq!(e.field, "tls_server_config.cert_file");
        assert!(e.problem.contains("c.pem"), "{}", e.problem);
    }

    #[test]
    fn a_bad_change_keeps_the_last_good_version_and_is_reported_once() {
        let dir = scratch("watch");
        let path = dir.file();
        std::fs::write(&path, format!("basic_auth_users:\n  alice: {HASH}\n")).unwrap();
        let mut watch = Watch::new(path.clone(), load(&path).unwrap());
        assert_eq!(watch.current().1, Change::None);
        std::fs::write(&path, "basic_auth_users:\n  alice: nope\n").unwrap();
        let (active, change) = watch.current();
        let Change::Rejected(e) = change else {
            panic!("not rejected: {change:?}")
        };
        assert_eq!(e.field, "basic_auth_users.alice");
        assert_eq!(active.users["alice"], HASH);
        assert_eq!(watch.current().1, Change::None);
        // Another bad version is a distinct problem; back to the first is not.
        std::fs::write(&path, "foo: 1\n").unwrap();
        assert!(matches!(watch.current().1, Change::Rejected(_)));
        std::fs::write(&path, "basic_auth_users:\n  alice: nope\n").unwrap();
        assert_eq!(watch.current().1, Change::None);
        std::fs::write(&path, "basic_auth_users: {}\n").unwrap();
        let (active, change) = watch.current();
        assert_eq!(change, Change::Loaded);
        assert!(active.users.is_empty());
    }

    #[test]
    fn a_break_after_a_repair_to_the_same_bytes_is_reported_again() {
        let dir = scratch("rebreak");
        let path = dir.file();
        let good = format!("basic_auth_users:\n  alice: {HASH}\n");
        std::fs::write(&path, &good).unwrap();
        let mut watch = Watch::new(path.clone(), load(&path).unwrap());
        std::fs::write(&path, "tls_server_config: [\n").unwrap();
        assert!(matches!(watch.current().1, Change::Rejected(_)));
        std::fs::write(&path, &good).unwrap();
        assert_eq!(watch.current().1, Change::Loaded, "the repair is said");
        assert_eq!(watch.current().1, Change::None);
        std::fs::write(&path, "tls_server_config: [\n").unwrap();
        assert!(matches!(watch.current().1, Change::Rejected(_)));
    }

    #[test]
    fn a_changed_certificate_or_key_is_a_new_version() {
        let dir = scratch("rotate");
        let path = dir.file();
        let testdata = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/output/web_config/testdata");
        let put = |name: &str, from: &str| {
            std::fs::copy(testdata.join(from), dir.0.join(name)).unwrap();
        };
        put("c.pem", "server.crt");
        put("k.pem", "server.key");
        std::fs::write(
            &path,
            "tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\n",
        )
        .unwrap();
        let mut watch = Watch::new(path.clone(), load(&path).unwrap());
        assert_eq!(watch.current().1, Change::None);
        // Half-way through a rotation: the old key with the new certificate.
        put("c.pem", "expired.crt");
        let (active, change) = watch.current();
        let Change::Rejected(e) = change else {
            panic!("not rejected: {change:?}")
        };
        assert_eq!(e.field, "tls_server_config.key_file");
        assert!(!active.expired, "the last good pair serves on");
        put("k.pem", "expired.key");
        let (active, change) = watch.current();
        assert_eq!(change, Change::Loaded);
        assert!(active.expired);
    }

    #[test]
    fn turning_tls_on_while_running_is_refused() {
        let dir = scratch("mode");
        let path = dir.file();
        std::fs::write(&path, "").unwrap();
        let mut watch = Watch::new(path.clone(), load(&path).unwrap());
        std::fs::write(
            &path,
            "tls_server_config:\n  cert_file: /nonexistent/c\n  key_file: /nonexistent/k\n",
        )
        .unwrap();
        let (active, change) = watch.current();
        assert!(active.tls.is_none());
        assert!(matches!(change, Change::Rejected(_)));
    }

    #[test]
    fn errors_never_carry_the_hash() {
        let dir = scratch("secret");
        let path = dir.file();
        let short = "$2y$10$tooshortbutsecret";
        std::fs::write(&path, format!("basic_auth_users:\n  alice: '{short}'\n")).unwrap();
        let e = load(&path).err().unwrap();
        assert!(!e.to_string().contains("tooshortbutsecret"), "{e}");
    }
}
