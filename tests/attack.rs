//! A real trainer under attack: `rollout collect --launcher external --listen
//! 127.0.0.1:0 --json` and two real `rollout node` processes, with raw sockets for
//! the attacker. What the hostile-peer suite (`tests/tests/hostile_login.rs`) asserts
//! with: the run's end (exit, summary, frames), the trainer's peak RSS (VmHWM, sampled
//! while it lives), its stderr, and what an attacker's connection got and when.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::certs::{test_certs, TestCerts};
use crate::process::{rollout_bin, wait_with_deadline};
use crate::scratch::temp_dir;
use crate::tls_front::TlsFront;
use crate::wait::poll_until;

/// The shared token of the legitimate nodes (long enough for the trainer).
pub const ATTACK_TOKEN: &str = "hostile-suite-token-0123456789";

/// How the trainer under attack runs.
#[derive(Clone, Debug)]
pub struct TrainerSetup {
    /// `--total-frames`.
    pub total_frames: u64,
    /// `--frames-per-batch`.
    pub frames_per_batch: u64,
    /// Run the trainer under `prlimit --nofile=N:N` (its file descriptors capped).
    pub nofile: Option<u32>,
    /// The trainer's links over TLS (`--tls-cert`/`--tls-key`; its nodes `--tls-ca`),
    /// the attacks through a [`TlsFront`]: raw bytes inside a finished TLS handshake.
    pub tls: bool,
}

impl Default for TrainerSetup {
    fn default() -> Self {
        TrainerSetup {
            total_frames: 40_000,
            frames_per_batch: 500,
            nofile: None,
            tls: false,
        }
    }
}

/// A running trainer process and what it wrote so far.
pub struct AttackedTrainer {
    child: Child,
    addr: SocketAddr,
    setup: TrainerSetup,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    peak_kib: Arc<AtomicU64>,
    sampling: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    dir: tempfile::TempDir,
    /// Under TLS: the certificates, and the front attackers connect through.
    tls: Option<(TestCerts, TlsFront)>,
}

/// How a run under attack ended.
#[derive(Debug)]
pub struct RunEnd {
    /// The trainer's exit code (`None`: killed at the deadline).
    pub code: Option<i32>,
    /// The last `--json` line when it is the summary (has `fps`).
    pub summary: Option<serde_json::Value>,
    /// Frames of every batch line.
    pub batch_frames: u64,
    /// Everything the trainer wrote to stderr.
    pub stderr: String,
    /// Its peak RSS (VmHWM), KiB, as last read while it ran.
    pub peak_kib: u64,
    /// The nodes' exit codes.
    pub nodes: Vec<Option<i32>>,
}

/// The VmHWM of process `pid` in KiB; `None` once it is gone.
pub fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

impl AttackedTrainer {
    /// Starts the trainer (2 nodes, CartPole, MLP policy) and waits for its
    /// `{"listening": ADDR}` line, which must be the first on stdout.
    pub fn start(name: &str, setup: TrainerSetup) -> AttackedTrainer {
        let dir = temp_dir(&format!("attack-{name}"));
        let token = dir.path().join("token");
        write_private(&token, ATTACK_TOKEN);
        let mut cmd = match setup.nofile {
            Some(n) => {
                let mut c = Command::new("prlimit");
                c.arg(format!("--nofile={n}:{n}")).arg("--").arg(rollout_bin());
                c
            }
            None => Command::new(rollout_bin()),
        };
        cmd.args(["collect", "--launcher", "external", "--listen", "127.0.0.1:0", "--json"])
            .args(["--nodes", "2", "--env", "CartPole-v1", "--policy", "mlp", "--seed", "7"])
            .arg("--frames-per-batch")
            .arg(setup.frames_per_batch.to_string())
            .arg("--total-frames")
            .arg(setup.total_frames.to_string())
            .arg("--token-file")
            .arg(&token)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let certs = setup.tls.then(test_certs);
        if let Some(c) = &certs {
            cmd.arg("--tls-cert")
                .arg(&c.trainer_cert)
                .arg("--tls-key")
                .arg(&c.trainer_key);
        }
        let mut child = cmd.spawn().expect("start the trainer");
        let pid = child.id();
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let peak_kib = Arc::new(AtomicU64::new(0));
        let sampling = Arc::new(AtomicBool::new(true));
        let out = child.stdout.take().expect("stdout");
        let err = child.stderr.take().expect("stderr");
        let mut threads = Vec::new();
        {
            let lines = stdout.clone();
            threads.push(thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    lines.lock().expect("lines").push(line);
                }
            }));
        }
        {
            let buf = stderr.clone();
            threads.push(thread::spawn(move || {
                let mut err = err;
                let mut chunk = [0u8; 8192];
                while let Ok(n) = err.read(&mut chunk) {
                    if n == 0 {
                        break;
                    }
                    buf.lock().expect("stderr").extend_from_slice(&chunk[..n]);
                }
            }));
        }
        {
            let (peak, on) = (peak_kib.clone(), sampling.clone());
            threads.push(thread::spawn(move || {
                // VmHWM only grows: the last read before the process ends is its peak.
                while on.load(Ordering::Relaxed) {
                    match vm_hwm_kib(pid) {
                        Some(k) => peak.fetch_max(k, Ordering::Relaxed),
                        None => break,
                    };
                    thread::sleep(Duration::from_millis(20));
                }
            }));
        }
        let mut t = AttackedTrainer {
            child,
            addr: "127.0.0.1:1".parse().expect("addr"),
            setup,
            stdout,
            stderr,
            peak_kib,
            sampling,
            threads,
            dir,
            tls: None,
        };
        let first = t
            .wait_line(|_| true, Duration::from_secs(120))
            .unwrap_or_else(|| panic!("no listening line; stderr: {}", t.stderr_text()));
        let v: serde_json::Value = serde_json::from_str(&first).expect("the first stdout line is JSON");
        t.addr = v["listening"]
            .as_str()
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("the first JSON line is not {{\"listening\": ADDR}}: {first}"));
        t.tls = certs.map(|c| {
            let front = TlsFront::start(t.addr, &c.ca);
            (c, front)
        });
        t
    }

    /// Where attackers connect: the trainer's port, or under TLS the [`TlsFront`] to it.
    pub fn addr(&self) -> SocketAddr {
        match &self.tls {
            Some((_, front)) => front.addr(),
            None => self.addr,
        }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its peak RSS so far, KiB.
    pub fn peak_kib(&self) -> u64 {
        self.peak_kib.load(Ordering::Relaxed)
    }

    /// Starts a legitimate `rollout node` joining it.
    pub fn start_node(&self) -> Child {
        let mut cmd = Command::new(rollout_bin());
        cmd.args(["node", "--join", &self.addr.to_string(), "--token-file"])
            .arg(self.dir.path().join("token"));
        if let Some((c, _)) = &self.tls {
            cmd.arg("--tls-ca").arg(&c.ca);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start a node")
    }

    /// What it wrote to stderr so far.
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().expect("stderr")).into_owned()
    }

    /// Waits (at most `timeout`) for a stdout line `pred` accepts.
    pub fn wait_line(&self, pred: impl Fn(&str) -> bool, timeout: Duration) -> Option<String> {
        poll_until(Instant::now() + timeout, || {
            self.stdout.lock().expect("lines").iter().find(|l| pred(l)).cloned()
        })
    }

    /// Waits (at most `timeout`) for `needle` on stderr.
    pub fn wait_stderr(&self, needle: &str, timeout: Duration) -> bool {
        poll_until(Instant::now() + timeout, || {
            self.stderr_text().contains(needle).then_some(())
        })
        .is_some()
    }

    /// Waits for the first batch line: the run is on.
    pub fn wait_running(&self) {
        let started = self.wait_line(|l| l.contains("\"batch\""), Duration::from_secs(120));
        assert!(
            started.is_some(),
            "the run did not start; stderr: {}",
            self.stderr_text()
        );
    }

    /// Waits (bounded) for the trainer and `nodes` to exit, and collects the end.
    pub fn finish(mut self, nodes: Vec<Child>) -> RunEnd {
        let status = wait_with_deadline(&mut self.child, Duration::from_secs(180));
        let nodes = nodes
            .into_iter()
            .map(|mut n| wait_with_deadline(&mut n, Duration::from_secs(30)).and_then(|s| s.code()))
            .collect();
        self.sampling.store(false, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let lines = self.stdout.lock().expect("lines").clone();
        let batch_frames = lines
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v.get("batch").is_some())
            .filter_map(|v| v["frames"].as_u64())
            .sum();
        let summary = lines
            .last()
            .and_then(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v.get("fps").is_some());
        RunEnd {
            code: status.and_then(|s| s.code()),
            summary,
            batch_frames,
            stderr: self.stderr_text(),
            peak_kib: self.peak_kib(),
            nodes,
        }
    }

    /// The setup it runs with.
    pub fn setup(&self) -> &TrainerSetup {
        &self.setup
    }
}

impl RunEnd {
    /// Asserts the legitimate run ended exact: exit 0, its summary with every frame,
    /// the batches adding up, both nodes exited 0.
    pub fn assert_exact(&self, total_frames: u64) {
        assert_eq!(self.code, Some(0), "trainer exit; stderr:\n{}", self.stderr);
        let summary = self
            .summary
            .as_ref()
            .unwrap_or_else(|| panic!("no summary line; stderr:\n{}", self.stderr));
        assert_eq!(summary["frames"].as_u64(), Some(total_frames), "{summary}");
        assert_eq!(self.batch_frames, total_frames);
        assert!(self.nodes.iter().all(|c| *c == Some(0)), "nodes: {:?}", self.nodes);
        assert!(
            !self.stderr.contains("heartbeat timeout"),
            "a legitimate node timed out:\n{}",
            self.stderr
        );
    }
}

fn write_private(path: &std::path::Path, text: &str) {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .expect("token file");
    f.write_all(text.as_bytes()).expect("write the token");
}

/// A frame: the body with its `u32` big-endian length.
pub fn framed(body: &[u8]) -> Vec<u8> {
    let mut f = (body.len() as u32).to_be_bytes().to_vec();
    f.extend_from_slice(body);
    f
}

/// MessagePack of a short string (< 32 bytes).
pub fn fixstr(s: &str) -> Vec<u8> {
    assert!(s.len() < 32);
    let mut v = vec![0xa0 | s.len() as u8];
    v.extend_from_slice(s.as_bytes());
    v
}

/// A valid `hello` body for protocol `version` (map of 3: type, protocol_version, node_name).
pub fn hello_body(version: u8) -> Vec<u8> {
    let mut b = vec![0x83];
    b.extend(fixstr("type"));
    b.extend(fixstr("hello"));
    b.extend(fixstr("protocol_version"));
    b.push(version);
    b.extend(fixstr("node_name"));
    b.extend(fixstr("attacker"));
    b
}

/// What an attacker's connection got once the trainer closed it.
#[derive(Debug)]
pub struct Closed {
    /// Time from the call until the end of the stream (EOF or reset).
    pub after: Duration,
    /// Every byte received.
    pub got: Vec<u8>,
}

impl Closed {
    /// The `reason` of the `reject` frame received, if one was.
    pub fn reject_reason(&self) -> Option<String> {
        #[derive(serde::Deserialize)]
        struct Reject {
            r#type: String,
            reason: String,
        }
        let body = self.got.get(4..)?;
        let r: Reject = rmp_serde::from_slice(body).ok()?;
        (r.r#type == "reject").then_some(r.reason)
    }
}

/// Reads `s` until the trainer closes it; panics if it is still open after `bound`.
pub fn wait_closed(s: &mut TcpStream, bound: Duration) -> Closed {
    let start = Instant::now();
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let left = bound.checked_sub(start.elapsed()).unwrap_or_default();
        assert!(
            !left.is_zero(),
            "the connection is still open after {bound:?}; got {} bytes",
            got.len()
        );
        s.set_read_timeout(Some(left)).expect("read timeout");
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                panic!("the connection is still open after {bound:?}; got {} bytes", got.len())
            }
            Err(_) => break,
        }
    }
    Closed {
        after: start.elapsed(),
        got,
    }
}

/// Connects to the trainer.
pub fn attacker(addr: SocketAddr) -> TcpStream {
    TcpStream::connect_timeout(&addr, Duration::from_secs(10)).expect("connect")
}

/// Sends `bytes` (a write the trainer cut short by closing is fine: that is a refusal).
pub fn send_all(s: &mut TcpStream, bytes: &[u8]) {
    let _ = s.write_all(bytes);
}
