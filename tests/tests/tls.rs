//! TLS on the trainer–node links (issue 41): a run over TLS and over mutual TLS yields
//! the very frames of the same seeded run over plain TCP; what the door refuses over
//! TLS (garbage, a stalled handshake, a node with the wrong CA, a node without a
//! client certificate) is closed with a logged reason while the run goes on; settings
//! that cannot work are refused at build time naming the setting and the file.
//! Certificates are made for each test ([`test_certs`]), none is checked in.

use std::io::Write;
use std::net::SocketAddr;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use rollout_actors::remote::{run_node, NodeOptions, NodeTls};
use rollout_actors::{CollectError, Collected, CollectorBuilder, DistributedCollector, Launcher};
use rollout_tests::{
    attacker, built_on_a_thread, cartpole_sync_builder, drain, external_counting_builder, rollout_bin, test_certs,
    unique_name, venv_python, wait_closed, OwnLog, TestCerts,
};

const TOKEN: &[u8] = b"tls-suite-token-0123456789abcdef";

/// How the trainer's links are secured in a run.
#[derive(Clone, Copy, Debug)]
enum Link {
    Plain,
    Tls,
    MutualTls,
}

/// `b` with the trainer's side of `link`, and what its process nodes are told.
fn secured(b: CollectorBuilder, certs: &TestCerts, link: Link) -> CollectorBuilder {
    let tls = |b: CollectorBuilder| {
        b.tls_cert(&certs.trainer_cert)
            .tls_key(&certs.trainer_key)
            .tls_ca(&certs.ca)
    };
    match link {
        Link::Plain => b,
        Link::Tls => tls(b),
        Link::MutualTls => tls(b)
            .tls_client_ca(&certs.ca)
            .node_tls_cert(&certs.node_cert)
            .node_tls_key(&certs.node_key),
    }
}

/// The seeded sync CartPole run with two `rollout node` processes over `link`.
fn process_run(certs: &TestCerts, link: Link) -> Vec<Collected> {
    let b = cartpole_sync_builder(11)
        .launcher(Launcher::Process)
        .node_program(rollout_bin())
        .join_timeout(Duration::from_secs(30))
        .batch_timeout(Duration::from_secs(30));
    let mut c = secured(b, certs, link).build().expect("collector");
    drain(&mut c)
}

#[test]
fn a_run_over_tls_and_mutual_tls_yields_the_frames_of_the_plain_run() {
    let certs = test_certs();
    let plain = process_run(&certs, Link::Plain);
    assert_eq!(plain.len(), 5);
    for link in [Link::Tls, Link::MutualTls] {
        let secure = process_run(&certs, link);
        assert_eq!(secure.len(), plain.len(), "{link:?}");
        for (x, y) in secure.iter().zip(&plain) {
            assert_eq!(x.index, y.index, "{link:?}");
            assert_eq!(
                x.data, y.data,
                "{link:?}: batch {} differs from the plain run's",
                x.index
            );
        }
    }
}

/// The seeded sync CartPole run with two Python nodes (`python -m rollout_node` of this
/// tree, with the standard library's `ssl`) over `link`.
fn python_run(py: &std::path::Path, certs: &TestCerts, link: Link) -> Vec<Collected> {
    let node = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../python/node");
    let b = cartpole_sync_builder(11)
        .launcher(Launcher::Process)
        .node_command([
            "env".into(),
            format!("PYTHONPATH={}", node.display()).into(),
            py.as_os_str().to_owned(),
            "-m".into(),
            "rollout_node".into(),
        ] as [std::ffi::OsString; 5])
        .join_timeout(Duration::from_secs(60))
        .batch_timeout(Duration::from_secs(60));
    let mut c = secured(b, certs, link).build().expect("collector");
    drain(&mut c)
}

#[test]
fn python_nodes_over_tls_and_mutual_tls_yield_the_frames_of_their_plain_run() {
    let Some(py) = venv_python() else { return };
    let certs = test_certs();
    let plain = python_run(&py, &certs, Link::Plain);
    assert_eq!(plain.len(), 5);
    for link in [Link::Tls, Link::MutualTls] {
        let secure = python_run(&py, &certs, link);
        assert_eq!(secure.len(), plain.len(), "{link:?}");
        for (x, y) in secure.iter().zip(&plain) {
            assert_eq!(
                x.data, y.data,
                "{link:?}: batch {} differs from the plain run's",
                x.index
            );
        }
    }
}

/// The node's TLS of the test: the CA `ca`, and a client certificate when `client`.
fn node_tls(certs: &TestCerts, ca: &std::path::Path, client: bool) -> NodeTls {
    NodeTls {
        ca: ca.to_path_buf(),
        server_name: None,
        cert: client.then(|| certs.node_cert.clone()),
        key: client.then(|| certs.node_key.clone()),
    }
}

/// A library node joining `addr` on a thread, with `tls`: how its run ended.
fn node(addr: SocketAddr, tls: Option<NodeTls>) -> JoinHandle<Result<(), String>> {
    thread::spawn(move || {
        let opts = NodeOptions {
            name: unique_name("tls-node"),
            connect_timeout: Duration::from_secs(30),
            tls,
            ..NodeOptions::default()
        };
        run_node(&addr.to_string(), TOKEN, opts).map_err(|e| e.to_string())
    })
}

/// An external trainer of two nodes over TLS (mutual when `mutual`), 4,000 frames,
/// handshake deadline `handshake`.
fn tls_trainer(certs: &TestCerts, mutual: bool, handshake: Duration) -> (JoinHandle<DistributedCollector>, SocketAddr) {
    let b = external_counting_builder(TOKEN, 2, 2)
        .frames_per_batch(400)
        .total_frames(4000)
        .handshake_timeout(handshake)
        .tls_cert(&certs.trainer_cert)
        .tls_key(&certs.trainer_key);
    built_on_a_thread(if mutual { b.tls_client_ca(&certs.ca) } else { b })
}

/// The run goes on with two good nodes and ends exact.
fn two_good_nodes_finish(t: JoinHandle<DistributedCollector>, addr: SocketAddr, tls: NodeTls) {
    let nodes = [node(addr, Some(tls.clone())), node(addr, Some(tls))];
    let mut c = t.join().expect("trainer");
    let frames: usize = drain(&mut c).iter().map(|b| b.data.numel()).sum();
    assert_eq!(frames, 4000);
    drop(c);
    for n in nodes {
        n.join()
            .expect("node thread")
            .expect("a good node serves the run to its end");
    }
}

#[test]
fn a_node_with_the_wrong_ca_is_refused_and_the_run_goes_on_with_the_others() {
    let certs = test_certs();
    let (t, addr) = tls_trainer(&certs, false, Duration::from_secs(5));
    let wrong = node(addr, Some(node_tls(&certs, &certs.other_ca, false)))
        .join()
        .expect("node thread");
    let err = wrong.expect_err("a node that cannot verify the trainer does not join");
    assert!(err.contains("TLS handshake failed"), "{err}");
    assert!(err.contains("UnknownIssuer"), "{err}");
    // The trainer saw the node give up in the handshake, and logged why.
    assert!(
        rollout_tests::poll_until(Instant::now() + Duration::from_secs(30), || {
            rollout_tests::log_text().contains("TLS handshake failed").then_some(())
        })
        .is_some(),
        "the refusal was logged"
    );
    // A plain node, speaking msgpack to a TLS door, is refused too.
    let plain = node(addr, None).join().expect("node thread");
    assert!(plain.is_err(), "a plain node joined a TLS trainer");
    two_good_nodes_finish(t, addr, node_tls(&certs, &certs.ca, false));
}

#[test]
fn under_mutual_tls_a_node_without_a_client_certificate_is_refused() {
    let certs = test_certs();
    let (t, addr) = tls_trainer(&certs, true, Duration::from_secs(5));
    let anonymous = node(addr, Some(node_tls(&certs, &certs.ca, false)))
        .join()
        .expect("node thread");
    let err = anonymous.expect_err("a node without a certificate does not join");
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    assert!(
        rollout_tests::poll_until(Instant::now() + Duration::from_secs(30), || {
            let log = rollout_tests::log_text();
            log.contains("TLS handshake failed: peer sent no certificates")
                .then_some(())
        })
        .is_some(),
        "the refusal was logged with its reason:\n{}",
        rollout_tests::log_text()
    );
    two_good_nodes_finish(t, addr, node_tls(&certs, &certs.ca, true));
}

#[test]
fn tls_handshake_garbage_is_closed_with_a_logged_reason_and_the_run_carries_on() {
    let certs = test_certs();
    let (t, addr) = tls_trainer(&certs, false, Duration::from_secs(5));
    for garbage in [
        // A msgpack hello, as a plain node would send it.
        b"\x00\x00\x00\x05\x81\xa4type".to_vec(),
        // A TLS record header announcing a handshake, then noise.
        [&[0x16, 0x03, 0x01, 0x00, 0x20][..], &[0xab; 32]].concat(),
        // Noise.
        (0..4096u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect(),
    ] {
        let mut s = attacker(addr);
        let log = OwnLog::peer(&s);
        let _ = s.write_all(&garbage);
        let closed = wait_closed(&mut s, Duration::from_secs(15));
        assert!(closed.after < Duration::from_secs(15), "{closed:?}");
        log.assert_logged("TLS handshake failed");
        // Rate-limited to one line a second: space the attacks out.
        thread::sleep(Duration::from_millis(1100));
    }
    two_good_nodes_finish(t, addr, node_tls(&certs, &certs.ca, false));
}

#[test]
fn a_stalled_tls_handshake_is_cut_at_the_login_deadline() {
    let certs = test_certs();
    let (t, addr) = tls_trainer(&certs, false, Duration::from_millis(500));
    // Silent from the start; and a ClientHello's record header, its body never sent.
    for first in [Vec::new(), vec![0x16, 0x03, 0x01, 0x02, 0x00]] {
        let mut s = attacker(addr);
        let log = OwnLog::peer(&s);
        s.write_all(&first).expect("write");
        let closed = wait_closed(&mut s, Duration::from_secs(10));
        assert!(
            closed.after >= Duration::from_millis(400) && closed.after < Duration::from_secs(8),
            "closed after {:?}",
            closed.after
        );
        assert!(closed.got.is_empty(), "nothing sent on a stalled handshake: {closed:?}");
        log.assert_logged("handshake not done within 0.5 s");
        thread::sleep(Duration::from_millis(1100));
    }
    two_good_nodes_finish(t, addr, node_tls(&certs, &certs.ca, false));
}

/// The field of a build's config error.
fn refused_field(b: CollectorBuilder) -> (String, String) {
    match b.build() {
        Err(CollectError::Config(e)) => (e.field.to_string(), e.reason),
        Err(other) => panic!("not a config error: {other}"),
        Ok(_) => panic!("built"),
    }
}

#[test]
fn unusable_tls_settings_are_refused_at_build_time_naming_the_setting_and_the_file() {
    let certs = test_certs();
    let base = || {
        external_counting_builder(TOKEN, 1, 1)
            .frames_per_batch(100)
            .total_frames(100)
    };
    let missing = certs.dir().join("missing.pem");
    let (field, reason) = refused_field(base().tls_cert(&missing).tls_key(&certs.trainer_key));
    assert_eq!(field, "tls_cert");
    assert!(reason.contains("missing.pem"), "{reason}");
    // A key file that holds a certificate.
    let (field, reason) = refused_field(base().tls_cert(&certs.trainer_cert).tls_key(&certs.trainer_cert));
    assert_eq!(field, "tls_key");
    assert!(reason.contains("trainer.pem"), "{reason}");
    // The key of another certificate.
    let (field, _) = refused_field(base().tls_cert(&certs.trainer_cert).tls_key(&certs.node_key));
    assert_eq!(field, "tls_key");
    let (field, _) = refused_field(base().tls_cert(&certs.trainer_cert));
    assert_eq!(field, "tls_key");
    let (field, _) = refused_field(base().tls_ca(&certs.ca));
    assert_eq!(field, "tls_ca", "a node CA without a trainer certificate");
    // Process nodes need the CA to check the trainer against.
    let process = || {
        cartpole_sync_builder(0)
            .launcher(Launcher::Process)
            .node_program(rollout_bin())
            .tls_cert(&certs.trainer_cert)
            .tls_key(&certs.trainer_key)
    };
    let (field, _) = refused_field(process());
    assert_eq!(field, "tls_ca");
    let (field, _) = refused_field(process().tls_ca(&certs.ca).tls_client_ca(&certs.ca));
    assert_eq!(field, "node_tls_cert");
    let (field, reason) = refused_field(process().tls_ca(certs.dir().join("nope.pem")));
    assert_eq!(field, "tls_ca");
    assert!(reason.contains("nope.pem"), "{reason}");
}
