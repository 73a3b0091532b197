//! Child processes, always bounded by a deadline, and the `rollout` binary they run.

use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use crate::wait::poll_until;

const BUILD_TIMEOUT: Duration = Duration::from_secs(600);

/// Waits for `child` at most `timeout`, killing it on expiry. Returns `None` on a timeout.
pub fn wait_with_deadline(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let status = poll_until(Instant::now() + timeout, || child.try_wait().expect("try_wait"));
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    status
}

/// What a child run by [`run_bounded`] left behind.
#[derive(Debug)]
pub struct Finished {
    /// How it exited; `None` when it ran past the deadline and was killed.
    pub status: Option<ExitStatus>,
    /// All it wrote to stdout.
    pub stdout: Vec<u8>,
    /// All it wrote to stderr.
    pub stderr: Vec<u8>,
}

impl Finished {
    /// Its exit code; `None` when killed (by the deadline or a signal).
    pub fn code(&self) -> Option<i32> {
        self.status.and_then(|s| s.code())
    }

    /// Its stdout as text (invalid UTF-8 replaced).
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// Its stderr as text (invalid UTF-8 replaced).
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }

    /// Panics unless it exited 0, naming it (`what`) and showing its status and stderr.
    pub fn assert_success(&self, what: &str) {
        assert_eq!(
            self.code(),
            Some(0),
            "{what} failed ({:?}):\n{}",
            self.status,
            self.stderr_text()
        );
    }
}

/// Runs `cmd` with stdin closed and stdout and stderr captured, for at most `timeout`
/// (then it is killed: see [`Finished::status`]). Both pipes are read on threads of their
/// own while it runs, so a child that writes more than a pipe holds cannot stall.
/// Errs when it cannot be started.
pub fn run_bounded(cmd: &mut Command, timeout: Duration) -> std::io::Result<Finished> {
    Ok(Running::spawn(cmd)?.finish(timeout))
}

/// A child whose stdout and stderr are read on threads of their own while it runs (it
/// cannot stall on a full pipe), so a test can wait for a line it writes, such as the
/// address it bound, and still have everything it wrote once it ends. Killed and reaped
/// when dropped unfinished.
pub struct Running {
    child: Child,
    stdout: Captured,
    stderr: Captured,
}

/// One pipe of a [`Running`] child: what came so far, and its reader.
struct Captured {
    bytes: Arc<Mutex<Vec<u8>>>,
    reader: Option<thread::JoinHandle<()>>,
}

impl Captured {
    fn read(r: Option<impl Read + Send + 'static>) -> Captured {
        let bytes = Arc::new(Mutex::new(Vec::new()));
        let into = bytes.clone();
        let reader = thread::spawn(move || {
            let Some(mut r) = r else { return };
            let mut chunk = [0u8; 8192];
            while let Ok(n) = r.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                into.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend_from_slice(&chunk[..n]);
            }
        });
        Captured {
            bytes,
            reader: Some(reader),
        }
    }

    /// What came so far.
    fn so_far(&self) -> Vec<u8> {
        self.bytes.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Everything, once the pipe is closed (the child and whatever inherited it exited).
    fn all(&mut self) -> Vec<u8> {
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        self.so_far()
    }
}

impl Running {
    /// Starts `cmd` with stdin closed and stdout and stderr captured. Errs when it cannot
    /// be started.
    pub fn spawn(cmd: &mut Command) -> std::io::Result<Running> {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let stdout = Captured::read(child.stdout.take());
        let stderr = Captured::read(child.stderr.take());
        Ok(Running { child, stdout, stderr })
    }

    /// How it exited, if it did.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("try_wait")
    }

    /// Its stderr so far, as text (invalid UTF-8 replaced).
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr.so_far()).into_owned()
    }

    /// The first whole line of its stderr of which `found` makes something, waited for
    /// at most `timeout`; panics naming `what`, with its stderr, past the deadline or
    /// when it exits without writing one.
    pub fn wait_stderr<T>(&mut self, what: &str, timeout: Duration, found: impl FnMut(&str) -> Option<T>) -> T {
        self.wait_line(false, what, timeout, found)
    }

    /// [`Self::wait_stderr`] for a line of its stdout (`rollout collect --json`'s batch
    /// lines, say); panics with its stderr.
    pub fn wait_stdout<T>(&mut self, what: &str, timeout: Duration, found: impl FnMut(&str) -> Option<T>) -> T {
        self.wait_line(true, what, timeout, found)
    }

    /// The first whole line of stdout (`stdout`) or stderr that `found` makes something of.
    fn wait_line<T>(
        &mut self,
        stdout: bool,
        what: &str,
        timeout: Duration,
        mut found: impl FnMut(&str) -> Option<T>,
    ) -> T {
        let mut look = |bytes: &[u8]| {
            let text = String::from_utf8_lossy(bytes);
            // Only whole lines: the end of a line being written is not read as all of it.
            let whole = text.rfind('\n').map_or("", |end| &text[..end]);
            whole.lines().find_map(&mut found)
        };
        let seen = poll_until(Instant::now() + timeout, || {
            let pipe = if stdout { &self.stdout } else { &self.stderr };
            if let Some(v) = look(&pipe.so_far()) {
                return Some(Ok(v));
            }
            // Exited: its last words are in once the pipe is closed.
            let status = self.try_wait()?;
            let pipe = if stdout { &mut self.stdout } else { &mut self.stderr };
            Some(look(&pipe.all()).ok_or(status))
        });
        match seen {
            Some(Ok(v)) => v,
            Some(Err(status)) => panic!("exited ({status}) before {what}; stderr:\n{}", self.stderr_text()),
            None => panic!("no {what} within {timeout:?}; stderr:\n{}", self.stderr_text()),
        }
    }

    /// Its process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The address of its `listening on ADDR` line on stderr, which `rollout collect
    /// --launcher external` writes once its join socket is bound (see docs/cli.md):
    /// with `--listen HOST:0`, the port the kernel picked. Waited for at most `timeout`.
    pub fn listening_addr(&mut self, timeout: Duration) -> SocketAddr {
        self.wait_stderr("a `listening on ADDR` line", timeout, |l| {
            l.strip_prefix("listening on ")?.trim().parse().ok()
        })
    }

    /// Waits for it at most `timeout` (then kills it: see [`Finished::status`]) and
    /// returns all it wrote.
    pub fn finish(mut self, timeout: Duration) -> Finished {
        let status = wait_with_deadline(&mut self.child, timeout);
        Finished {
            status,
            stdout: self.stdout.all(),
            stderr: self.stderr.all(),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Sends signal `sig` (as `kill` names it: `TERM`, `KILL`, ...) to process `pid`; panics
/// when `kill` fails.
pub fn signal(pid: u32, sig: &str) {
    let st = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(st.success(), "kill -{sig} {pid}");
}

/// Sends signal `sig` (as `kill` names it) to every process of process group `pgid`, as
/// a terminal sends Ctrl-C's SIGINT to its foreground group; panics when `kill` fails.
pub fn signal_group(pgid: u32, sig: &str) {
    let st = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg("--")
        .arg(format!("-{pgid}"))
        .status()
        .expect("run kill");
    assert!(st.success(), "kill -{sig} -- -{pgid}");
}

/// The process group of process `pid` (field 5 of its `/proc` stat), `None` once it is gone.
pub fn process_group(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name, which may hold spaces: state, ppid, pgrp.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    rest.split(' ').nth(2)?.parse().ok()
}

/// Whether process `pid` still runs: it exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

/// Builds the `rollout` binary with cargo `profile` into this test's target dir and returns
/// its path. Bounded by a deadline; panics with cargo's output if the build fails.
fn build_rollout(profile: &str) -> PathBuf {
    build_binary(profile, &["-p", "rollout-cli", "--bin", "rollout"], "rollout", None)
}

/// Builds with cargo `profile`, into this test's target dir, what `what` names (`-p PKG
/// --bin NAME` or `--example NAME`), and returns the path of binary `name` (under `sub`
/// of the profile's dir, e.g. `examples`). Bounded by a deadline; panics with cargo's
/// output if the build fails.
fn build_binary(profile: &str, what: &[&str], name: &str, sub: Option<&str>) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe.parent().and_then(Path::parent).expect("<target>/<profile>/deps/");
    let target_dir = profile_dir.parent().expect("<target>/");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let log_path = target_dir.join(format!("{name}-{profile}-build-{}.log", std::process::id()));
    let log = std::fs::File::create(&log_path).expect("create the build log");
    let mut child = Command::new(cargo)
        .args(["build", "--quiet"])
        .args(what)
        .args(["--profile", profile])
        .arg("--manifest-path")
        .arg(&manifest)
        .env("CARGO_TARGET_DIR", target_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn cargo build");
    let status = wait_with_deadline(&mut child, BUILD_TIMEOUT);
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let _ = std::fs::remove_file(&log_path);
    match status {
        Some(s) if s.success() => {}
        Some(s) => panic!("cargo build --profile {profile} of `{name}` failed ({s}):\n{log}"),
        None => panic!("cargo build --profile {profile} of `{name}` took longer than {BUILD_TIMEOUT:?}:\n{log}"),
    }
    let dir = if profile == "dev" { "debug" } else { profile };
    let mut bin = target_dir.join(dir);
    if let Some(sub) = sub {
        bin = bin.join(sub);
    }
    let bin = bin.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(bin.exists(), "{} missing after the build", bin.display());
    bin
}

/// This test's own cargo profile, from the test executable's path
/// (`<target>/<profile>/deps/<test>-<hash>`; the `debug` folder is the `dev` profile).
fn own_profile() -> &'static str {
    static PROFILE: OnceLock<String> = OnceLock::new();
    PROFILE.get_or_init(|| {
        let exe = std::env::current_exe().expect("current_exe");
        let profile_dir = exe.parent().and_then(Path::parent).expect("<target>/<profile>/deps/");
        match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") => "dev".to_string(),
            Some(other) => other.to_string(),
            None => panic!("cannot tell the profile from {}", exe.display()),
        }
    })
}

/// The `rollout` binary of this test's own profile, built once per test process.
///
/// `cargo test` builds the binaries of the package under test only, and `rollout` belongs to
/// `rollout-cli`, so the first test to need it runs `cargo build -p rollout-cli --bin rollout`
/// with this test's own target dir and profile (derived from the test executable's path,
/// `<target>/<profile>/deps/<test>-<hash>`).
pub fn rollout_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build_rollout(own_profile()))
}

/// Example `name` of the `rollout-actors` package (a program of actors/examples/), built
/// once per test process with this test's own profile, as [`rollout_bin`] builds `rollout`.
pub fn actors_example_bin(name: &'static str) -> PathBuf {
    static BINS: std::sync::Mutex<Vec<(&'static str, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let mut bins = BINS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, p)) = bins.iter().find(|(n, _)| *n == name) {
        return p.clone();
    }
    let p = build_binary(
        own_profile(),
        &["-p", "rollout-actors", "--example", name],
        name,
        Some("examples"),
    );
    bins.push((name, p.clone()));
    p
}

/// The `rollout` binary built with the `release` profile, once per test process, in this
/// test's target dir (for scenarios too slow for a debug build, such as training to a target).
pub fn rollout_release_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build_rollout("release"))
}

/// The processes `pid` started (every thread's children), as /proc lists them now.
pub fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        if let Ok(s) = std::fs::read_to_string(t.path().join("children")) {
            out.extend(s.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
        }
    }
    out
}

/// Which of `pids` is the node process started with `--index index`.
pub fn node_with_index(pids: &[u32], index: usize) -> Option<u32> {
    let want = index.to_string();
    pids.iter().copied().find(|pid| {
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
        args.windows(2).any(|w| w[0] == b"--index" && w[1] == want.as_bytes())
    })
}
