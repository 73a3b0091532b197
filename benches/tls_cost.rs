//! What TLS costs on the trainer–node links (issue 41), measured against plain TCP in
//! the same run: the `remote` bench's part (f). Two collectors side by side, one plain
//! and one over TLS, pulled in alternating windows: CartPole batches of 10,000 frames
//! from 2 process nodes, and batches of 8 MiB (1,024 frames of a 2,048-float
//! observation, the `Wide` env of this file) from 2 nodes joining over loopback.

use std::thread::{self, JoinHandle};
use std::time::Duration;

use rollout::{Action, Env, EnvError, PolicyConfig, Registry, Spec, Transition};
use rollout_actors::remote::{run_node, NodeOptions, NodeTls};
use rollout_actors::{CollectorBuilder, DistributedCollector, Launcher};
use rollout_tests::TestCerts;

/// Floats in one observation of [`Wide`]: 8 KiB a frame.
pub const WIDE_OBS: usize = 2048;

/// An env of wide observations standing in for images: each step fills its 2,048
/// floats with the step count (a memset), so the cost is moving the bytes.
pub struct Wide {
    observation: Spec,
    action: Spec,
    steps: u64,
}

impl Wide {
    /// Registered name.
    pub const NAME: &'static str = "Wide";

    fn new() -> Wide {
        Wide {
            observation: Spec::uniform_box(WIDE_OBS, f32::NEG_INFINITY, f32::INFINITY),
            action: Spec::uniform_box(1, 0.0, 1.0),
            steps: 0,
        }
    }
}

impl Env for Wide {
    fn name(&self) -> &str {
        Self::NAME
    }
    fn observation_spec(&self) -> &Spec {
        &self.observation
    }
    fn action_spec(&self) -> &Spec {
        &self.action
    }
    fn reset(&mut self, _seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        self.steps = 0;
        obs.fill(0.0);
        Ok(())
    }
    fn step(&mut self, _action: Action<'_>, obs: &mut [f32]) -> Result<Transition, EnvError> {
        self.steps += 1;
        obs.fill(self.steps as f32);
        Ok(Transition {
            reward: 0.0,
            terminated: false,
            truncated: self.steps >= 1000,
        })
    }
    fn state(&self) -> Vec<f64> {
        vec![self.steps as f64]
    }
    fn set_state(&mut self, state: &[f64]) -> Result<(), EnvError> {
        self.steps = state.first().copied().unwrap_or(0.0) as u64;
        Ok(())
    }
    fn elapsed_steps(&self) -> u64 {
        self.steps
    }
    fn set_elapsed_steps(&mut self, steps: u64) {
        self.steps = steps;
    }
}

/// The built-ins and [`Wide`].
pub fn wide_registry() -> Registry {
    let mut r = Registry::with_builtins();
    r.register(Wide::NAME, |_| -> Result<Box<dyn Env>, EnvError> {
        Ok(Box::new(Wide::new()))
    });
    r
}

/// `b` over TLS with `certs` (the nodes it starts told the CA), or as it is.
pub fn secured(b: CollectorBuilder, certs: Option<&TestCerts>) -> CollectorBuilder {
    match certs {
        Some(c) => b.tls_cert(&c.trainer_cert).tls_key(&c.trainer_key).tls_ca(&c.ca),
        None => b,
    }
}

const TOKEN: &[u8] = b"tls-bench-token-0123456789abcdef";

/// An endless async run of [`Wide`] with a constant policy, `frames` a batch, from 2
/// nodes of this process joining over loopback (TLS with `certs`); the node threads to
/// join after its shutdown.
pub fn wide_collector(frames: usize, certs: Option<&TestCerts>) -> (DistributedCollector, Vec<JoinHandle<()>>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let b = DistributedCollector::builder()
        .env(Wide::NAME)
        .registry(wide_registry())
        .policy(PolicyConfig::Constant { value: 1.0 })
        .nodes(2)
        .frames_per_batch(frames)
        .total_frames(-1)
        .seed(0)
        .launcher(Launcher::External)
        .token(TOKEN)
        .on_listening(move |a| {
            let _ = tx.send(a);
        });
    // Nodes of this process, not started by the trainer: no node CA to pass on.
    let b = match certs {
        Some(c) => b.tls_cert(&c.trainer_cert).tls_key(&c.trainer_key),
        None => b,
    };
    let build = thread::spawn(move || b.build().expect("collector"));
    let addr = rx.recv_timeout(Duration::from_secs(60)).expect("bound");
    let tls = certs.map(|c| NodeTls {
        ca: c.ca.clone(),
        ..NodeTls::default()
    });
    let nodes = (0..2)
        .map(|i| {
            let tls = tls.clone();
            thread::spawn(move || {
                let opts = NodeOptions {
                    name: format!("wide-{i}"),
                    registry: wide_registry(),
                    tls,
                    ..NodeOptions::default()
                };
                let _ = run_node(&addr.to_string(), TOKEN, opts);
            })
        })
        .collect();
    (build.join().expect("trainer"), nodes)
}
