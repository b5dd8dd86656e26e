//! A real Prometheus (Debian's 2.42) and mtail on loopback for the tests
//! that prove the rules and the dashboard against live series, and the
//! scrape jobs an operator writes for an endpoint behind TLS and basic auth:
//! started on ports the kernel picks, stopped and removed when dropped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::observability::support::request;
use crate::support::{TempDir, free_port, tool, wait_listening, wait_until};

/// The repository's root (rules, dashboard, mtail programs).
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A process killed (and reaped) on drop.
pub struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// mtail running the shipped programs over `log`, serving its counters.
pub struct Mtail {
    pub addr: SocketAddr,
    _process: Killed,
}

impl Mtail {
    pub async fn start(log: &Path) -> Self {
        let mtail = tool("mtail", "mtail");
        let port = free_port();
        let process = Command::new(mtail)
            .arg("--progs")
            .arg(repo().join("deploy/mtail"))
            .arg("--logs")
            .arg(log)
            .args(["--address", "127.0.0.1", "--port", &port.to_string()])
            .arg("--logtostderr")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting mtail");
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        wait_listening(port, "mtail").await;
        Self {
            addr,
            _process: Killed(process),
        }
    }
}

/// Prometheus scraping `targets` (job name, address) every second, with the
/// shipped rules loaded.
pub struct Prometheus {
    pub addr: SocketAddr,
    _process: Killed,
    _dir: TempDir,
}

/// One scrape job: plain HTTP, or HTTPS with Prometheus's own `tls_config`
/// (CA, client certificate, server name) and `basic_auth`, as an operator
/// would write it for an endpoint behind a web config file.
pub struct ScrapeJob {
    pub name: String,
    pub target: SocketAddr,
    https: Option<Https>,
    basic_auth: Option<(String, String)>,
}

struct Https {
    ca_file: PathBuf,
    server_name: String,
    client: Option<(PathBuf, PathBuf)>,
}

impl ScrapeJob {
    pub fn plain(name: &str, target: SocketAddr) -> Self {
        Self {
            name: name.to_owned(),
            target,
            https: None,
            basic_auth: None,
        }
    }

    /// `scheme: https`, trusting only `ca_file`, checking the served name
    /// against `server_name`.
    pub fn https(name: &str, target: SocketAddr, ca_file: &Path, server_name: &str) -> Self {
        Self {
            https: Some(Https {
                ca_file: ca_file.to_owned(),
                server_name: server_name.to_owned(),
                client: None,
            }),
            ..Self::plain(name, target)
        }
    }

    /// Presents this client certificate (`tls_config`'s cert_file/key_file).
    pub fn client_cert(mut self, cert: &Path, key: &Path) -> Self {
        let https = self
            .https
            .as_mut()
            .expect("a client certificate needs https");
        https.client = Some((cert.to_owned(), key.to_owned()));
        self
    }

    pub fn basic_auth(mut self, user: &str, password: &str) -> Self {
        self.basic_auth = Some((user.to_owned(), password.to_owned()));
        self
    }

    /// The job as an entry of `scrape_configs`.
    fn yaml(&self) -> String {
        let mut job = format!("  - job_name: {}\n", self.name);
        if let Some(https) = &self.https {
            job.push_str(&format!(
                "    scheme: https\n    tls_config:\n      ca_file: '{}'\n      server_name: '{}'\n",
                https.ca_file.display(),
                https.server_name
            ));
            if let Some((cert, key)) = &https.client {
                job.push_str(&format!(
                    "      cert_file: '{}'\n      key_file: '{}'\n",
                    cert.display(),
                    key.display()
                ));
            }
        }
        if let Some((user, password)) = &self.basic_auth {
            job.push_str(&format!(
                "    basic_auth:\n      username: '{user}'\n      password: '{password}'\n"
            ));
        }
        job.push_str(&format!(
            "    static_configs:\n      - targets: ['{}']\n",
            self.target
        ));
        job
    }
}

impl Prometheus {
    pub async fn start(targets: &[(&str, SocketAddr)]) -> Self {
        let jobs: Vec<ScrapeJob> = targets
            .iter()
            .map(|(job, addr)| ScrapeJob::plain(job, *addr))
            .collect();
        Self::start_jobs(&jobs).await
    }

    /// Prometheus scraping each of `jobs` every second.
    pub async fn start_jobs(jobs: &[ScrapeJob]) -> Self {
        let prometheus = tool("prometheus", "prometheus");
        let dir = TempDir::new("prometheus");
        let mut config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n",
            repo()
                .join("deploy/prometheus/lease-sweeper.rules.yml")
                .display()
        );
        for job in jobs {
            config.push_str(&job.yaml());
        }
        let config_file = dir.join("prometheus.yml");
        std::fs::write(&config_file, config).unwrap();
        let port = free_port();
        let process = Command::new(prometheus)
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
            .spawn()
            .expect("starting prometheus");
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let this = Self {
            addr,
            _process: Killed(process),
            _dir: dir,
        };
        wait_until(Duration::from_secs(30), "prometheus ready", || async {
            tokio::net::TcpStream::connect(addr).await.is_ok()
                && request(addr, b"GET /-/ready HTTP/1.0\r\n\r\n").await.0 == 200
        })
        .await;
        this
    }

    /// An instant query through the HTTP API; the whole JSON answer.
    pub async fn query(&self, expr: &str) -> serde_json::Value {
        let q: String = url::form_urlencoded::byte_serialize(expr.as_bytes()).collect();
        let (_, body) = request(
            self.addr,
            format!("GET /api/v1/query?query={q} HTTP/1.0\r\n\r\n").as_bytes(),
        )
        .await;
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{expr}: {e}: {body}"))
    }

    /// The single value of an instant query (a scalar, or a vector of one).
    pub async fn value(&self, expr: &str) -> Option<f64> {
        let answer = self.query(expr).await;
        let data = &answer["data"];
        let sample = match data["resultType"].as_str()? {
            "scalar" => &data["result"],
            "vector" if data["result"].as_array()?.len() == 1 => &data["result"][0]["value"],
            _ => return None,
        };
        sample[1].as_str()?.parse().ok()
    }

    /// What Prometheus last said about scraping `job` (its target's
    /// `lastError`; empty after a good scrape): why a target is down.
    pub async fn scrape_error(&self, job: &str) -> String {
        let (_, body) = request(
            self.addr,
            b"GET /api/v1/targets?state=active HTTP/1.0\r\n\r\n",
        )
        .await;
        let answer: serde_json::Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("targets: {e}: {body}"));
        answer["data"]["activeTargets"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|t| t["labels"]["job"] == job)
            .and_then(|t| t["lastError"].as_str())
            .unwrap_or("no such target")
            .to_owned()
    }
}
