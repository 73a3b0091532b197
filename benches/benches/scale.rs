//! One trainer, many remote nodes (issue 16): how the trainer's cost grows with N.
//!
//! The trainer is this process. Its nodes join over real loopback TCP with the real
//! login (token, challenge, proof): a *swarm*, this executable re-invoked as a child
//! (`ROLLOUT_SCALE_SWARM=nodes`), serves all N node connections from one thread,
//! each a task running the node's session machine (`NodeHandshake`, `NodeSession`)
//! and node machine (the testkit's `NodeHarness`, `Counting` env, random policy) as
//! `rollout node` runs them, without a thread per env worker. So the trainer's CPU
//! (`getrusage` of this process) and RSS (`/proc/self/status`) are the trainer's
//! alone, the nodes' cost is the child's.
//!
//! Per N it prints: the time from `build()` until all N joined (the swarm's start
//! included), the trainer's CPU per node-batch in sync rounds of 10 frames per node,
//! the sync round time p50 and p99, async batches/s (10 frames each), the trainer's
//! RSS after the join (total and per node above the process before `build`), and
//! the trainer's CPU while idle (heartbeats only) as % of one core; and the trainer's
//! CPU per node-batch of the same sync rounds pulled by a task on the trainer's own
//! thread (an embedded run) instead of `next_batch` from another thread.
//!
//! Baseline, in the same run: raw loopback round trips over N connections (one
//! small frame out on each, a 1 KiB reply back on each, blocking sockets, the other
//! end the same swarm child in `echo` mode): `round/raw` and `cpu/raw` are the ratios.
//!
//! Then, per N, the join over TLS against plain in the same run (issue 41): the time
//! until all N joined and the trainer's CPU meanwhile (its side of N TLS handshakes
//! and logins), plain then TLS, each the median of 3 joins; the swarm speaks TLS with
//! tokio-rustls when `ROLLOUT_SCALE_TLS_CA` names the CA.
//!
//! Run: `cargo bench -p rollout-benches --bench scale`. N defaults to 1,8,64,256,1024;
//! `ROLLOUT_SCALE_NODES=8,64` picks others, `ROLLOUT_SCALE_SECS` the seconds each
//! phase measures (default 3). The swarm's nodes answer the trainer's heartbeats as
//! `rollout node` does; with `ROLLOUT_SCALE_OWN_BEATS=1` they beat on timers of their
//! own at spread phases instead, as independent processes of a node that does not answer do.

use std::cell::RefCell;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rollout::connection::{Inbound, NodeHandshake, NodeSession, NodeStep};
use rollout::wire::{self, NodeFrame, TrainerFrame, DEFAULT_MAX_FRAME, PREFIX_LEN};
use rollout::{PolicyConfig, Registry};
use rollout_actors::messages::StopNodes;
use rollout_actors::testkit::NodeHarness;
use rollout_actors::{CollectorBuilder, DistributedCollector, Launcher};
use rustls::pki_types::pem::PemObject;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};

const TOKEN: &str = "scale-bench-token-0123456789abcdef";
const FRAMES_PER_NODE: usize = 10;
/// Bytes of one raw baseline reply: about a `batch` frame of 10 `Counting` frames.
const RAW_REPLY: usize = 1024;
const RAW_REQUEST: usize = 40;

fn main() {
    raise_nofile_limit();
    match std::env::var("ROLLOUT_SCALE_SWARM").as_deref() {
        Ok("nodes") => return swarm_nodes(),
        Ok("echo") => return swarm_echo(),
        _ => {}
    }
    let ns: Vec<usize> = std::env::var("ROLLOUT_SCALE_NODES")
        .unwrap_or_else(|_| "1,8,64,256,1024".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let secs: f64 = std::env::var("ROLLOUT_SCALE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    if std::env::var("ROLLOUT_SCALE_ONLY").as_deref() == Ok("tls") {
        print_tls_joins(&ns);
        return;
    }
    // Profiling aid: `ROLLOUT_SCALE_ONLY=sync|async|embedded` runs that phase alone
    // (sync includes the idle part), for `perf record -p`.
    if let Ok(only) = std::env::var("ROLLOUT_SCALE_ONLY") {
        for &n in &ns {
            if only == "embedded" {
                println!("{n}: {:.1} µs per node-batch, embedded", sync_embedded(n, secs) * 1e6);
            } else if only == "async" {
                let a = async_phase(n, secs);
                println!(
                    "{n}: {:.0} batches/s, {:.1} µs each",
                    a.batches_per_s,
                    a.cpu_per_batch * 1e6
                );
            } else {
                let s = sync_phase(n, secs);
                println!(
                    "{n}: joined in {:.0} ms, idle {:.2} %, p50 {:.2} ms, {:.1} µs per node-batch",
                    s.join.as_secs_f64() * 1e3,
                    s.idle_core * 100.0,
                    s.p50 * 1e3,
                    s.cpu_per_batch * 1e6
                );
            }
        }
        return;
    }
    println!(
        "{:>5} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>8} {:>9} {:>7} {:>7}",
        "N",
        "join ms",
        "µs/batch",
        "raw µs",
        "cpu/raw",
        "p50 ms",
        "p99 ms",
        "raw ms",
        "async b/s",
        "RSS MiB",
        "KiB/node",
        "idle %",
        "rnd/raw"
    );
    for &n in &ns {
        let raw = raw_rounds(n, secs.min(2.0));
        let sync = sync_phase(n, secs);
        let asy = async_phase(n, secs);
        let embedded = sync_embedded(n, secs);
        println!(
            "{:>5} {:>8.0} {:>9.1} {:>9.2} {:>9.1} {:>9.2} {:>9.2} {:>9.3} {:>10.0} {:>8.1} {:>9.1} {:>7.2} {:>7.1}",
            n,
            sync.join.as_secs_f64() * 1e3,
            sync.cpu_per_batch * 1e6,
            raw.cpu_per_conn * 1e6,
            sync.cpu_per_batch / raw.cpu_per_conn,
            sync.p50 * 1e3,
            sync.p99 * 1e3,
            raw.p50 * 1e3,
            asy.batches_per_s,
            sync.rss_kib as f64 / 1024.0,
            sync.rss_per_node_kib,
            sync.idle_core * 100.0,
            sync.p50 / raw.p50,
        );
        println!(
            "      (sync rounds {}, async batches {} at {:.1} µs trainer CPU each, async join {:.0} ms; \
             sync pulled on the trainer's thread: {:.1} µs per node-batch)",
            sync.rounds,
            asy.batches,
            asy.cpu_per_batch * 1e6,
            asy.join.as_secs_f64() * 1e3,
            embedded * 1e6
        );
    }
    print_tls_joins(&ns);
}

/// The join of N nodes over TLS against plain, in the same run, for each N.
fn print_tls_joins(ns: &[usize]) {
    let certs = rollout_tests::test_certs();
    println!("join over TLS against plain (median of 3 joins each; the trainer's CPU while N joined):");
    for &n in ns {
        let (mut tp, mut cp, mut tt, mut ct) = (vec![], vec![], vec![], vec![]);
        for _ in 0..3 {
            let (t, c) = join_once(n, None);
            tp.push(t);
            cp.push(c);
            let (t, c) = join_once(n, Some(&certs));
            tt.push(t);
            ct.push(c);
        }
        let (tp, cp) = (quantile(&mut tp, 0.5), quantile(&mut cp, 0.5));
        let (tt, ct) = (quantile(&mut tt, 0.5), quantile(&mut ct, 0.5));
        println!(
            "{n:>5}: plain {:>7.0} ms, CPU {:>7.1} ms   TLS {:>7.0} ms, CPU {:>7.1} ms   \
             TLS CPU - plain CPU = {:.0} µs per node",
            tp * 1e3,
            cp * 1e3,
            tt * 1e3,
            ct * 1e3,
            (ct - cp) / n as f64 * 1e6
        );
    }
}

/// One sync collector of `n` swarm nodes built (every node joined), over TLS with
/// `certs`: the time `build` took and the trainer's CPU meanwhile; then shut down.
fn join_once(n: usize, certs: Option<&rollout_tests::TestCerts>) -> (f64, f64) {
    let child = SwarmSlot::default();
    let hook = Arc::clone(&child);
    let ca = certs.map(|c| c.ca.clone());
    let mut b = settings(n, true, &child).on_listening(move |addr| {
        *hook.lock().expect("swarm slot") = Some(spawn_swarm_tls("nodes", addr, n, ca.as_deref()));
    });
    if let Some(c) = certs {
        b = b.tls_cert(&c.trainer_cert).tls_key(&c.trainer_key);
    }
    let (cpu0, start) = (process_cpu(), Instant::now());
    let mut c = b.build().expect("collector");
    let (join, cpu) = (start.elapsed().as_secs_f64(), (process_cpu() - cpu0).as_secs_f64());
    c.shutdown().expect("shutdown");
    reap(child.lock().expect("swarm slot").take().expect("swarm started"));
    (join, cpu)
}

// ---------------------------------------------------------------- measuring

/// CPU time (user + system) of this whole process so far.
fn process_cpu() -> Duration {
    // SAFETY: `rusage` is plain integers, for which all zeroes is a valid value.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct we own and nothing else.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Resident set of this process, KiB (`VmRSS`).
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// The soft open-file limit raised to the hard one, as the `rollout` binary does:
/// 1,024 nodes are 1,024 sockets on each side. A failure leaves the old limit.
fn raise_nofile_limit() {
    let _ = rlimit::increase_nofile_limit(u64::MAX);
}

/// The swarm child: this executable in `mode`, serving `n` connections to `addr`.
fn spawn_swarm(mode: &str, addr: SocketAddr, n: usize) -> Child {
    spawn_swarm_tls(mode, addr, n, None)
}

/// [`spawn_swarm`], its nodes joining over TLS (the trainer checked against `ca`) when set.
fn spawn_swarm_tls(mode: &str, addr: SocketAddr, n: usize, ca: Option<&std::path::Path>) -> Child {
    let exe = std::env::current_exe().expect("own path");
    let mut cmd = Command::new(exe);
    if let Some(ca) = ca {
        cmd.env("ROLLOUT_SCALE_TLS_CA", ca);
    }
    cmd.env("ROLLOUT_SCALE_SWARM", mode)
        .env("ROLLOUT_SCALE_ADDR", addr.to_string())
        .env("ROLLOUT_SCALE_COUNT", n.to_string())
        .env("ROLLOUT_TOKEN", TOKEN)
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn the swarm")
}

/// Waits for the swarm to end (it does once every node answered `Shutdown`), killed
/// past a deadline.
fn reap(mut child: Child) {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                if !status.success() {
                    eprintln!("swarm ended with {status}");
                }
                return;
            }
            Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                eprintln!("swarm still running past its deadline: killed");
                let _ = child.kill();
                let _ = child.wait();
                return;
            }
        }
    }
}

// ---------------------------------------------------------------- baseline

struct Raw {
    p50: f64,
    cpu_per_conn: f64,
}

/// Raw round trips over `n` loopback connections: a small frame written to each,
/// then each one's reply read, for about `secs`.
fn raw_rounds(n: usize, secs: f64) -> Raw {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let child = spawn_swarm("echo", l.local_addr().expect("addr"), n);
    let mut conns: Vec<TcpStream> = (0..n)
        .map(|_| {
            let (s, _) = l.accept().expect("accept");
            s.set_nodelay(true).expect("nodelay");
            s
        })
        .collect();
    let mut req = vec![0u8; RAW_REQUEST];
    req[..PREFIX_LEN].copy_from_slice(&((RAW_REQUEST - PREFIX_LEN) as u32).to_be_bytes());
    let mut reply = vec![0u8; RAW_REPLY];
    let mut round = |conns: &mut [TcpStream]| {
        for c in conns.iter_mut() {
            c.write_all(&req).expect("raw write");
        }
        for c in conns.iter_mut() {
            c.read_exact(&mut reply).expect("raw read");
        }
    };
    for _ in 0..5 {
        round(&mut conns);
    }
    let (mut times, cpu0, start) = (Vec::new(), process_cpu(), Instant::now());
    while start.elapsed().as_secs_f64() < secs || times.len() < 20 {
        let t = Instant::now();
        round(&mut conns);
        times.push(t.elapsed().as_secs_f64());
    }
    let cpu = (process_cpu() - cpu0).as_secs_f64();
    let rounds = times.len();
    drop(conns);
    reap(child);
    Raw {
        p50: quantile(&mut times, 0.5),
        cpu_per_conn: cpu / (rounds * n) as f64,
    }
}

// ---------------------------------------------------------------- the trainer

/// The swarm child, once the trainer listens and starts it.
type SwarmSlot = Arc<Mutex<Option<Child>>>;

/// The settings of a run over `n` nodes of the swarm, which starts once the trainer
/// listens and lands in `swarm`.
fn settings(n: usize, sync: bool, swarm: &SwarmSlot) -> CollectorBuilder {
    let hook = Arc::clone(swarm);
    let fpb = if sync { FRAMES_PER_NODE * n } else { FRAMES_PER_NODE };
    DistributedCollector::builder()
        .sync(sync)
        .env("Counting")
        .policy(PolicyConfig::Random)
        .nodes(n)
        .envs_per_node(1)
        .frames_per_batch(fpb)
        .total_frames(-1)
        .seed(0)
        .launcher(Launcher::External)
        .listen("127.0.0.1:0")
        .token(TOKEN)
        .join_timeout(Duration::from_secs(120))
        .batch_timeout(Duration::from_secs(60))
        .on_listening(move |addr| {
            *hook.lock().expect("swarm slot") = Some(spawn_swarm("nodes", addr, n));
        })
}

/// A collector over `n` nodes of the swarm; the time `build` took (every node joined).
fn collector(n: usize, sync: bool) -> (DistributedCollector, Child, Duration) {
    let child = SwarmSlot::default();
    let start = Instant::now();
    let c = settings(n, sync, &child).build().expect("collector");
    let join = start.elapsed();
    let child = child.lock().expect("swarm slot").take().expect("swarm started");
    (c, child, join)
}

struct Sync {
    join: Duration,
    rounds: usize,
    cpu_per_batch: f64,
    p50: f64,
    p99: f64,
    rss_kib: u64,
    rss_per_node_kib: f64,
    idle_core: f64,
}

fn sync_phase(n: usize, secs: f64) -> Sync {
    let rss0 = rss_kib();
    let (mut c, child, join) = collector(n, true);
    // Idle: joined, nothing asked; heartbeats both ways are all that happens.
    std::thread::sleep(Duration::from_millis(500));
    let rss = rss_kib();
    let (cpu0, t0) = (process_cpu(), Instant::now());
    std::thread::sleep(Duration::from_secs_f64(secs));
    let idle_core = (process_cpu() - cpu0).as_secs_f64() / t0.elapsed().as_secs_f64();
    for _ in 0..3 {
        let b = c.next_batch().expect("batch").expect("endless");
        c.recycle(b);
    }
    let (mut times, cpu0, start) = (Vec::new(), process_cpu(), Instant::now());
    while start.elapsed().as_secs_f64() < secs || times.len() < 20 {
        let t = Instant::now();
        let b = c.next_batch().expect("batch").expect("endless");
        assert_eq!(b.data.batch_size().iter().product::<usize>(), FRAMES_PER_NODE * n);
        times.push(t.elapsed().as_secs_f64());
        c.recycle(b);
    }
    let cpu = (process_cpu() - cpu0).as_secs_f64();
    c.shutdown().expect("shutdown");
    reap(child);
    Sync {
        join,
        rounds: times.len(),
        cpu_per_batch: cpu / (times.len() * n) as f64,
        p50: quantile(&mut times, 0.5),
        p99: quantile(&mut times, 0.99),
        rss_kib: rss,
        rss_per_node_kib: rss.saturating_sub(rss0) as f64 / n as f64,
        idle_core,
    }
}

/// The trainer's CPU per node-batch of sync rounds pulled by a task on the trainer's
/// own thread (an embedded run, `NextBatch`), not by `next_batch` on another thread:
/// the same rounds without the consumer's thread hand-off.
fn sync_embedded(n: usize, secs: f64) -> f64 {
    let child = SwarmSlot::default();
    let (tx, rx) = std::sync::mpsc::channel();
    let builder = settings(n, true, &child);
    let thread = std::thread::spawn(move || {
        actix::System::new().block_on(async move {
            let run = builder.start_embedded().await.expect("embedded run");
            let pull = || rollout_benches::pull_embedded(&run.trainer);
            // The first rounds wait for the joins.
            for _ in 0..3 {
                pull().await;
            }
            let (mut rounds, cpu0, start) = (0usize, process_cpu(), Instant::now());
            while start.elapsed().as_secs_f64() < secs || rounds < 20 {
                pull().await;
                rounds += 1;
            }
            let cpu = (process_cpu() - cpu0).as_secs_f64();
            let _ = tx.send(cpu / (rounds * n) as f64);
            run.trainer.send(StopNodes).await.expect("mailbox").expect("stop");
        });
    });
    // Bounded: a run that stops answering fails the bench instead of hanging it.
    let per_batch = rx
        .recv_timeout(Duration::from_secs_f64(secs + 180.0))
        .expect("the embedded run measured its rounds in time");
    thread.join().expect("the embedded run's thread");
    if let Some(c) = child.lock().expect("swarm slot").take() {
        reap(c);
    }
    per_batch
}

struct Async {
    join: Duration,
    batches: usize,
    batches_per_s: f64,
    cpu_per_batch: f64,
}

fn async_phase(n: usize, secs: f64) -> Async {
    let (mut c, child, join) = collector(n, false);
    for _ in 0..n.max(4) {
        let b = c.next_batch().expect("batch").expect("endless");
        c.recycle(b);
    }
    let (mut batches, cpu0, start) = (0, process_cpu(), Instant::now());
    while start.elapsed().as_secs_f64() < secs {
        let b = c.next_batch().expect("batch").expect("endless");
        c.recycle(b);
        batches += 1;
    }
    let (cpu, wall) = ((process_cpu() - cpu0).as_secs_f64(), start.elapsed().as_secs_f64());
    c.shutdown().expect("shutdown");
    reap(child);
    Async {
        join,
        batches,
        batches_per_s: batches as f64 / wall,
        cpu_per_batch: cpu / batches as f64,
    }
}

// ---------------------------------------------------------------- the swarm

fn swarm_env() -> (String, usize) {
    let addr = std::env::var("ROLLOUT_SCALE_ADDR").expect("ROLLOUT_SCALE_ADDR");
    let n = std::env::var("ROLLOUT_SCALE_COUNT")
        .ok()
        .and_then(|s| s.parse().ok())
        .expect("ROLLOUT_SCALE_COUNT");
    (addr, n)
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// The baseline's far end: `n` connections, each answering every frame with
/// [`RAW_REPLY`] bytes, until closed.
fn swarm_echo() {
    let (addr, n) = swarm_env();
    let local = tokio::task::LocalSet::new();
    local.block_on(&current_thread(), async move {
        let mut tasks = Vec::new();
        for _ in 0..n {
            let s = tokio::net::TcpStream::connect(&addr).await.expect("connect");
            s.set_nodelay(true).expect("nodelay");
            tasks.push(tokio::task::spawn_local(async move {
                let (r, mut w) = s.into_split();
                let mut r = BufReader::new(r);
                let reply = vec![0u8; RAW_REPLY];
                let mut req = vec![0u8; RAW_REQUEST];
                while r.read_exact(&mut req).await.is_ok() {
                    if w.write_all(&reply).await.is_err() {
                        break;
                    }
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
    });
}

/// `n` nodes joining the trainer at `ROLLOUT_SCALE_ADDR`, all on this thread; ends
/// once every node answered `Shutdown` (or lost its connection).
fn swarm_nodes() {
    let (addr, n) = swarm_env();
    let token = std::env::var("ROLLOUT_TOKEN").expect("ROLLOUT_TOKEN").into_bytes();
    let token = Rc::new(token);
    let failures = Rc::new(RefCell::new(0usize));
    let local = tokio::task::LocalSet::new();
    local.block_on(&current_thread(), async move {
        let tasks: Vec<_> = (0..n)
            .map(|i| {
                let (addr, token, failures) = (addr.clone(), Rc::clone(&token), Rc::clone(&failures));
                tokio::task::spawn_local(async move {
                    if let Err(e) = swarm_node(&addr, &token, i).await {
                        eprintln!("swarm node {i}: {e}");
                        *failures.borrow_mut() += 1;
                    }
                })
            })
            .collect();
        for t in tasks {
            let _ = t.await;
        }
        if *failures.borrow() > 0 {
            std::process::exit(1);
        }
    });
}

async fn read_frame<R: AsyncReadExt + Unpin>(r: &mut R, max: usize) -> Result<TrainerFrame, String> {
    let mut prefix = [0u8; PREFIX_LEN];
    r.read_exact(&mut prefix).await.map_err(|e| e.to_string())?;
    let len = wire::body_len(prefix, max).map_err(|e| e.to_string())?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await.map_err(|e| e.to_string())?;
    wire::decode(&body).map_err(|e| e.to_string())
}

/// One node: the login as `rollout node` does it, then its session and node machine
/// until `Shutdown`. Frames are read by a task of their own (reads are not
/// cancel-safe) and handed over, so heartbeats go out on time while it waits.
///
/// With `ROLLOUT_SCALE_OWN_BEATS=1` a node does not answer the trainer's heartbeats:
/// it beats on a timer of its own every interval, at a phase of its own (node `i`
/// spread over the interval), as nodes started at different times by different
/// people would if they did not answer (both nodes of this repository answer).
async fn swarm_node(addr: &str, token: &[u8], i: usize) -> Result<(), String> {
    let name = format!("swarm-{i}");
    let own_beats = std::env::var("ROLLOUT_SCALE_OWN_BEATS").is_ok_and(|v| v == "1");
    let mut backoff = Duration::from_millis(20);
    let s = loop {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(s) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
            Err(e) => return Err(format!("connect: {e}")),
        }
    };
    let _ = s.set_nodelay(true);
    match swarm_tls() {
        None => {
            let (r, w) = s.into_split();
            swarm_session(BufReader::new(r), w, token, i, name, own_beats).await
        }
        Some(connector) => {
            let ip = s.peer_addr().map_err(|e| e.to_string())?.ip();
            let tls = connector
                .connect(rustls::pki_types::ServerName::IpAddress(ip.into()), s)
                .await
                .map_err(|e| format!("TLS handshake: {e}"))?;
            let (r, w) = tokio::io::split(tls);
            swarm_session(BufReader::new(r), w, token, i, name, own_beats).await
        }
    }
}

/// The swarm's TLS connector when `ROLLOUT_SCALE_TLS_CA` names the CA (made once).
fn swarm_tls() -> Option<tokio_rustls::TlsConnector> {
    thread_local! {
        static CONNECTOR: Option<tokio_rustls::TlsConnector> = std::env::var_os("ROLLOUT_SCALE_TLS_CA").map(|ca| {
            let mut roots = rustls::RootCertStore::empty();
            for c in rustls::pki_types::CertificateDer::pem_file_iter(ca).expect("CA file") {
                roots.add(c.expect("CA certificate")).expect("CA added");
            }
            #[allow(deprecated)]
            let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("versions")
                .with_root_certificates(roots)
                .with_no_client_auth();
            tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        });
    }
    CONNECTOR.with(Clone::clone)
}

/// One node's login and session over its stream's halves (see [`swarm_node`]).
async fn swarm_session<R, W>(
    mut r: BufReader<R>,
    mut w: W,
    token: &[u8],
    i: usize,
    name: String,
    own_beats: bool,
) -> Result<(), String>
where
    R: tokio::io::AsyncRead + Unpin + 'static,
    W: tokio::io::AsyncWrite + Unpin,
{
    let encode = |f: &NodeFrame, max| wire::encode(f, max).map_err(|e| e.to_string());
    let mut hs = NodeHandshake::new(token, name, None);
    w.write_all(&encode(&hs.hello(), DEFAULT_MAX_FRAME)?)
        .await
        .map_err(|e| e.to_string())?;
    let welcome = loop {
        match hs.on_frame(read_frame(&mut r, DEFAULT_MAX_FRAME).await?) {
            NodeStep::Send(f) => w
                .write_all(&encode(&f, DEFAULT_MAX_FRAME)?)
                .await
                .map_err(|e| e.to_string())?,
            NodeStep::Welcomed(welcome) => break welcome,
            NodeStep::Rejected(reason) => return Err(format!("rejected: {reason}")),
            NodeStep::Violation(reason) => return Err(format!("protocol: {reason}")),
        }
    };
    let max = welcome.max_frame as usize;
    let mut node = NodeHarness::new(&welcome.spec, &Registry::with_builtins()).map_err(|e| e.to_string())?;
    let mut session = NodeSession::new(&welcome, Instant::now());
    let layout = node.worker(0).map(|r| r.batch_layout()).unwrap_or_default();
    let specs = node.worker(0).map(|r| r.env_specs());
    w.write_all(&encode(&session.ready(layout, specs), max)?)
        .await
        .map_err(|e| e.to_string())?;
    let (tx, mut frames) = tokio::sync::mpsc::unbounded_channel();
    let reader = tokio::task::spawn_local(async move {
        loop {
            let f = read_frame(&mut r, max).await;
            let end = f.is_err();
            if tx.send(f).is_err() || end {
                return;
            }
        }
    });
    // The heartbeat timer, moved on whenever the trainer's beat is answered (as
    // `rollout node` does).
    let every = session.heartbeat();
    // Node `i`'s own phase: a fixed scramble of its index over the interval.
    let phase = every.mul_f64(((i as u64).wrapping_mul(2_654_435_761) % 1000) as f64 / 1000.0);
    let first = if own_beats {
        Instant::now() + phase
    } else {
        session.next_beat()
    };
    let beat = tokio::time::sleep_until(first.into());
    tokio::pin!(beat);
    let result = loop {
        tokio::select! {
            f = frames.recv() => {
                let frame = match f {
                    Some(Ok(f)) => f,
                    Some(Err(e)) => break Err(format!("lost the trainer: {e}")),
                    None => break Err("reader gone".into()),
                };
                match session.on_frame(frame, Instant::now()) {
                    Inbound::Deliver(m) => {
                        let mut ended = false;
                        for out in node.send(m) {
                            ended |= NodeSession::ends(&out);
                            let bytes = encode(&NodeFrame::Message(out), max)?;
                            w.write_all(&bytes).await.map_err(|e| e.to_string())?;
                        }
                        if ended {
                            break Ok(());
                        }
                    }
                    Inbound::Answer if !own_beats => {
                        w.write_all(&encode(&NodeFrame::Heartbeat, max)?).await.map_err(|e| e.to_string())?;
                        session.beat_sent(Instant::now());
                        beat.as_mut().reset(session.next_beat().into());
                    }
                    Inbound::Answer | Inbound::Nothing => {}
                    Inbound::Close(reason) => break Err(reason),
                }
            }
            _ = &mut beat => {
                session.on_tick(Instant::now())?;
                w.write_all(&encode(&NodeFrame::Heartbeat, max)?).await.map_err(|e| e.to_string())?;
                session.beat_sent(Instant::now());
                let next = if own_beats { Instant::now() + every } else { session.next_beat() };
                beat.as_mut().reset(next.into());
            }
        }
    };
    reader.abort();
    result
}
