//! Real faults in env code: envs that panic at a chosen or a random step.

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
