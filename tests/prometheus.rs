//! A real Prometheus (Debian's `prometheus` package) for the metrics scenarios: started
//! with a config of its own scraping one target, on loopback, storing in a temp folder;
//! queried through its HTTP API. Without the binary the scenarios FAIL (they do not skip):
//! `apt-get install -y prometheus` (`scripts/test.sh` does); the Debian service is not used.

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::http::{http_get, url_encode};
use crate::process::{run_bounded, Running};
use crate::scratch::temp_dir;
use crate::wait::wait_for;

const HINT: &str = "install Debian's prometheus package (apt-get install -y prometheus; scripts/test.sh does)";

/// A Prometheus scraping one target; killed (it was started here) when dropped.
pub struct Prometheus {
    child: Running,
    addr: SocketAddr,
    _dir: TempDir,
}

/// One series of a query's answer: its labels and value.
#[derive(Debug, Clone)]
pub struct Sample {
    /// The series' labels.
    pub labels: serde_json::Map<String, serde_json::Value>,
    /// Its value.
    pub value: f64,
}

impl Prometheus {
    /// Starts Prometheus scraping `http://target/metrics` every `every`, on a loopback
    /// port of the kernel's choosing (read from its `msg="Listening on"` log line), and
    /// waits (bounded) until it is ready.
    pub fn scraping(target: SocketAddr, every: Duration) -> Prometheus {
        let dir = temp_dir(&format!("prometheus-{target}").replace([':', '.'], "-"));
        let ms = every.as_millis();
        let config = format!(
            "global:\n  scrape_interval: {ms}ms\n  scrape_timeout: {ms}ms\n\
             scrape_configs:\n  - job_name: rollout\n    static_configs:\n      - targets: ['{target}']\n"
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).expect("write the Prometheus config");
        let end = Instant::now() + Duration::from_secs(60);
        let mut child = Running::spawn(
            Command::new("prometheus")
                .arg(format!("--config.file={}", config_path.display()))
                .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
                .arg("--web.listen-address=127.0.0.1:0")
                // Info: the level of the line naming the bound address.
                .arg("--log.level=info"),
        )
        .unwrap_or_else(|e| panic!("cannot start prometheus ({e}); {HINT}"));
        // `msg="Listening on" address=127.0.0.1:PORT`, the other fields in any order.
        let addr = child.wait_stderr("Prometheus' address", Duration::from_secs(60), |l| {
            if !l.contains(r#"msg="Listening on""#) {
                return None;
            }
            l.split_whitespace()
                .find_map(|f| f.strip_prefix("address="))?
                .parse()
                .ok()
        });
        let mut p = Prometheus { child, addr, _dir: dir };
        wait_for(end, "Prometheus ready", || {
            if let Some(st) = p.child.try_wait() {
                panic!("prometheus exited before it was ready ({st})");
            }
            http_get(addr, "/-/ready").ok().filter(|a| a.status == Some(200))
        });
        p
    }

    /// The answer to the instant query `expr` (now), or why it failed.
    pub fn query(&self, expr: &str) -> Result<Vec<Sample>, String> {
        let a = http_get(self.addr, &format!("/api/v1/query?query={}", url_encode(expr))).map_err(|e| e.to_string())?;
        if a.status != Some(200) {
            return Err(format!("status {:?}: {}", a.status, a.body));
        }
        let v: serde_json::Value = serde_json::from_str(&a.body).map_err(|e| format!("{e}: {}", a.body))?;
        let result = v["data"]["result"]
            .as_array()
            .ok_or_else(|| format!("no result: {v}"))?;
        result
            .iter()
            .map(|r| {
                let labels = r["metric"].as_object().cloned().unwrap_or_default();
                let value = r["value"][1]
                    .as_str()
                    .and_then(|s| s.parse::<f64>().ok())
                    .ok_or_else(|| format!("no value in {r}"))?;
                Ok(Sample { labels, value })
            })
            .collect()
    }

    /// The one value of `expr`, if it has exactly one series now.
    pub fn value(&self, expr: &str) -> Option<f64> {
        match self.query(expr) {
            Ok(s) if s.len() == 1 => Some(s[0].value),
            _ => None,
        }
    }
}

/// Fails (never skips) unless the `prometheus` binary runs.
pub fn require_prometheus() {
    match run_bounded(Command::new("prometheus").arg("--version"), Duration::from_secs(30)) {
        Ok(r) if r.status.is_some_and(|s| s.success()) => {}
        Ok(r) => panic!(
            "`prometheus --version` failed ({:?}): {}; {HINT}",
            r.status,
            r.stderr_text()
        ),
        Err(e) => panic!("cannot run `prometheus` ({e}); {HINT}"),
    }
}
