//! Encoding and decoding speed of a 40 MB weights frame against a plain memcpy of the same bytes.
//!
//! DESIGN rule 3: a tensor goes on the wire as a header plus one little-endian blob written
//! straight from the array's memory, so encoding and decoding should run at memory speed.
//! Baselines, measured in the same run: `memcpy` into a reused buffer (the physical limit, what
//! encoding into a reused output buffer can reach) and `to_vec` (memcpy into a fresh allocation,
//! what decoding must pay at least, since it builds a new array). For reference, the
//! element-by-element `to_le_bytes` copy (the path used before the blob was written in place).
//! Decoding is measured twice: into fresh memory, and into storage from a [`TensorPool`] (what a
//! remote node's connection does with a retired weight version), which should reach memcpy speed.
//! Last, the whole receive path of a connection: the frame read in 64 KiB pieces (from memory
//! here, standing in for the socket) by a `FrameReader`, which lands the tensor's bytes straight
//! in pooled storage, then decoded: one copy in all, so memcpy speed.
//! Prints MB/s (1 MB = 10^6 bytes) of the blob and the ratios against the baselines.
//!
//! Then the other end of the scale: a small `batch` frame, as a trainer reads one per node
//! and round (10 `Counting` frames, every key a batch has), decoded into pooled storage (the
//! last batch recycled into the pool, as a connection does) against the plain decode of the
//! same frame (fresh memory), in µs per frame.
//!
//! The small frame is measured in both forms a node may send (PROTOCOL.md §3, Ends): with
//! `next.observation` whole, and as a version-9 node sends it, each observation once.
//!
//! Last, a pixel batch (Pong's raw 210x160x3 u8 frames, 4 envs x 64 steps, an episode end in
//! each env) through the whole receive path (`FrameReader` in 64 KiB pieces, decode into the
//! pool), in both forms: the trainer's CPU per frame of each and the bytes on the wire per
//! frame against one observation. The reads here come from memory; a socket adds the kernel's
//! copy of every byte, which the compact form halves.
//!
//! Run: `cargo bench -p rollout-benches --bench wire`

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ndarray::{ArrayD, IxDyn};
use rollout::env::{Counting, CountingConfig, Env};
use rollout::frame_decode::decode_pooled;
use rollout::frame_reader::FrameReader;
use rollout::message::{Batch, FromNode, ToNode, UpdateWeights};
use rollout::policy::RandomPolicy;
use rollout::pool::TensorPool;
use rollout::rollout::{Rollout, RolloutConfig, TrajIds};
use rollout::wire::{
    decode, encode, encode_into, BatchFrame, Ends, NodeFrame, TrainerFrame, DEFAULT_MAX_FRAME, PREFIX_LEN,
};
use rollout::{Tensor, Weights};

const ELEMS: usize = 10_000_000;
const BYTES: usize = ELEMS * 4;
/// Each measurement: the best of this many runs.
const REPS: usize = 15;

/// Best time of `REPS` runs of `f`.
fn best(mut f: impl FnMut()) -> Duration {
    (0..REPS)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .expect("REPS > 0")
}

fn mbps(d: Duration) -> f64 {
    BYTES as f64 / d.as_secs_f64() / 1e6
}

fn main() {
    let data: Vec<f32> = (0..ELEMS).map(|i| (i as f32).sin()).collect();
    let mut tensors = BTreeMap::new();
    tensors.insert(
        "weight".to_string(),
        Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[ELEMS / 1000, 1000]), data.clone()).expect("shape")),
    );
    let frame = TrainerFrame::Message(ToNode::UpdateWeights(UpdateWeights {
        weights: Arc::new(Weights { version: 1, tensors }),
    }));
    // The same bytes as the blob, as the baselines' source.
    let src: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
    let src = &src[..];

    // Baselines.
    let mut dst = vec![0u8; BYTES];
    let memcpy = best(|| {
        dst.copy_from_slice(black_box(src));
        black_box(&dst);
    });
    let to_vec = best(|| {
        black_box(black_box(src).to_vec());
    });
    let tensor = match &frame {
        TrainerFrame::Message(ToNode::UpdateWeights(u)) => u.weights.tensors["weight"].clone(),
        _ => unreachable!(),
    };
    let mut le = Vec::with_capacity(BYTES);
    let elementwise = best(|| {
        le.clear();
        black_box(&tensor).write_le_bytes(&mut le);
        black_box(&le);
    });

    // Encode into a reused buffer, as a sender does.
    let mut out = Vec::with_capacity(BYTES + 1024);
    let encode = best(|| {
        out.clear();
        encode_into(black_box(&frame), DEFAULT_MAX_FRAME, &mut out).expect("encode");
        black_box(&out);
    });
    let body = out[PREFIX_LEN..].to_vec();
    let decode_t = best(|| {
        let f: TrainerFrame = decode(black_box(&body)).expect("decode");
        black_box(f);
    });
    let back: TrainerFrame = decode(&body).expect("decode");
    assert!(back == frame, "the frame round-trips");
    // Into pooled storage: each run's tensors go back to the pool for the next one.
    let mut pool = TensorPool::new(2 * BYTES);
    let decode_pooled_t = best(|| {
        let f: TrainerFrame = decode_pooled(black_box(&body), &mut pool).expect("decode");
        if let TrainerFrame::Message(ToNode::UpdateWeights(u)) = f {
            pool.put_weights(Arc::try_unwrap(u.weights).expect("unique"));
        }
    });
    let again: TrainerFrame = decode_pooled(&body, &mut pool).expect("decode");
    assert!(again == frame, "the pooled decode is the same frame");
    // What a connection does: the frame arrives in reads of up to 64 KiB (here from
    // memory, standing in for the socket), each read landing where the reader says
    // (the tensor straight into pooled storage), then the decode.
    let whole = out.clone();
    let mut reader = FrameReader::new(DEFAULT_MAX_FRAME);
    let mut read = |pool: &mut TensorPool| -> TrainerFrame {
        let mut pos = 0;
        loop {
            let buf = reader.buf();
            let n = buf.len().min(64 << 10).min(whole.len() - pos);
            buf[..n].copy_from_slice(black_box(&whole[pos..pos + n]));
            pos += n;
            if reader.filled(n, pool).expect("frame") {
                return reader.decode(pool).expect("decode");
            }
        }
    };
    let reader_t = best(|| {
        if let TrainerFrame::Message(ToNode::UpdateWeights(u)) = read(&mut pool) {
            pool.put_weights(Arc::try_unwrap(u.weights).expect("unique"));
        }
    });
    assert!(read(&mut pool) == frame, "the frame reader reads the same frame");

    println!("wire: UpdateWeights frame, one f32 tensor of {ELEMS} elements ({BYTES} bytes), best of {REPS}");
    println!("  memcpy (reused buffer)     {:>9.0} MB/s   baseline", mbps(memcpy));
    println!("  to_vec (fresh allocation)  {:>9.0} MB/s", mbps(to_vec));
    println!("  element-wise to_le_bytes   {:>9.0} MB/s", mbps(elementwise));
    println!(
        "  encode frame               {:>9.0} MB/s   {:.2} x memcpy",
        mbps(encode),
        memcpy.as_secs_f64() / encode.as_secs_f64()
    );
    println!(
        "  decode frame               {:>9.0} MB/s   {:.2} x memcpy, {:.2} x to_vec",
        mbps(decode_t),
        memcpy.as_secs_f64() / decode_t.as_secs_f64(),
        to_vec.as_secs_f64() / decode_t.as_secs_f64()
    );
    println!(
        "  decode frame, pooled       {:>9.0} MB/s   {:.2} x memcpy",
        mbps(decode_pooled_t),
        memcpy.as_secs_f64() / decode_pooled_t.as_secs_f64()
    );
    println!(
        "  read + decode, FrameReader {:>9.0} MB/s   {:.2} x memcpy (the read is the only copy)",
        mbps(reader_t),
        memcpy.as_secs_f64() / reader_t.as_secs_f64()
    );
    small_batch();
    pixel_batch();
}

/// Decodes of a small batch frame per run of [`best`].
const SMALL_DECODES: usize = 20_000;

/// A small batch frame: plain decode against the pooled one, µs per frame.
fn small_batch() {
    let env = Counting::new(CountingConfig::default()).expect("counting");
    let policy = RandomPolicy::new(env.action_spec().clone(), 0);
    let mut ro = Rollout::new(
        vec![Box::new(env) as Box<dyn Env>],
        Box::new(policy),
        vec![TrajIds::new(0, 1).expect("ids")],
        RolloutConfig {
            frames_per_batch: 10,
            ..RolloutConfig::default()
        },
    )
    .expect("rollout");
    let data = ro.collect().expect("collect");
    let keys = data.len();
    let frame = NodeFrame::Message(FromNode::Batch(Batch {
        node: 3,
        seq: 1_000,
        weights_version: 2,
        data,
    }));
    let body = encode(&frame, DEFAULT_MAX_FRAME).expect("encode")[PREFIX_LEN..].to_vec();
    let per = |d: Duration| d.as_secs_f64() * 1e6 / SMALL_DECODES as f64;
    let plain = best(|| {
        for _ in 0..SMALL_DECODES {
            let f: NodeFrame = decode(black_box(&body)).expect("decode");
            black_box(f);
        }
    });
    // Decoded into a pool holding the previous result, as a connection does; checked
    // to be `frame`.
    let pooled_decodes = |body: &[u8]| {
        let mut pool = TensorPool::new(1 << 20);
        let t = best(|| {
            for _ in 0..SMALL_DECODES {
                let f: NodeFrame = decode_pooled(black_box(body), &mut pool).expect("decode");
                if let NodeFrame::Message(FromNode::Batch(b)) = f {
                    pool.put_dict(b.data);
                }
            }
        });
        let again: NodeFrame = decode_pooled(body, &mut pool).expect("decode");
        assert!(again == frame, "the pooled decode is the same frame");
        t
    };
    let pooled = pooled_decodes(&body);
    let NodeFrame::Message(FromNode::Batch(batch)) = &frame else {
        unreachable!("built as a batch")
    };
    // Sent once whatever it saves (a node sends small batches whole: `ends::MIN_SAVED`).
    let once = BatchFrame {
        batch,
        ends: Ends::saving(&batch.data, 0),
    };
    let compact = encode(&once, DEFAULT_MAX_FRAME).expect("encode")[PREFIX_LEN..].to_vec();
    let compact_t = pooled_decodes(&compact);
    println!(
        "wire: batch frame of 10 Counting frames, {keys} keys, {} bytes ({} with each observation once), \
         best of {REPS} x {SMALL_DECODES}",
        body.len(),
        compact.len()
    );
    println!("  decode frame (fresh)       {:>9.2} µs        baseline", per(plain));
    println!(
        "  decode frame, pooled       {:>9.2} µs        {:.2} x the plain decode's speed",
        per(pooled),
        plain.as_secs_f64() / pooled.as_secs_f64()
    );
    println!(
        "  compact frame, pooled      {:>9.2} µs        {:.2} x the pooled decode's time",
        per(compact_t),
        compact_t.as_secs_f64() / pooled.as_secs_f64()
    );
}

/// Envs, steps and the observation's shape of [`pixel_batch`].
const PX_ENVS: usize = 4;
const PX_STEPS: usize = 64;
const PX_SHAPE: [usize; 3] = [210, 160, 3];

/// A batch of Pong-sized frames: every observation different, `next.observation` the next
/// frame's but at each env's episode end (step 40) and last step.
fn pixels() -> Batch {
    let row: usize = PX_SHAPE.iter().product();
    let frames = PX_ENVS * PX_STEPS;
    let px = |state: usize| (0..row).map(move |i| ((state * 131 + i * 7) % 251) as u8);
    let (mut obs, mut next, mut done) = (Vec::new(), Vec::new(), Vec::new());
    for env in 0..PX_ENVS {
        let mut state = env * 10_000;
        for step in 0..PX_STEPS {
            obs.extend(px(state));
            next.extend(px(state + 1));
            let end = step == 40;
            done.push(end);
            state = if end { state + 5_000 } else { state + 1 };
        }
    }
    let shape: Vec<usize> = [PX_ENVS, PX_STEPS].iter().chain(&PX_SHAPE).copied().collect();
    let u8s = |v: Vec<u8>| Tensor::U8(ArrayD::from_shape_vec(IxDyn(&shape), v).expect("shape"));
    let per_frame = |n: usize, v: f32| {
        Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[PX_ENVS, PX_STEPS, n]), vec![v; frames * n]).expect("shape"))
    };
    let data = rollout::TensorDict::from_entries(
        &[PX_ENVS, PX_STEPS],
        [
            ("observation".to_string(), u8s(obs)),
            ("next.observation".to_string(), u8s(next)),
            (
                "action".to_string(),
                Tensor::I64(ArrayD::from_shape_vec(IxDyn(&[PX_ENVS, PX_STEPS]), vec![1; frames]).expect("shape")),
            ),
            ("next.reward".to_string(), per_frame(1, 0.0)),
            (
                "next.done".to_string(),
                Tensor::Bool(ArrayD::from_shape_vec(IxDyn(&[PX_ENVS, PX_STEPS, 1]), done).expect("shape")),
            ),
            ("logits".to_string(), per_frame(6, 0.1)),
        ],
    )
    .expect("batch");
    Batch {
        node: 0,
        seq: 1,
        weights_version: 1,
        data,
    }
}

/// The pixel batch through a connection's receive path, in both forms.
fn pixel_batch() {
    let batch = pixels();
    let frames = PX_ENVS * PX_STEPS;
    let obs_bytes = PX_SHAPE.iter().product::<usize>();
    let full = encode(&NodeFrame::Message(FromNode::Batch(batch.clone())), DEFAULT_MAX_FRAME).expect("encode");
    let compact = encode(&BatchFrame::new(&batch), DEFAULT_MAX_FRAME).expect("encode");
    let mut reader = FrameReader::new(DEFAULT_MAX_FRAME);
    let mut pool = TensorPool::new(usize::MAX);
    let mut read = |whole: &[u8], pool: &mut TensorPool| -> Batch {
        let mut pos = 0;
        loop {
            let buf = reader.buf();
            let n = buf.len().min(64 << 10).min(whole.len() - pos);
            buf[..n].copy_from_slice(black_box(&whole[pos..pos + n]));
            pos += n;
            if reader.filled(n, pool).expect("frame") {
                match reader.decode(pool).expect("decode") {
                    NodeFrame::Message(FromNode::Batch(b)) => return b,
                    other => panic!("not a batch: {other:?}"),
                }
            }
        }
    };
    assert!(
        read(&full, &mut pool) == batch && read(&compact, &mut pool) == batch,
        "both forms decode to the batch"
    );
    let mut time = |whole: &[u8]| {
        best(|| {
            let b = read(whole, &mut pool);
            pool.put_dict(b.data);
        })
    };
    let (full_t, compact_t) = (time(&full), time(&compact));
    let us = |d: Duration| d.as_secs_f64() * 1e6 / frames as f64;
    let ratio = |len: usize| len as f64 / (frames * obs_bytes) as f64;
    println!(
        "wire: pixel batch, {PX_ENVS} envs x {PX_STEPS} steps of u8 {PX_SHAPE:?} ({obs_bytes} bytes), an episode end \
         per env; read in 64 KiB pieces + decode into the pool, best of {REPS}"
    );
    println!(
        "  next.observation whole     {:>9.2} µs/frame   {:.3} x one observation on the wire   baseline",
        us(full_t),
        ratio(full.len())
    );
    println!(
        "  each observation once      {:>9.2} µs/frame   {:.3} x one observation on the wire   {:.2} x the CPU",
        us(compact_t),
        ratio(compact.len()),
        compact_t.as_secs_f64() / full_t.as_secs_f64()
    );
}
