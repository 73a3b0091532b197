//! What TLS costs on the trainer–node links (issue 41), measured against plain TCP in
//! the same run: the `remote` bench's part (f). Two collectors side by side, one plain
//! and one over TLS, pulled in alternating windows: CartPole batches of 10,000 frames
//! from 2 process nodes, and batches of 8 MiB (1,024 frames of a 2,048-float
//! observation, the `Wide` env of this file) from 2 nodes joining over loopback; and
//! part (h), the same 8 MiB batches over a link of a given rate between two test hosts.

use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

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

/// Two test hosts (network namespaces, `rollout_tests::Hosts`) a link apart: the trainer
/// listens at `trainer_addr` in `trainer_ns`, the nodes dial it from `node_ns`.
pub struct Link {
    /// The trainer's host (its namespace's name under `/run/netns`).
    pub trainer_ns: String,
    /// The trainer's address in it.
    pub trainer_addr: String,
    /// The nodes' host.
    pub node_ns: String,
}

/// Moves the calling thread into network namespace `name` (`/run/netns/<name>`): the
/// sockets it makes from then on, and the threads it starts, are that host's.
pub fn enter_netns(name: &str) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(format!("/run/netns/{name}"))?;
    // SAFETY: setns on an open namespace file; it changes only this thread's namespace.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Bytes a second one TCP socket carries over `link` (from the nodes' host to the
/// trainer's, 4 MiB writes, for `seconds`): what the link itself allows.
pub fn raw_link(link: &Link, seconds: f64) -> f64 {
    use std::io::{Read, Write};
    let (tx, rx) = std::sync::mpsc::channel();
    let (ns, at) = (link.trainer_ns.clone(), link.trainer_addr.clone());
    let reader = thread::spawn(move || {
        enter_netns(&ns).expect("the trainer's host");
        let l = std::net::TcpListener::bind(format!("{at}:0")).expect("bind");
        tx.send(l.local_addr().expect("addr")).expect("send the address");
        let (mut s, _) = l.accept().expect("accept");
        let mut buf = vec![0u8; 4 << 20];
        let (mut got, start) = (0usize, Instant::now());
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
        got as f64 / start.elapsed().as_secs_f64()
    });
    let addr = rx.recv_timeout(Duration::from_secs(10)).expect("bound");
    let ns = link.node_ns.clone();
    let writer = thread::spawn(move || {
        enter_netns(&ns).expect("the nodes' host");
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        let chunk = vec![1u8; 4 << 20];
        let start = Instant::now();
        while start.elapsed().as_secs_f64() < seconds {
            if s.write_all(&chunk).is_err() {
                break;
            }
        }
    });
    writer.join().expect("writer");
    reader.join().expect("reader")
}

/// An endless async run of [`Wide`] with a constant policy, `frames` a batch, from 2
/// nodes of this process joining over loopback, or over `link` (TLS with `certs`); the
/// node threads to join after its shutdown.
pub fn wide_collector(
    frames: usize,
    certs: Option<&TestCerts>,
    link: Option<&Link>,
) -> (DistributedCollector, Vec<JoinHandle<()>>) {
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
    let b = match link {
        Some(l) => b.listen(format!("{}:0", l.trainer_addr)),
        None => b,
    };
    let trainer_ns = link.map(|l| l.trainer_ns.clone());
    // The trainer's threads start from this one: in the trainer's host over a link.
    let build = thread::spawn(move || {
        if let Some(ns) = trainer_ns {
            enter_netns(&ns).expect("the trainer's host");
        }
        b.build().expect("collector")
    });
    let addr = rx.recv_timeout(Duration::from_secs(60)).expect("bound");
    let tls = certs.map(|c| NodeTls {
        ca: c.ca.clone(),
        // The test certificate names `localhost`; over a link the nodes dial an address.
        server_name: link.map(|_| "localhost".to_string()),
        ..NodeTls::default()
    });
    let node_ns = link.map(|l| l.node_ns.clone());
    let nodes = (0..2)
        .map(|i| {
            let tls = tls.clone();
            let node_ns = node_ns.clone();
            thread::spawn(move || {
                if let Some(ns) = node_ns {
                    enter_netns(&ns).expect("the nodes' host");
                }
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

/// AES-128-GCM (the suite rustls picks here) sealing 16 KiB records on one core, in
/// bytes a second: the floor under TLS's cost, which a link pays twice a byte (sealed
/// by the writer, opened by the reader, at about the same rate).
pub fn seal_rate() -> f64 {
    use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM};
    let key = LessSafeKey::new(UnboundKey::new(&AES_128_GCM, &[7u8; 16]).expect("a 16-byte key"));
    let mut record = vec![1u8; 16 << 10];
    let seal = |n: u64, record: &mut Vec<u8>| {
        for i in 0..n {
            let mut nonce = [0u8; 12];
            nonce[4..].copy_from_slice(&i.to_be_bytes());
            let tag = key
                .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::empty(), record)
                .expect("seal");
            let _ = std::hint::black_box(tag);
        }
    };
    // The fastest of 9 rounds: the core's clock and neighbours vary from one to the next.
    let n = 10_000;
    (0..9)
        .map(|_| {
            let start = Instant::now();
            seal(n, &mut record);
            (n as usize * record.len()) as f64 / start.elapsed().as_secs_f64()
        })
        .fold(0.0, f64::max)
}

/// The bytes a frame of `b`'s run costs the nodes' links to the trainer: the same run
/// with its metrics served, 50 batches pulled, the trainer's received-bytes counter over
/// the frames made (those delivered and at most one batch a node in flight: within 4 %).
pub fn wire_bytes_per_frame(b: CollectorBuilder, nodes: usize, frames_per_batch: usize) -> f64 {
    let mut c = b.metrics("127.0.0.1:0").build().expect("collector");
    let addr = c.metrics_addr().expect("metrics served");
    let batches = 50;
    for _ in 0..batches {
        let batch = c.next_batch().expect("batch").expect("endless");
        c.recycle(batch);
    }
    let received = || -> f64 {
        let a = rollout_tests::http_get(addr, "/metrics").expect("scrape");
        a.body
            .lines()
            .find_map(|l| l.strip_prefix("rollout_received_bytes_total "))
            .and_then(|v| v.trim().parse().ok())
            .expect("rollout_received_bytes_total in the scrape")
    };
    // The counter is brought up to date on the trainer's ticks: read until it holds.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut last = received();
    loop {
        thread::sleep(Duration::from_millis(200));
        let now = received();
        if now == last || Instant::now() > deadline {
            break;
        }
        last = now;
    }
    c.shutdown().expect("shutdown");
    let made = (batches + nodes / 2) * frames_per_batch;
    last / made as f64
}
