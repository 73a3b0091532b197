//! The trainer's `/metrics` endpoint (issue 31): scraped by a real Prometheus while a
//! supervised run with external nodes goes on (a node killed with SIGKILL and replaced),
//! the values Prometheus holds agree exactly with the run's own summary and `--output`;
//! and the endpoint answers bad requests as designed while a run carries on.
//!
//! Without Debian's `prometheus` these tests FAIL (they do not skip): `scripts/test.sh`
//! installs it.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use rollout::PolicyConfig;
use rollout_actors::metrics::server::{CONNECTION_DEADLINE, MAX_CONNECTIONS, MAX_HEAD};
use rollout_actors::DistributedCollector;
use rollout_tests::{
    http_get, http_raw, read_output, require_prometheus, rollout_bin, temp_dir, wait_for, wait_with_deadline,
    Prometheus,
};

const TOKEN: &[u8] = b"metrics-test-token-0123456789abcdef";
const DEADLINE: Duration = Duration::from_secs(60);
/// Bound on the whole supervised CLI run on a loaded machine.
const RUN_DEADLINE: Duration = Duration::from_secs(300);
const TOTAL: u64 = 40_000;

fn token() -> &'static str {
    std::str::from_utf8(TOKEN).expect("utf8")
}

/// `rollout node --join ADDR --index I`, as an operator would start it.
fn node_process(addr: &str, index: usize) -> Child {
    Command::new(rollout_bin())
        .args(["node", "--join", addr, "--index", &index.to_string()])
        .env("ROLLOUT_TOKEN", token())
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn rollout node")
}

/// Kills (SIGKILL) and reaps every child still running: the test started them all.
struct Reaped(Vec<Child>);

impl Drop for Reaped {
    fn drop(&mut self) {
        for c in &mut self.0 {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }
}

/// The JSON object of a `--json` line holding `key`, read from `lines`.
fn json_line_with(lines: &mut impl Iterator<Item = std::io::Result<String>>, key: &str) -> serde_json::Value {
    for l in lines.map_while(Result::ok) {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&l) {
            if v.get(key).is_some() {
                return v;
            }
        }
    }
    panic!("the CLI's stdout ended before a line with {key:?}");
}

fn addr_of(v: &serde_json::Value, key: &str) -> String {
    v[key].as_str().unwrap_or_else(|| panic!("{key} in {v}")).to_string()
}

/// The last value of `metric` Prometheus scraped, over the run (the series is stale
/// once the trainer is gone, so an instant query of it would find nothing).
fn last(metric: &str) -> String {
    format!("last_over_time({metric}[10m])")
}

#[test]
fn prometheus_scrapes_a_supervised_external_run_with_exact_values() {
    require_prometheus();
    let dir = temp_dir("metrics-prometheus");
    let output = dir.path().join("batches.msgpack");
    let mut cli = Command::new(rollout_bin())
        .args([
            "collect",
            "--listen",
            "127.0.0.1:0",
            "--nodes",
            "2",
            "--env",
            "Counting",
            "--policy",
            "constant",
            "--frames-per-batch",
            "20",
            "--total-frames",
            &TOTAL.to_string(),
            "--seed",
            "3",
            "--node-max-restarts",
            "3",
            "--heartbeat",
            "0.2",
            "--heartbeat-timeout",
            "2",
            "--metrics",
            "127.0.0.1:0",
            "--metrics-linger",
            "60",
            "--json",
            "--quiet",
        ])
        .arg("--output")
        .arg(&output)
        .env("ROLLOUT_TOKEN", token())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rollout collect");
    let stderr = cli.stderr.take().expect("stderr");
    let err = thread::spawn(move || {
        let mut s = String::new();
        let _ = BufReader::new(stderr).read_to_string(&mut s);
        s
    });
    let mut lines = BufReader::new(cli.stdout.take().expect("stdout")).lines();
    let listening = addr_of(&json_line_with(&mut lines, "listening"), "listening");
    let mut nodes = Reaped(vec![node_process(&listening, 0), node_process(&listening, 1)]);
    let metrics: SocketAddr = addr_of(&json_line_with(&mut lines, "metrics"), "metrics")
        .parse()
        .expect("a socket address");
    // From here stdout is not read until node 1 was replaced: the CLI's `--json` lines
    // (2000 of ~55 bytes) outgrow the pipe's 64 KiB, so the run cannot end before that.
    let prom = Prometheus::scraping(metrics, Duration::from_millis(100));
    let end = Instant::now() + DEADLINE;
    wait_for(end, "a scraped batch of node 1", || {
        prom.value(r#"rollout_batches_total{node="1"}"#).filter(|&v| v > 0.0)
    });
    nodes.0[1].kill().expect("SIGKILL node 1");
    let _ = nodes.0[1].wait();
    wait_for(end, "node 1's restart, scraped", || {
        prom.value(r#"rollout_node_restarts_total{node="1"}"#)
            .filter(|&v| v == 1.0)
    });
    nodes.0.push(node_process(&listening, 1));
    // Now the rest of the run.
    let mut stdout = String::new();
    for l in lines.map_while(Result::ok) {
        stdout.push_str(&l);
        stdout.push('\n');
    }
    let status = wait_with_deadline(&mut cli, RUN_DEADLINE);
    if status.is_none() {
        let _ = cli.kill();
        let _ = cli.wait();
    }
    let stderr = err.join().unwrap_or_default();
    assert_eq!(status.and_then(|s| s.code()), Some(0), "stderr:\n{stderr}");
    let summary: serde_json::Value = stdout
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no summary line; stderr:\n{stderr}"));
    let frames = summary["frames"].as_u64().expect("summary frames");
    assert_eq!(frames, TOTAL, "the run's own summary");
    let records = read_output(&output);
    let mut per_node = BTreeMap::<usize, u64>::new();
    for r in &records {
        *per_node
            .entry(r.node.expect("async batches name their node"))
            .or_default() += 1;
    }
    assert_eq!(per_node.len(), 2, "both nodes delivered: {per_node:?}");

    // The final values: the trainer waited (--metrics-linger) for a scrape after its last batch.
    wait_for(Instant::now() + DEADLINE, "the final scrape", || {
        prom.value(&last("rollout_collected_frames"))
            .filter(|&v| v == frames as f64)
    });
    let sum = prom
        .value(&format!("sum({})", last("rollout_frames_total")))
        .expect("frames per node");
    assert_eq!(sum, frames as f64, "frames total exact");
    for (node, batches) in &per_node {
        let scraped = prom.value(&last(&format!(r#"rollout_batches_total{{node="{node}"}}"#)));
        assert_eq!(
            scraped,
            Some(*batches as f64),
            "batches of node {node}, as --output recorded"
        );
    }
    let restarts = |node: usize| prom.value(&last(&format!(r#"rollout_node_restarts_total{{node="{node}"}}"#)));
    assert_eq!(
        (restarts(0), restarts(1)),
        (Some(0.0), Some(1.0)),
        "one restart, of node 1"
    );
    let failed = prom.value(&last(r#"rollout_node_failures_total{node="1",reason="failed"}"#));
    assert_eq!(failed, Some(1.0), "node 1 failed once");
    assert_eq!(prom.value(&last("rollout_target_frames")), Some(TOTAL as f64));
    let build = prom.query(&last("rollout_build_info")).expect("build info");
    assert_eq!(build.len(), 1, "{build:?}");
    assert_eq!(build[0].value, 1.0);
    assert!(build[0].labels.contains_key("version"), "{build:?}");
    for c in &mut nodes.0 {
        assert!(wait_with_deadline(c, DEADLINE).is_some(), "a node outlived the run");
    }
}

/// Reads until the server closes the connection (`true`) or `within` passes (`false`).
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let end = Instant::now() + within;
    let mut buf = [0u8; 1024];
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        s.set_read_timeout(Some(left)).expect("read timeout");
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return false
            }
            Err(_) => return true,
        }
    }
}

/// The run yields its next batch: it carries on.
fn carries_on(c: &mut DistributedCollector) {
    let b = c.next_batch().expect("a batch").expect("an endless run");
    assert!(b.data.numel() > 0);
}

#[test]
fn the_endpoint_answers_only_get_metrics_bounds_heads_and_connections_and_cuts_silent_clients() {
    let mut c = DistributedCollector::builder()
        .env("Counting")
        .policy(PolicyConfig::Constant { value: 1.0 })
        .nodes(2)
        .frames_per_batch(20)
        .endless()
        .seed(5)
        .metrics("127.0.0.1:0")
        .build()
        .expect("collector");
    let addr = c.metrics_addr().expect("metrics served");
    carries_on(&mut c);

    let ok = http_get(addr, "/metrics").expect("GET /metrics");
    assert_eq!(ok.status, Some(200), "{ok:?}");
    assert!(ok.body.contains("rollout_frames_total{node=\"0\"}"), "{}", ok.body);
    assert!(
        ok.body.trim_end().ends_with("# EOF"),
        "OpenMetrics text ends with # EOF"
    );

    let other = http_get(addr, "/").expect("GET /");
    assert_eq!(other.status, Some(404));
    let other = http_get(addr, "/metrics/x").expect("GET /metrics/x");
    assert_eq!(other.status, Some(404));
    for method in ["POST", "PUT", "DELETE"] {
        let req = format!("{method} /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
        let a = http_raw(addr, req.as_bytes(), Duration::from_secs(10)).expect(method);
        assert_eq!(a.status, Some(405), "{method}: {a:?}");
    }
    carries_on(&mut c);

    // A head over the bound is refused, not read on.
    let mut big = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: ".to_vec();
    big.resize(big.len() + 4 * MAX_HEAD, b'a');
    big.extend_from_slice(b"\r\n\r\n");
    let a = http_raw(addr, &big, Duration::from_secs(10)).expect("oversized head");
    assert_eq!(a.status, Some(431), "{a:?}");
    carries_on(&mut c);

    // A client that sends nothing is cut at the deadline; meanwhile scrapes are served.
    let started = Instant::now();
    let mut silent = TcpStream::connect(addr).expect("connect");
    assert_eq!(http_get(addr, "/metrics").expect("scrape").status, Some(200));
    assert!(
        closed_within(&mut silent, CONNECTION_DEADLINE + Duration::from_secs(10)),
        "a silent client was not cut"
    );
    assert!(started.elapsed() >= CONNECTION_DEADLINE - Duration::from_millis(100));
    // One that sends half a head does not fare better.
    let mut slow = TcpStream::connect(addr).expect("connect");
    slow.write_all(b"GET /metr").expect("write");
    assert!(
        closed_within(&mut slow, CONNECTION_DEADLINE + Duration::from_secs(10)),
        "a slow client was not cut"
    );
    carries_on(&mut c);

    // Connections past the bound are closed as they arrive; the held ones are cut in time
    // and scrapes are served again.
    let mut held: Vec<TcpStream> = (0..MAX_CONNECTIONS)
        .map(|_| TcpStream::connect(addr).expect("connect"))
        .collect();
    let mut extra = TcpStream::connect(addr).expect("connect");
    assert!(
        closed_within(&mut extra, CONNECTION_DEADLINE / 2),
        "a connection past {MAX_CONNECTIONS} was held"
    );
    for s in &mut held {
        assert!(
            closed_within(s, CONNECTION_DEADLINE + Duration::from_secs(10)),
            "a held connection was not cut"
        );
    }
    let again = wait_for(Instant::now() + DEADLINE, "a scrape served again", || {
        http_get(addr, "/metrics").ok().filter(|a| a.status == Some(200))
    });
    assert!(again.body.contains("rollout_batches_total"));
    carries_on(&mut c);
    c.shutdown().expect("shutdown");
}
