//! A real Prometheus (Debian's 2.42) and mtail on loopback for the tests
//! that prove the rules and the dashboard against live series: started on
//! ports the kernel picks, stopped and removed when dropped.

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

impl Prometheus {
    pub async fn start(targets: &[(&str, SocketAddr)]) -> Self {
        let prometheus = tool("prometheus", "prometheus");
        let dir = TempDir::new("prometheus");
        let mut config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n",
            repo()
                .join("deploy/prometheus/lease-sweeper.rules.yml")
                .display()
        );
        for (job, addr) in targets {
            config.push_str(&format!(
                "  - job_name: {job}\n    static_configs:\n      - targets: ['{addr}']\n"
            ));
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
}
