//! Capturing this process's log lines, so a test can check that a reason was logged.

use std::io::Write;
use std::net::TcpStream;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::wait::poll_until;

/// Every log line of this test process at `info` and above (nextest runs each test in a
/// process of its own; under `cargo test` the lines of the binary's other tests are here
/// too, so a test looks for lines that name something of its own run).
pub fn logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let w = buf.clone();
        let _ = tracing_subscriber::fmt()
            .with_env_filter("info")
            .with_ansi(false)
            .with_writer(move || LogWriter(w.clone()))
            .try_init();
        buf
    })
}

struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl Write for LogWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Every log line captured so far (see [`logs`]), as text.
pub fn log_text() -> String {
    String::from_utf8_lossy(&logs().lock().unwrap_or_else(|p| p.into_inner())).into_owned()
}

/// How long [`OwnLog::assert_logged`] waits for its line.
const LOG_DEADLINE: Duration = Duration::from_secs(30);

/// The log lines of one test's own run. Every test of a binary logs into the one capture
/// (`cargo test` runs them side by side in one process), so a line counts only if it came
/// after the [`OwnLog`] was made and holds `field` as a whole word: a `key=value` only
/// this test has, such as its node's name or its socket's address.
pub struct OwnLog {
    from: usize,
    field: String,
}

impl OwnLog {
    /// Lines about the node named `name` (make it with [`crate::unique_name`]).
    pub fn node(name: &str) -> OwnLog {
        OwnLog::with(format!("name={name}"))
    }

    /// Lines about the connection from `s`, as the trainer sees its peer.
    pub fn peer(s: &TcpStream) -> OwnLog {
        OwnLog::with(format!("peer={}", s.local_addr().expect("local addr")))
    }

    /// Lines holding `field` (a whole word, such as `key=value`), from now on.
    pub fn with(field: String) -> OwnLog {
        let from = logs().lock().unwrap_or_else(|p| p.into_inner()).len();
        OwnLog { from, field }
    }

    /// This test's lines so far.
    pub fn lines(&self) -> Vec<String> {
        let text = {
            let log = logs().lock().unwrap_or_else(|p| p.into_inner());
            String::from_utf8_lossy(log.get(self.from..).unwrap_or_default()).into_owned()
        };
        text.lines()
            .filter(|line| line.split_whitespace().any(|w| w == self.field))
            .map(str::to_string)
            .collect()
    }

    /// Waits (at most 30 s) until one of this test's lines holds `needle`; panics with
    /// this test's lines otherwise.
    pub fn assert_logged(&self, needle: &str) {
        let end = Instant::now() + LOG_DEADLINE;
        let logged = poll_until(end, || self.lines().iter().any(|l| l.contains(needle)).then_some(()));
        assert!(
            logged.is_some(),
            "`{needle}` was never logged with `{}` within {LOG_DEADLINE:?}; its lines:\n{}",
            self.field,
            self.lines().join("\n")
        );
    }
}
