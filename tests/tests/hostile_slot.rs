//! One token holder cannot end a run it does not own: over real loopback sockets, a
//! run of two honest nodes and a scripted peer that takes slot 2 again and again,
//! each time announcing a `ready` the trainer refuses, faster than the restart
//! intensity allows restarts. The nodes join on their own (the external launcher),
//! so each refusal is that peer's failure, not a crash loop of the slot: an async run
//! ends exact with the honest nodes' frames; a sync run, which needs the slot, fails
//! within its join timeout naming the slot and the refusals.
//!
//! Each runs over plain TCP, then over TLS (issue 41): the honest nodes join over TLS,
//! the peer's raw frames reach the trainer through a `TlsFront`, inside TLS.

use std::net::SocketAddr;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use rollout::message::FromNode;
use rollout::rollout::BatchLayout;
use rollout::wire::{NodeFrame, TrainerFrame};
use rollout_actors::remote::NodeTls;
use rollout_actors::{CollectError, DistributedCollector};
use rollout_tests::{
    built_on_a_thread, connect, external_counting_builder, good_node_over, handshake, recv, send, test_certs,
    unique_name, TestCerts, TlsFront,
};

const TOKEN: &[u8] = b"hostile-slot-token-0123456789abcd";
const DEADLINE: Duration = Duration::from_secs(30);
const ENVS: usize = 2;
const FPB: usize = 1200;
/// The slot the peer takes; the honest nodes hold 0 and 1.
const SLOT: usize = 2;
/// Times the peer is refused: more than the intensity's 3 restarts in 60 s.
const TIMES: usize = 6;

/// A trainer expecting three external nodes of [`ENVS`] Counting envs, supervised as
/// the CLI supervises remote nodes (3 restarts within 60 s), built on a thread (the
/// build waits for the joins).
fn trainer(
    sync: bool,
    total: i64,
    join_timeout: Duration,
    link: &Link,
) -> (JoinHandle<DistributedCollector>, SocketAddr) {
    let b = external_counting_builder(TOKEN, 3, ENVS)
        .frames_per_batch(FPB)
        .total_frames(total)
        .sync(sync)
        .node_max_restarts(3)
        .node_restart_window(Duration::from_secs(60))
        .join_timeout(join_timeout);
    built_on_a_thread(match &link.certs {
        Some(c) => b.tls_cert(&c.trainer_cert).tls_key(&c.trainer_key),
        None => b,
    })
}

/// How a scenario's links run: plain TCP, or TLS (the certificates made for it).
struct Link {
    certs: Option<TestCerts>,
}

impl Link {
    /// Plain, then TLS.
    fn both() -> [Link; 2] {
        [
            Link { certs: None },
            Link {
                certs: Some(test_certs()),
            },
        ]
    }

    /// Where the peer connects: the trainer, or a TLS front to it.
    fn peer_addr(&self, trainer: SocketAddr) -> SocketAddr {
        match &self.certs {
            Some(c) => TlsFront::start(trainer, &c.ca).addr(),
            None => trainer,
        }
    }

    /// An honest node joining `trainer` for slot `index`.
    fn good_node(&self, trainer: SocketAddr, index: usize) -> JoinHandle<Result<(), String>> {
        let tls = self.certs.as_ref().map(|c| NodeTls {
            ca: c.ca.clone(),
            ..NodeTls::default()
        });
        good_node_over(trainer, TOKEN, Some(index), unique_name("good"), tls)
    }
}

/// Joins slot [`SLOT`] and announces an empty layout, which the trainer refuses;
/// returns once the trainer closed the connection. `false` when the slot was not
/// free (the trainer rejected the join) or the run is over.
fn refused_once(addr: SocketAddr) -> bool {
    let mut s = connect(addr, DEADLINE);
    let TrainerFrame::Welcome(_) = handshake(&mut s, TOKEN, &unique_name("hostile-slot"), Some(SLOT)) else {
        return false;
    };
    send(
        &mut s,
        &NodeFrame::Message(FromNode::Ready {
            node: SLOT,
            layout: BatchLayout::new(),
            specs: None,
        }),
    );
    // Heartbeats until the trainer closes the connection for the refused `ready`.
    while recv(&mut s).is_some() {}
    true
}

/// The peer: refused `TIMES` times (retrying while its slot is held), within the
/// deadline. Returns how many times it was refused.
fn hostile_peer(addr: SocketAddr) -> JoinHandle<usize> {
    thread::spawn(move || {
        let end = Instant::now() + DEADLINE;
        let mut refused = 0;
        while refused < TIMES && Instant::now() < end {
            if refused_once(addr) {
                refused += 1;
            } else {
                thread::sleep(Duration::from_millis(20));
            }
        }
        refused
    })
}

#[test]
fn async_a_peer_refused_again_and_again_in_a_slot_does_not_end_the_run() {
    for link in Link::both() {
        async_refused_peer(&link);
    }
}

fn async_refused_peer(link: &Link) {
    // Large enough that the run outlasts the peer's refusals.
    let total = 480_000;
    let (t, addr) = trainer(false, total, DEADLINE, link);
    let peer = hostile_peer(link.peer_addr(addr));
    let good = [link.good_node(addr, 0), link.good_node(addr, 1)];
    let mut c = t.join().expect("trainer thread");
    let mut frames = 0;
    let mut from = Vec::new();
    let refused = loop {
        match c.next_batch().expect("the run goes on") {
            Some(b) => {
                frames += b.data.numel();
                from.push(b.node);
            }
            None => break peer.join().expect("peer thread"),
        }
        if peer.is_finished() && frames >= total as usize / 2 {
            // Half the run is left to show that it carries on after the refusals.
            let refused = peer.join().expect("peer thread");
            while let Some(b) = c.next_batch().expect("the run goes on") {
                frames += b.data.numel();
                from.push(b.node);
            }
            break refused;
        }
    };
    c.shutdown().expect("shutdown");
    assert_eq!(refused, TIMES, "the peer was admitted and refused each time");
    assert_eq!(frames, total as usize, "the run ends exact");
    assert!(
        from.iter().all(|n| matches!(n, Some(0 | 1))),
        "every batch from the honest nodes: {from:?}"
    );
    for g in good {
        assert_eq!(g.join().expect("node thread"), Ok(()));
    }
}

#[test]
fn sync_a_slot_held_only_by_a_refused_peer_fails_the_run_naming_the_slot_within_its_wait() {
    for link in Link::both() {
        sync_slot_held_by_a_refused_peer(&link);
    }
}

fn sync_slot_held_by_a_refused_peer(link: &Link) {
    let wait = Duration::from_secs(3);
    let (t, addr) = trainer(true, 1_200_000, wait, link);
    let peer = hostile_peer(link.peer_addr(addr));
    let good = [link.good_node(addr, 0), link.good_node(addr, 1)];
    let mut c = t.join().expect("trainer thread");
    let started = Instant::now();
    let err = loop {
        match c.next_batch() {
            Ok(Some(b)) => assert!(matches!(b.node, None | Some(0 | 1)), "a batch from {:?}", b.node),
            Ok(None) => panic!("the run cannot finish without slot {SLOT}"),
            Err(e) => break e,
        }
    };
    let waited = started.elapsed();
    let _ = c.shutdown();
    match &err {
        CollectError::NodeFailed { node, reason } => {
            assert_eq!(*node, SLOT, "{reason}");
            assert!(reason.contains(&format!("slot {SLOT}")), "{reason}");
            assert!(reason.contains("layout"), "the refusal is named: {reason}");
        }
        other => panic!("expected the slot's failure, got {other}"),
    }
    assert!(
        waited < DEADLINE,
        "failed within its wait, not at the batch deadline: {waited:?}"
    );
    let _ = peer.join();
    for g in good {
        let _ = g.join();
    }
}
