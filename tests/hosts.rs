//! Test hosts: network namespaces on one bridge, made by `scripts/hosts.sh` and removed
//! when the [`Hosts`] guard drops (a failing test included), with the script's faults
//! (cut off, slow link, packet loss) and its SLURM cluster across the hosts.
//!
//! Host `i` is the namespace `rollout-h<i>` at `10.77.0.<i+1>`; the addresses exist only
//! inside those namespaces. Needs root, `ip`, `nft` and `tc` (`scripts/test.sh` installs
//! them): without them the guard's constructor panics saying so, it never skips.
//!
//! The names and addresses are fixed, so one set of hosts exists at a time: the guard
//! holds a lock of the whole process ([`HostsTurn`]) from before `up` to after `down`,
//! and tests that `cargo test` runs side by side on threads take their turns.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use crate::process::{run_bounded, wait_with_deadline, Finished};
use crate::wait::poll_until;

/// How long one `scripts/hosts.sh` command may take.
const SCRIPT_DEADLINE: Duration = Duration::from_secs(60);

/// The SLURM configuration of the cluster across the hosts (`hosts.sh slurm-up`).
pub const HOSTS_SLURM_CONF: &str = "/run/rollout-hosts/slurm.conf";

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/hosts.sh")
}

/// Runs `scripts/hosts.sh ARGS` (bounded); panics with its output unless it succeeds.
pub fn hosts_sh(args: &[&str]) -> String {
    let run = run_bounded(Command::new("bash").arg(script()).args(args), SCRIPT_DEADLINE)
        .unwrap_or_else(|e| panic!("cannot run scripts/hosts.sh: {e}"));
    assert!(
        run.code() == Some(0),
        "scripts/hosts.sh {args:?} failed ({:?}):\n{}{}",
        run.status,
        run.stdout_text(),
        run.stderr_text()
    );
    run.stdout_text()
}

/// This process's turn with the test hosts: while it lives no other test of the process
/// makes, changes or removes them.
pub struct HostsTurn {
    _held: MutexGuard<'static, ()>,
}

impl HostsTurn {
    /// Waits for the turn (a test that failed during its own turn does not stop the next).
    pub fn take() -> HostsTurn {
        static HOSTS: Mutex<()> = Mutex::new(());
        HostsTurn {
            _held: HOSTS.lock().unwrap_or_else(|p| p.into_inner()),
        }
    }
}

/// `n` test hosts, up while this lives: dropped (also when a test panics), every host,
/// every process left in them and the SLURM cluster across them are removed, and only
/// then the turn ends.
pub struct Hosts {
    n: usize,
    turn: Option<HostsTurn>,
}

impl Hosts {
    /// Waits for this process's turn ([`HostsTurn`]), removes whatever an earlier run
    /// left, then makes `n` hosts. Panics (naming what is missing) when not root or when
    /// `ip`, `nft` or `tc` is missing.
    pub fn up(n: usize) -> Hosts {
        Hosts::up_in(HostsTurn::take(), n)
    }

    /// [`Hosts::up`] in a turn already taken (to look at the machine before the hosts).
    pub fn up_in(turn: HostsTurn, n: usize) -> Hosts {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(
            unsafe { libc::geteuid() },
            0,
            "the test hosts are network namespaces: run as root (CI does)"
        );
        hosts_sh(&["down"]);
        let hosts = Hosts { n, turn: Some(turn) };
        hosts_sh(&["up", &n.to_string()]);
        hosts
    }

    /// Removes the hosts now and keeps the turn, for a test that checks what is left
    /// after them.
    pub fn down(mut self) -> HostsTurn {
        let turn = self.turn.take().expect("the turn is held until the hosts are dropped");
        drop(self);
        turn
    }

    /// How many hosts.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Host `i`'s namespace name.
    pub fn ns(&self, i: usize) -> String {
        assert!(i < self.n, "host {i} of {}", self.n);
        format!("rollout-h{i}")
    }

    /// Host `i`'s address.
    pub fn addr(&self, i: usize) -> String {
        assert!(i < self.n, "host {i} of {}", self.n);
        format!("10.77.0.{}", i + 1)
    }

    /// `program` to be run on host `i` (in its network namespace; the file system is the
    /// machine's, shared by every host).
    pub fn command(&self, i: usize, program: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.ns(i))).arg("--").arg(program);
        c
    }

    /// Host `i` cut off: every packet in and out of it dropped, its processes running on.
    pub fn cut(&self, i: usize) {
        hosts_sh(&["cut", &i.to_string()]);
    }

    /// Host `i` cut off from TCP port `port` of every other host (to and from it), every other
    /// path kept: a partial partition.
    pub fn cut_port(&self, i: usize, port: u16) {
        hosts_sh(&["cut", &i.to_string(), &port.to_string()]);
    }

    /// Undoes [`Hosts::cut`] and [`Hosts::cut_port`].
    pub fn restore(&self, i: usize) {
        hosts_sh(&["restore", &i.to_string()]);
    }

    /// Host `i`'s link limited to `rate` (tc tbf, e.g. `4mbit`), both ways.
    pub fn slow(&self, i: usize, rate: &str) {
        hosts_sh(&["slow", &i.to_string(), rate]);
    }

    /// [`Hosts::slow`] letting `burst` bytes through at once (e.g. `2mb`): a link of
    /// gigabits needs about a millisecond of its rate, where the default 32 kbit would
    /// hold it far below the rate.
    pub fn slow_with_burst(&self, i: usize, rate: &str, burst: &str) {
        hosts_sh(&["slow", &i.to_string(), rate, burst]);
    }

    /// `percent` % of host `i`'s packets dropped at random, both ways.
    pub fn loss(&self, i: usize, percent: u32) {
        hosts_sh(&["loss", &i.to_string(), &percent.to_string()]);
    }

    /// Every fault of host `i` removed.
    pub fn clear(&self, i: usize) {
        hosts_sh(&["clear", &i.to_string()]);
    }

    /// The packets host `i`'s cut and loss rules dropped so far.
    pub fn dropped(&self, i: usize) -> u64 {
        let out = hosts_sh(&["dropped", &i.to_string()]);
        out.trim()
            .parse()
            .unwrap_or_else(|_| panic!("hosts.sh dropped: not a count: {out:?}"))
    }

    /// `tc -s` of host `i`'s link: how often its rate limit held packets back (tbf's
    /// `overlimits`), 0 without one.
    pub fn overlimits(&self, i: usize) -> u64 {
        let run = run_bounded(
            Command::new("tc").args(["-n", &self.ns(i), "-s", "qdisc", "show", "dev", "eth0"]),
            SCRIPT_DEADLINE,
        )
        .expect("run tc");
        let out = run.stdout_text();
        out.split([' ', ',', ')', '('])
            .skip_while(|w| *w != "overlimits")
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// The processes in host `i`'s network namespace.
    pub fn pids(&self, i: usize) -> Vec<u32> {
        let run = run_bounded(Command::new("ip").args(["netns", "pids", &self.ns(i)]), SCRIPT_DEADLINE)
            .expect("run ip netns pids");
        run.stdout_text()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    }

    /// Kills (SIGKILL) every process on host `i`, as a host that dies; returns how many.
    pub fn kill_all(&self, i: usize) -> usize {
        let pids = self.pids(i);
        for p in &pids {
            // SAFETY: kill(2) has no memory preconditions; a pid gone meanwhile is ESRCH.
            unsafe {
                libc::kill(*p as libc::pid_t, libc::SIGKILL);
            }
        }
        pids.len()
    }

    /// A SLURM cluster across the hosts: slurmctld on host 0, one slurmd on every other
    /// host, configured by [`HOSTS_SLURM_CONF`]; removed with the hosts.
    pub fn slurm_up(&self) {
        assert!(self.n >= 3, "the SLURM cluster needs host 0 and two node hosts");
        hosts_sh(&["slurm-up"]);
    }

    /// SLURM command `program args` of the cluster across the hosts, run on host 0 (bounded).
    pub fn slurm(&self, program: &str, args: &[&str]) -> Finished {
        let mut c = self.command(0, program);
        c.args(args).env("SLURM_CONF", HOSTS_SLURM_CONF);
        run_bounded(&mut c, SCRIPT_DEADLINE).unwrap_or_else(|e| panic!("cannot run {program}: {e}"))
    }
}

impl Drop for Hosts {
    // The turn (a field) ends after this, once the hosts are gone.
    fn drop(&mut self) {
        let run = run_bounded(Command::new("bash").arg(script()).arg("down"), SCRIPT_DEADLINE);
        match run {
            Ok(r) if r.code() == Some(0) => {}
            Ok(r) => eprintln!("scripts/hosts.sh down failed: {}", r.stderr_text()),
            Err(e) => eprintln!("cannot run scripts/hosts.sh down: {e}"),
        }
    }
}

/// A process started on a test host, its stdout lines and stderr read on threads as they
/// come (each line with the instant it arrived); killed and reaped when dropped.
pub struct HostProcess {
    child: Child,
    name: String,
    stdout: Arc<Mutex<Vec<(Instant, String)>>>,
    stderr: Arc<Mutex<Vec<(Instant, String)>>>,
    readers: Vec<thread::JoinHandle<()>>,
}

impl HostProcess {
    /// Starts `cmd` (stdin closed), naming it `name` in failures.
    pub fn spawn(name: &str, cmd: &mut Command) -> HostProcess {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let readers = vec![
            read_lines(child.stdout.take(), stdout.clone()),
            read_lines(child.stderr.take(), stderr.clone()),
        ];
        HostProcess {
            child,
            name: name.to_string(),
            stdout,
            stderr,
            readers,
        }
    }

    /// Its pid.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Its stdout lines so far, with the instant each arrived.
    pub fn stdout_lines(&self) -> Vec<(Instant, String)> {
        self.stdout.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Its stderr so far.
    pub fn stderr_text(&self) -> String {
        let lines = self.stderr.lock().unwrap_or_else(|p| p.into_inner());
        lines.iter().map(|(_, l)| format!("{l}\n")).collect()
    }

    /// Waits (at most `deadline`) until `cond` holds of its stdout lines; panics naming
    /// `what`, with its stderr, past the deadline or when it exits first.
    pub fn wait_stdout(&mut self, what: &str, deadline: Duration, cond: impl Fn(&[(Instant, String)]) -> bool) {
        self.wait(what, deadline, |p| cond(&p.stdout_lines()));
    }

    /// Waits (at most `deadline`) until a line of its stderr contains every one of `parts`.
    pub fn wait_stderr(&mut self, what: &str, deadline: Duration, parts: &[&str]) {
        self.wait(what, deadline, |p| {
            p.stderr_text().lines().any(|l| parts.iter().all(|s| l.contains(s)))
        });
    }

    fn wait(&mut self, what: &str, deadline: Duration, cond: impl Fn(&HostProcess) -> bool) {
        let seen = poll_until(Instant::now() + deadline, || {
            if cond(self) {
                return Some(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                // Its last words: the readers end at the pipes' end of file.
                self.join_readers();
                if cond(self) {
                    return Some(());
                }
                panic!(
                    "{}: exited ({status}) before {what}; stderr:\n{}",
                    self.name,
                    self.stderr_text()
                );
            }
            None
        });
        assert!(
            seen.is_some(),
            "{}: no {what} within {deadline:?}; stderr:\n{}",
            self.name,
            self.stderr_text()
        );
    }

    /// Waits (at most `deadline`) for it to exit; its exit code (`None`: killed by a
    /// signal). Panics, with its stderr, past the deadline (it is killed then).
    pub fn exit_code(&mut self, deadline: Duration) -> Option<i32> {
        let status = wait_with_deadline(&mut self.child, deadline);
        self.join_readers();
        match status {
            Some(s) => s.code(),
            None => panic!(
                "{}: still running after {deadline:?}; stderr:\n{}",
                self.name,
                self.stderr_text()
            ),
        }
    }
}

impl HostProcess {
    /// Waits for the readers of an exited process (their pipes closed with it).
    fn join_readers(&mut self) {
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn read_lines(
    r: Option<impl std::io::Read + Send + 'static>,
    into: Arc<Mutex<Vec<(Instant, String)>>>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        use std::io::BufRead;
        let Some(r) = r else { return };
        for line in std::io::BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            into.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((Instant::now(), line));
        }
    })
}
