//! Remote collection against raw loopback TCP, measured in one run.
//!
//! (a) raw loopback TCP bandwidth: one socket, 4 MiB writes;
//! (b) in-process collection, 2 nodes x 1 env (async);
//! (c) collection with 2 process nodes over loopback (async);
//! (d) a weight update of a 10-million-parameter policy to 2 process nodes,
//!     against writing the same bytes twice over raw loopback.
//! (e) (c) with the trainer's metrics served, in windows alternately scraped every
//!     100 ms and not, in one run.
//! (f) TLS against plain TCP in the same run (issue 41), two collectors side by side
//!     pulled in alternating 0.5 s windows: (c) over TLS / (c) plain, as built and with
//!     `prefetch(1)`; 8 MiB batches
//!     (1,024 frames of 8 KiB) from 2 nodes joining over loopback, TLS / plain; and (d)
//!     over TLS / (d) plain. First the cipher's own rate (AES-128-GCM on one core), the
//!     floor of what TLS costs.
//! (g) (c) with the trainer's metrics counted (every batch's latency and policy lag
//!     observed, issue 39) against (c) with none, two collectors pulled in alternating
//!     0.5 s windows.
//! (h) (f)'s 8 MiB batches over a link of a given rate between two test hosts
//!     (`ROLLOUT_BENCH_ONLY=tls-link`, root; not in the default run).
//! Prints each figure, c/b, d/(2 x raw write), e (scraped / not), the TLS ratios and g.
//!
//! Run: `cargo bench -p rollout-benches --bench remote`. For profiling one part
//! (`perf record -a`), `ROLLOUT_BENCH_ONLY=local|process` collects for 3 s and
//! `ROLLOUT_BENCH_ONLY=weights` runs (d) for 30 rounds, `ROLLOUT_BENCH_ONLY=metrics` (e),
//! `ROLLOUT_BENCH_ONLY=tls` (f) alone, `ROLLOUT_BENCH_ONLY=wide-plain|wide-tls` one of (f)'s
//! 8 MiB collectors alone for 8 s, `ROLLOUT_BENCH_ONLY=counted` (g) alone,
//! `ROLLOUT_BENCH_ONLY=tls-link` (h) (`ROLLOUT_BENCH_LINK_RATES=1gbit,10gbit,none` picks
//! the rates).

use std::collections::BTreeMap;
use std::hint::black_box;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use ndarray::ArrayD;
use rollout::{PolicyConfig, Tensor, Weights};
use rollout_actors::{DistributedCollector, Launcher};
use rollout_benches::tls_cost::{secured, wide_collector};
use rollout_tests::{test_certs, TestCerts};

const F: usize = 10_000;

/// Bytes per second of one loopback socket carrying `total` bytes in large writes.
fn raw_tcp(total: usize) -> f64 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let reader = thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        let mut buf = vec![0u8; 4 << 20];
        let mut got = 0;
        while got < total {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
        got
    });
    let mut s = TcpStream::connect(addr).expect("connect");
    let chunk = vec![7u8; 4 << 20];
    let start = Instant::now();
    let mut sent = 0;
    while sent < total {
        let n = chunk.len().min(total - sent);
        s.write_all(&chunk[..n]).expect("write");
        sent += n;
    }
    let got = reader.join().expect("reader");
    assert_eq!(got, total);
    total as f64 / start.elapsed().as_secs_f64()
}

fn collector(launcher: Launcher, policy: PolicyConfig, fpb: usize, sync: bool) -> DistributedCollector {
    builder(launcher, policy, fpb, sync).build().expect("collector")
}

fn builder(launcher: Launcher, policy: PolicyConfig, fpb: usize, sync: bool) -> rollout_actors::CollectorBuilder {
    let mut b = DistributedCollector::builder()
        .sync(sync)
        .env("CartPole-v1")
        .policy(policy)
        .nodes(2)
        .envs_per_node(1)
        .frames_per_batch(fpb)
        .total_frames(-1)
        .seed(0)
        .launcher(launcher.clone());
    if launcher == Launcher::Process {
        b = b.node_program(rollout_tests::rollout_bin());
    }
    b
}

/// (e): 2 process nodes with metrics served, `rounds` pairs of 0.5 s windows, one
/// scraped every 100 ms and one not, in alternating order. (scraped, not, ratio,
/// scrapes) per pair.
fn scraped(rounds: usize) -> (Vec<f64>, Vec<f64>, Vec<f64>, u64) {
    let mut c = builder(Launcher::Process, PolicyConfig::Linear, F, false)
        .metrics("127.0.0.1:0")
        .build()
        .expect("collector");
    let addr = c.metrics_addr().expect("metrics served");
    let on = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let scraper = {
        let (on, stop) = (on.clone(), stop.clone());
        thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let next = Instant::now() + Duration::from_millis(100);
                if on.load(Ordering::Relaxed) {
                    let a = rollout_tests::http_get(addr, "/metrics").expect("scrape");
                    assert_eq!(a.status, Some(200));
                    n += 1;
                }
                thread::sleep(next.saturating_duration_since(Instant::now()));
            }
            n
        })
    };
    let (mut with, mut without, mut ratio) = (vec![], vec![], vec![]);
    for i in 0..rounds {
        let mut pair = [0.0; 2];
        for k in [i % 2, 1 - i % 2] {
            on.store(k == 0, Ordering::Relaxed);
            pair[k] = rate(&mut c, 0.5);
        }
        with.push(pair[0]);
        without.push(pair[1]);
        ratio.push(pair[0] / pair[1]);
    }
    stop.store(true, Ordering::Relaxed);
    let scrapes = scraper.join().expect("scraper");
    c.shutdown().expect("shutdown");
    (with, without, ratio, scrapes)
}

fn print_scraped(rounds: usize) {
    let (with, without, ratio, scrapes) = scraped(rounds);
    println!(
        "(e) (c) with metrics, scraped every 100 ms {:>12.0} frames/s, not {:>12.0}   e = {:.3} (median of {rounds} pairs; {scrapes} scrapes)",
        median(with),
        median(without),
        median(ratio)
    );
}

/// Frames per second pulled from `c` for about `secs`.
fn rate(c: &mut DistributedCollector, secs: f64) -> f64 {
    for _ in 0..4 {
        let b = c.next_batch().expect("batch").expect("endless");
        c.recycle(b);
    }
    let start = Instant::now();
    let mut frames = 0;
    while start.elapsed() < Duration::from_secs_f64(secs) {
        let b = c.next_batch().expect("batch").expect("endless");
        frames += b.data.numel();
        black_box(&b);
        c.recycle(b);
    }
    frames as f64 / start.elapsed().as_secs_f64()
}

/// (d): `rounds` updates of a 10-million-parameter MLP to 2 process nodes, each next
/// to writing the same bytes twice over raw loopback. (params, bytes, update s,
/// raw s, ratio) per round.
fn weight_update(rounds: usize) -> (usize, usize, Vec<f64>, Vec<f64>, Vec<f64>) {
    weight_update_over(rounds, None)
}

/// [`weight_update`] with the links over TLS when `certs`.
fn weight_update_over(rounds: usize, certs: Option<&TestCerts>) -> (usize, usize, Vec<f64>, Vec<f64>, Vec<f64>) {
    // (d) 10 M parameters: CartPole (4 obs, 2 actions), hidden [3160, 3160].
    let hidden = vec![3160, 3160];
    // Sync, one frame per node: the nodes are idle while weights are measured (a
    // forward pass of this policy takes milliseconds).
    let b = builder(Launcher::Process, PolicyConfig::Mlp { hidden: hidden.clone() }, 2, true);
    let mut w = secured(b, certs).build().expect("collector");
    w.next_batch().expect("batch").expect("endless");
    let shapes = [
        ("layers.0.weight", vec![3160, 4]),
        ("layers.0.bias", vec![3160]),
        ("layers.1.weight", vec![3160, 3160]),
        ("layers.1.bias", vec![3160]),
        ("layers.2.weight", vec![2, 3160]),
        ("layers.2.bias", vec![2]),
    ];
    let mut tensors = BTreeMap::new();
    for (k, s) in &shapes {
        tensors.insert(k.to_string(), Tensor::F32(ArrayD::from_elem(s.clone(), 0.001f32)));
    }
    let weights = Weights::new(tensors);
    let params = weights.numel();
    let bytes = params * 4;
    let (mut d, mut raw2, mut ratio) = (vec![], vec![], vec![]);
    for i in 0..rounds {
        // Seeding is a round trip through both nodes that queues behind the
        // weights on each connection: it returns once both nodes decoded them.
        let t0 = Instant::now();
        w.set_seed(i as u64).expect("seed");
        let chain = t0.elapsed().as_secs_f64();
        let copy = weights.clone();
        let t1 = Instant::now();
        w.update_policy_weights(copy, None).expect("push");
        w.set_seed(i as u64).expect("seed");
        let update = (t1.elapsed().as_secs_f64() - chain).max(1e-9);
        let raw = 2.0 * bytes as f64 / raw_tcp(bytes);
        d.push(update);
        raw2.push(raw);
        ratio.push(update / raw);
    }
    w.shutdown().expect("shutdown");
    (params, bytes, d, raw2, ratio)
}

/// `rounds` pairs of 0.5 s windows pulling `plain` and `tls` in turn (which goes first
/// alternating, so neither always has the warmer caches): the rates of each and the
/// per-round ratios TLS / plain.
fn alternate(
    plain: &mut DistributedCollector,
    tls: &mut DistributedCollector,
    rounds: usize,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    alternate_in(plain, tls, rounds, 0.5)
}

/// [`alternate`] in windows of `secs`.
fn alternate_in(
    plain: &mut DistributedCollector,
    tls: &mut DistributedCollector,
    rounds: usize,
    secs: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut p, mut t, mut r) = (vec![], vec![], vec![]);
    for i in 0..rounds {
        let (rp, rt) = if i % 2 == 0 {
            let rp = rate(plain, secs);
            (rp, rate(tls, secs))
        } else {
            let rt = rate(tls, secs);
            (rate(plain, secs), rt)
        };
        p.push(rp);
        t.push(rt);
        r.push(rt / rp);
    }
    (p, t, r)
}

/// (f): TLS against plain in the same run. Prints each pair's rates and the median of
/// the per-round ratios (TLS / plain; for the weight push, plain time / TLS time).
fn print_tls(rounds: usize) {
    let certs = test_certs();
    // The cipher's own rate on this core: whatever else TLS costs comes on top.
    let seal = rollout_benches::tls_cost::seal_rate();
    println!(
        "(f) AES-128-GCM alone, 16 KiB records, one core: {:.2} GB/s (sealing and opening a byte costs {:.3} ns of CPU)",
        seal / 1e9,
        2e9 / seal
    );
    let bytes = rollout_benches::tls_cost::wire_bytes_per_frame(
        builder(Launcher::Process, PolicyConfig::Linear, F, false),
        2,
        F,
    );
    // As built, then with each node one batch ahead (`prefetch`, issue 39): whether the
    // hand-over's round trip, which TLS lengthens, is what TLS costs.
    for prefetch in [0, 1] {
        let process = |certs: Option<&TestCerts>| {
            secured(
                builder(Launcher::Process, PolicyConfig::Linear, F, false).prefetch(prefetch),
                certs,
            )
            .build()
            .expect("collector")
        };
        let (mut plain, mut tls) = (process(None), process(Some(&certs)));
        let (p, t, r) = alternate(&mut plain, &mut tls, rounds);
        plain.shutdown().expect("shutdown");
        tls.shutdown().expect("shutdown");
        println!(
            "(f) CartPole, 10,000-frame batches, 2 process nodes, prefetch {prefetch}: plain {:>10.0} frames/s   TLS {:>10.0} frames/s   TLS/plain = {:.3}   ({bytes:.1} bytes a frame on the wire)",
            median(p),
            median(t),
            median(r)
        );
    }
    let wide_frames = 1024;
    let mb = (wide_frames * rollout_benches::tls_cost::WIDE_OBS * 4) as f64 / (1 << 20) as f64;
    let (mut plain, plain_nodes) = wide_collector(wide_frames, None, None);
    let (mut tls, tls_nodes) = wide_collector(wide_frames, Some(&certs), None);
    let (p, t, r) = alternate(&mut plain, &mut tls, rounds);
    plain.shutdown().expect("shutdown");
    tls.shutdown().expect("shutdown");
    for n in plain_nodes.into_iter().chain(tls_nodes) {
        let _ = n.join();
    }
    let bytes = |fps: f64| fps * (rollout_benches::tls_cost::WIDE_OBS * 4) as f64 / 1e9;
    println!(
        "(f) {mb:.0} MiB batches, 2 nodes over loopback:       plain {:>6.2} GB/s   TLS {:>6.2} GB/s   TLS/plain = {:.3}",
        bytes(median(p)),
        bytes(median(t)),
        median(r)
    );
    let (params, _, dp, _, _) = weight_update_over(rounds * 2 + 1, None);
    let (_, _, dt, _, _) = weight_update_over(rounds * 2 + 1, Some(&certs));
    let ratio: Vec<f64> = dp.iter().zip(&dt).map(|(p, t)| p / t).collect();
    println!(
        "(f) weight push, {:.1} M params to 2 nodes:         plain {:>7.1} ms   TLS {:>7.1} ms   plain/TLS = {:.3}",
        params as f64 / 1e6,
        median(dp) * 1e3,
        median(dt) * 1e3,
        median(ratio)
    );
}

/// Bits a second of a tc rate such as `2500mbit` or `10gbit`.
fn rate_bits(rate: &str) -> f64 {
    let (n, unit) = rate.split_at(rate.find(|c: char| !c.is_ascii_digit()).unwrap_or(rate.len()));
    let scale = match unit {
        "gbit" => 1e9,
        "mbit" => 1e6,
        "kbit" => 1e3,
        _ => 1.0,
    };
    n.parse::<f64>().expect("a rate like 10gbit") * scale
}

/// (h): (f)'s 8 MiB batches, TLS against plain, over a link between two test hosts
/// (network namespaces on a bridge, `scripts/hosts.sh`; needs root): the trainer on one,
/// both nodes on the other, the nodes' link limited by tc tbf to each rate of
/// `ROLLOUT_BENCH_LINK_RATES` (default `1gbit,2500mbit,5gbit,10gbit,none`, `none` the
/// bridge as it is), with a burst of 1 ms of the rate. Per rate: one socket's raw rate
/// over the link, then `rounds` pairs of windows as (f) (each at least 24 batches long
/// at the raw rate), the median ratio.
fn print_tls_link(rounds: usize) {
    let certs = test_certs();
    let hosts = rollout_tests::Hosts::up(2);
    let link = rollout_benches::tls_cost::Link {
        trainer_ns: hosts.ns(0),
        trainer_addr: hosts.addr(0),
        node_ns: hosts.ns(1),
    };
    let rates = std::env::var("ROLLOUT_BENCH_LINK_RATES").unwrap_or_else(|_| "1gbit,2500mbit,5gbit,10gbit,none".into());
    let per_frame = (rollout_benches::tls_cost::WIDE_OBS * 4) as f64;
    for rate in rates.split(',') {
        if rate != "none" {
            let burst = format!("{}b", ((rate_bits(rate) / 8.0 / 1000.0) as u64).max(4096));
            hosts.slow_with_burst(1, rate, &burst);
        }
        let raw = rollout_benches::tls_cost::raw_link(&link, 2.0);
        let (mut plain, plain_nodes) = wide_collector(1024, None, Some(&link));
        let (mut tls, tls_nodes) = wide_collector(1024, Some(&certs), Some(&link));
        // Windows of at least 24 batches at the link's raw rate: a slow link's 0.5 s
        // window holds a handful, and one batch more or less would be the ratio.
        let secs = (24.0 * 1024.0 * per_frame / raw).max(0.5);
        let (p, t, r) = alternate_in(&mut plain, &mut tls, rounds, secs);
        plain.shutdown().expect("shutdown");
        tls.shutdown().expect("shutdown");
        for n in plain_nodes.into_iter().chain(tls_nodes) {
            let _ = n.join();
        }
        println!(
            "(h) 8 MiB batches over a {rate:>8} link: raw socket {:>6.3} GB/s   plain {:>6.3} GB/s   TLS {:>6.3} GB/s   TLS/plain = {:.3} (median of {rounds}; {:.3}..{:.3})",
            raw / 1e9,
            median(p) * per_frame / 1e9,
            median(t) * per_frame / 1e9,
            median(r.clone()),
            r.iter().copied().fold(f64::INFINITY, f64::min),
            r.iter().copied().fold(0.0, f64::max)
        );
        hosts.clear(1);
    }
}

/// (g): the trainer's metrics counted (served, not scraped) against none, two collectors
/// of 2 process nodes side by side in alternating windows; `rounds` pairs, the median of
/// the per-round ratios (counted / none).
fn print_counted(rounds: usize) {
    let mut none = builder(Launcher::Process, PolicyConfig::Linear, F, false)
        .build()
        .expect("collector");
    let mut counted = builder(Launcher::Process, PolicyConfig::Linear, F, false)
        .metrics("127.0.0.1:0")
        .build()
        .expect("collector");
    let (n, c, r) = alternate(&mut none, &mut counted, rounds);
    none.shutdown().expect("shutdown");
    counted.shutdown().expect("shutdown");
    println!(
        "(g) (c) with metrics counted {:>12.0} frames/s, none {:>12.0}   g = {:.3} (median of {rounds} pairs)",
        median(c),
        median(n),
        median(r)
    );
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    // Profiling aids: `ROLLOUT_BENCH_ONLY=local|process` collects for 3 s and prints
    // the rate; `ROLLOUT_BENCH_ONLY=weights` runs 30 weight updates.
    if let Ok(which) = std::env::var("ROLLOUT_BENCH_ONLY") {
        if which == "metrics" {
            print_scraped(20);
            return;
        }
        if which == "tls" {
            print_tls(9);
            return;
        }
        if which == "tls-link" {
            print_tls_link(9);
            return;
        }
        if let Some(kind) = which.strip_prefix("wide-") {
            // One of (f)'s 8 MiB collectors alone for 8 s (`wide-plain`, `wide-tls`).
            let certs = test_certs();
            let (mut c, nodes) = wide_collector(1024, (kind == "tls").then_some(&certs), None);
            let fps = rate(&mut c, 8.0);
            c.shutdown().expect("shutdown");
            for n in nodes {
                let _ = n.join();
            }
            println!(
                "{which}: {:.2} GB/s",
                fps * (rollout_benches::tls_cost::WIDE_OBS * 4) as f64 / 1e9
            );
            return;
        }
        if which == "counted" {
            print_counted(15);
            return;
        }
        if which == "weights" {
            let (_, _, d, raw2, ratio) = weight_update(30);
            println!(
                "weights: {:.1} ms, raw x2 {:.1} ms, d/raw {:.2}",
                median(d) * 1e3,
                median(raw2) * 1e3,
                median(ratio)
            );
            return;
        }
        let launcher = if which == "process" {
            Launcher::Process
        } else {
            Launcher::Local
        };
        let mut c = collector(launcher, PolicyConfig::Linear, F, false);
        println!("{which}: {:.0} frames/s", rate(&mut c, 3.0));
        c.shutdown().expect("shutdown");
        return;
    }
    let rounds = 5;
    let mut inproc = collector(Launcher::Local, PolicyConfig::Linear, F, false);
    let mut remote = collector(Launcher::Process, PolicyConfig::Linear, F, false);
    let (mut a, mut b, mut c, mut cb) = (vec![], vec![], vec![], vec![]);
    for _ in 0..rounds {
        let ra = raw_tcp(256 << 20);
        let rb = rate(&mut inproc, 0.5);
        let rc = rate(&mut remote, 0.5);
        a.push(ra);
        b.push(rb);
        c.push(rc);
        cb.push(rc / rb);
    }
    inproc.shutdown().expect("shutdown");
    remote.shutdown().expect("shutdown");
    println!("median of {rounds} interleaved rounds");
    println!("(a) raw loopback TCP, one socket      {:>8.2} GB/s", median(a) / 1e9);
    println!(
        "(b) in-process, 2 nodes x 1 env       {:>12.0} frames/s",
        median(b.clone())
    );
    println!(
        "(c) 2 process nodes over loopback     {:>12.0} frames/s   c/b = {:.3}",
        median(c),
        median(cb)
    );

    let (params, bytes, d, raw2, ratio) = weight_update(31);
    println!(
        "(d) weight update (median of 31), {:.1} M params ({:.0} MB) to 2 nodes  {:>7.1} ms   raw loopback x2 {:>7.1} ms   d/raw = {:.2}",
        params as f64 / 1e6,
        bytes as f64 / 1e6,
        median(d) * 1e3,
        median(raw2) * 1e3,
        median(ratio)
    );
    print_scraped(10);
    print_tls(9);
    print_counted(9);
}
