//! Replay buffer hand-off: the collector writes every batch into a shared buffer
//! (torchrl's `replay_buffer=` argument) and a learner samples from it meanwhile.

use std::sync::mpsc;
use std::time::Duration;

use rollout::rollout::keys;
use rollout::PolicyConfig;
use rollout_actors::{replay, CollectError, DistributedCollector, SharedReplayBuffer};

fn collector(buffer: SharedReplayBuffer, total: i64) -> DistributedCollector {
    DistributedCollector::builder()
        .env("Counting")
        .policy(PolicyConfig::Constant { value: 1.0 })
        .nodes(2)
        .envs_per_node(2)
        .frames_per_batch(20)
        .total_frames(total)
        .seed(5)
        .replay_buffer(buffer)
        .build()
        .expect("valid config")
}

#[test]
fn a_run_fills_the_buffer_with_exactly_total_frames() {
    let buffer = replay::shared(1000, 0).expect("capacity");
    let mut c = collector(buffer.clone(), 200);
    let mut batches = 0;
    while let Some(b) = c.next_batch().expect("batch") {
        batches += 1;
        assert!(b.data.is_empty(), "the frames went to the buffer");
        assert_eq!(b.data.numel(), 20, "the batch shape still counts them");
        assert!(b.node.is_some());
    }
    c.shutdown().expect("shutdown");
    assert_eq!(batches, 10);
    let rb = replay::lock(&buffer);
    assert_eq!((rb.len(), rb.frames_written()), (200, 200));
    let all = rb.contents().expect("contents").expect("frames");
    let mut ids: Vec<(i64, i64)> = all
        .i64(keys::TRAJ_IDS)
        .expect("ids")
        .iter()
        .zip(all.i64(keys::STEP_COUNT).expect("steps").iter())
        .map(|(&i, &s)| (i, s))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 200, "every frame stored once");
}

#[test]
fn the_buffer_keeps_the_newest_frames_up_to_capacity() {
    let buffer = replay::shared(150, 0).expect("capacity");
    let mut c = collector(buffer.clone(), 200);
    while c.next_batch().expect("batch").is_some() {}
    c.shutdown().expect("shutdown");
    let mut rb = replay::lock(&buffer);
    assert_eq!((rb.len(), rb.capacity(), rb.frames_written()), (150, 150, 200));
    let s = rb.sample(32).expect("sample");
    assert_eq!(s.batch_size(), &[32]);
    let keys: Vec<&str> = s.keys().collect();
    for k in [
        keys::OBSERVATION,
        keys::ACTION,
        keys::NEXT_OBSERVATION,
        keys::NEXT_REWARD,
        keys::NEXT_DONE,
        keys::TRAJ_IDS,
        keys::STEP_COUNT,
    ] {
        assert!(keys.contains(&k), "{k} in {keys:?}");
    }
    assert_eq!(s.get(keys::OBSERVATION).expect("obs").shape(), &[32, 1]);
    assert_eq!(s.get(keys::TRAJ_IDS).expect("ids").shape(), &[32]);
}

#[test]
fn a_learner_samples_while_collection_runs() {
    // The collector stops after these batches and lets the learner sample there:
    // the run is in its middle (it goes on afterwards) each time.
    const PAUSES: [usize; 3] = [0, 10, 20];
    let buffer = replay::shared(10_000, 1).expect("capacity");
    let (paused_tx, paused_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let writer = buffer.clone();
    let collecting = std::thread::spawn(move || -> Result<usize, CollectError> {
        let mut c = collector(writer, -1);
        let mut frames = 0;
        for i in 0..30 {
            let b = c.next_batch()?.expect("endless");
            frames += b.data.numel();
            if PAUSES.contains(&i) {
                let _ = paused_tx.send(());
                let _ = go_rx.recv_timeout(Duration::from_secs(30));
            }
        }
        c.shutdown()?;
        Ok(frames)
    });
    let mut written = Vec::new();
    for i in PAUSES {
        paused_rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("no batch {i}"));
        let s = replay::sample(&buffer, 64).expect("a sample mid-run");
        assert_eq!(s.batch_size(), &[64]);
        assert_eq!(s.get(keys::OBSERVATION).expect("obs").shape(), &[64, 1]);
        written.push(replay::lock(&buffer).frames_written());
        go_tx.send(()).expect("collector waiting");
    }
    let frames = collecting.join().expect("no panic").expect("collection");
    assert_eq!(frames, 600);
    assert_eq!(replay::lock(&buffer).frames_written(), 600);
    // Each sample saw at least the batches yielded so far, and fewer than the run's
    // frames: the learner sampled three times while the buffer was being filled.
    for (i, w) in PAUSES.iter().zip(&written) {
        assert!(
            (20 * (i + 1) as u64..600).contains(w),
            "after batch {i}: {w} frames written ({written:?})"
        );
    }
    assert!(written.windows(2).all(|w| w[0] < w[1]), "the buffer grew: {written:?}");
}

#[test]
fn replay_buffer_with_split_trajs_is_refused() {
    let buffer = replay::shared(10, 0).expect("capacity");
    let err = DistributedCollector::builder()
        .env("Counting")
        .frames_per_batch(10)
        .split_trajs(true)
        .replay_buffer(buffer)
        .build()
        .expect_err("padding is no frame");
    assert!(
        matches!(err, CollectError::Config(ref e) if e.field == "replay_buffer"),
        "{err}"
    );
}
