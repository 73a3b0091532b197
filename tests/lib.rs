//! Helpers shared by the integration scenarios in `tests/`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

const BUILD_TIMEOUT: Duration = Duration::from_secs(600);

/// Waits for `child` at most `timeout`, killing it on expiry. Returns `None` on a timeout.
pub fn wait_with_deadline(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait().expect("try_wait") {
            Some(status) => return Some(status),
            None if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            None => thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Builds the `rollout` binary with cargo `profile` into this test's target dir and returns
/// its path. Bounded by a deadline; panics with cargo's output if the build fails.
fn build_rollout(profile: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe.parent().and_then(Path::parent).expect("<target>/<profile>/deps/");
    let target_dir = profile_dir.parent().expect("<target>/");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let log_path = target_dir.join(format!("rollout-{profile}-build-{}.log", std::process::id()));
    let log = std::fs::File::create(&log_path).expect("create the build log");
    let mut child = Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "-p",
            "rollout-actors",
            "--bin",
            "rollout",
            "--profile",
            profile,
        ])
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
        Some(s) => panic!("cargo build --profile {profile} of `rollout` failed ({s}):\n{log}"),
        None => panic!("cargo build --profile {profile} of `rollout` took longer than {BUILD_TIMEOUT:?}:\n{log}"),
    }
    let dir = if profile == "dev" { "debug" } else { profile };
    let bin = target_dir
        .join(dir)
        .join(format!("rollout{}", std::env::consts::EXE_SUFFIX));
    assert!(bin.exists(), "{} missing after the build", bin.display());
    bin
}

/// The `rollout` binary of this test's own profile, built once per test process.
///
/// `cargo test` builds the binaries of the package under test only, and `rollout` belongs to
/// `rollout-actors`, so the first test to need it runs `cargo build -p rollout-actors --bin rollout`
/// with this test's own target dir and profile (derived from the test executable's path,
/// `<target>/<profile>/deps/<test>-<hash>`).
pub fn rollout_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("current_exe");
        let profile_dir = exe.parent().and_then(Path::parent).expect("<target>/<profile>/deps/");
        let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") => "dev",
            Some(other) => other,
            None => panic!("cannot tell the profile from {}", exe.display()),
        };
        build_rollout(profile)
    })
}

/// The `rollout` binary built with the `release` profile, once per test process, in this
/// test's target dir (for scenarios too slow for a debug build, such as training to a target).
pub fn rollout_release_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| build_rollout("release"))
}

/// How many trajectories end, in what was yielded, on a frame that is not `done`:
/// cut short by a failure (a killed node, a panicking env) or still running when
/// the run stopped (at most one per env lane).
pub fn cut_trajectories(batches: &[rollout_actors::Collected]) -> usize {
    use rollout::rollout::keys;
    let mut last_done: std::collections::HashMap<i64, bool> = std::collections::HashMap::new();
    for b in batches {
        let ids = b.data.i64(keys::TRAJ_IDS).expect("ids");
        let done = b.data.bool(keys::NEXT_DONE).expect("done");
        let t = *ids.shape().last().expect("time dim");
        let ids = ids.as_slice().expect("contiguous");
        let done = done.as_slice().expect("contiguous");
        // Rows are lanes, time last: within a batch a lane's frames are in order.
        for r in 0..ids.len() / t {
            for i in 0..t {
                last_done.insert(ids[r * t + i], done[r * t + i]);
            }
        }
    }
    last_done.values().filter(|d| !**d).count()
}

/// Asserts that each trajectory id belongs to exactly one (node, env) lane and that its frames
/// there are consecutive steps, across all `batches` (async `[envs, T]` or sync `[nodes, envs, T]`).
pub fn assert_unique_traj_ids(batches: &[rollout_actors::Collected]) {
    use rollout::rollout::keys;
    let mut seen: std::collections::HashMap<i64, (Vec<usize>, i64)> = std::collections::HashMap::new();
    for b in batches {
        let ids = b.data.i64(keys::TRAJ_IDS).expect("ids");
        let steps = b.data.i64(keys::STEP_COUNT).expect("steps");
        let shape = ids.shape().to_vec();
        let t = *shape.last().expect("time dim");
        let rows = ids.len() / t;
        let ids = ids.as_slice().expect("contiguous");
        let steps = steps.as_slice().expect("contiguous");
        for r in 0..rows {
            let lane = match b.node {
                Some(n) => vec![n, r],
                None => vec![r / shape[1], r % shape[1]],
            };
            for i in 0..t {
                let (id, sc) = (ids[r * t + i], steps[r * t + i]);
                match seen.get_mut(&id) {
                    None => {
                        seen.insert(id, (lane.clone(), sc));
                    }
                    Some((l, last)) => {
                        assert_eq!(*l, lane, "traj id {id} appears in two lanes");
                        assert_eq!(sc, *last + 1, "traj id {id} frames are not consecutive");
                        *last = sc;
                    }
                }
            }
        }
    }
    assert!(seen.len() > 1, "too few trajectories to tell");
}

/// `Counting`, but every instance panics on its `panic_at`-th step (and any later
/// one): a real fault in env code. A rebuilt instance starts counting again.
pub struct Panicky {
    inner: rollout::Counting,
    steps: u64,
    panic_at: u64,
}

impl rollout::Env for Panicky {
    fn name(&self) -> &str {
        "Panicky"
    }
    fn observation_spec(&self) -> &rollout::Spec {
        self.inner.observation_spec()
    }
    fn action_spec(&self) -> &rollout::Spec {
        self.inner.action_spec()
    }
    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), rollout::EnvError> {
        self.inner.reset(seed, obs)
    }
    fn step(&mut self, a: rollout::Action<'_>, obs: &mut [f32]) -> Result<rollout::Transition, rollout::EnvError> {
        self.steps += 1;
        assert!(self.steps < self.panic_at, "env exploded at step {}", self.steps);
        self.inner.step(a, obs)
    }
    fn state(&self) -> Vec<f64> {
        self.inner.state()
    }
    fn set_state(&mut self, s: &[f64]) -> Result<(), rollout::EnvError> {
        self.inner.set_state(s)
    }
    fn elapsed_steps(&self) -> u64 {
        self.inner.elapsed_steps()
    }
    fn set_elapsed_steps(&mut self, s: u64) {
        self.inner.set_elapsed_steps(s)
    }
}

/// The builtins plus `Panicky` (panicking on each instance's `panic_at`-th step), and
/// a counter of the `Panicky` instances built so far (build-time probe included).
pub fn panicky_registry(panic_at: u64) -> (rollout::Registry, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let built = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = built.clone();
    let mut reg = rollout::Registry::with_builtins();
    reg.register("Panicky", move |_c| {
        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(Box::new(Panicky {
            inner: rollout::Counting::new(rollout::CountingConfig::default())?,
            steps: 0,
            panic_at,
        }))
    });
    (reg, built)
}

/// The builtins plus `Panicky`, each instance panicking at a step drawn (xorshift from
/// `seed`, one draw per instance built) from `lo..hi`: faults at unpredictable points.
/// Also returns the count of instances built.
pub fn flaky_registry(
    seed: u64,
    lo: u64,
    hi: u64,
) -> (rollout::Registry, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let state = std::sync::Arc::new(std::sync::Mutex::new(seed | 1));
    let built = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = built.clone();
    let mut reg = rollout::Registry::with_builtins();
    reg.register("Panicky", move |_c| {
        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut x = state.lock().unwrap_or_else(|p| p.into_inner());
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        let panic_at = lo + *x % (hi - lo).max(1);
        Ok(Box::new(Panicky {
            inner: rollout::Counting::new(rollout::CountingConfig::default())?,
            steps: 0,
            panic_at,
        }))
    });
    (reg, built)
}

/// A compact view of what a trainer sent, for comparing message sequences:
/// `(node, "C<seq>:<frames>" | "W<version>" | "S<seed>" | "X" | "P<id>" (snapshot) | "R<node>" (restore))`.
pub fn describe_sent(sent: &[(usize, rollout::message::ToNode)]) -> Vec<(usize, String)> {
    use rollout::message::ToNode;
    sent.iter()
        .map(|(n, m)| {
            let s = match m {
                ToNode::Continue(c) => format!("C{}:{}", c.seq, c.frames),
                ToNode::UpdateWeights(u) => format!("W{}", u.weights.version),
                ToNode::Seed(s) => format!("S{}", s.seed),
                ToNode::Shutdown => "X".to_string(),
                ToNode::Snapshot { id } => format!("P{id}"),
                ToNode::Restore(st) => format!("R{}", st.node),
            };
            (*n, s)
        })
        .collect()
}

/// A fresh folder under the system temp dir, removed (with its content) when dropped.
pub struct TempDir(std::path::PathBuf);

impl TempDir {
    /// `rollout-<name>-<pid>`, emptied first.
    pub fn new(name: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("rollout-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("temp dir");
        TempDir(d)
    }

    /// `file` inside the folder.
    pub fn join(&self, file: &str) -> std::path::PathBuf {
        self.0.join(file)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
