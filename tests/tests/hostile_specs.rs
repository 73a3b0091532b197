//! What decoding a `ready`'s specs costs in memory, counted by a global allocator:
//! at most 8 bytes per byte of the frame for the largest specs a node may send, and
//! next to nothing for specs over the limits, whatever their size (PROTOCOL.md §3,
//! Spaces). Each test counts the allocations of its own thread only.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use rollout::message::FromNode;
use rollout::space::{Bounds, EnvSpecs, Space, MAX_SPEC_VALUES};
use rollout::tensor::DType;
use rollout::wire::{self, NodeFrame};

/// Counts the bytes each thread has allocated and not freed, and their peak.
struct Counting;

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: every call goes to `System` unchanged; the counters are thread-local cells
// (const-initialised: touching them allocates nothing).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.with(|l| {
            let v = l.get().saturating_add(layout.size());
            l.set(v);
            v
        });
        PEAK.with(|p| p.set(p.get().max(live)));
        // SAFETY: forwarded as given.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.with(|l| l.set(l.get().saturating_sub(layout.size())));
        // SAFETY: forwarded as given.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// The result of `f` and the most bytes live at once during it, above those live before.
fn peak_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let out = f();
    (out, PEAK.with(Cell::get) - base)
}

/// A MessagePack `str`.
fn str8(s: &str) -> Vec<u8> {
    let mut b = vec![0xd9, s.len() as u8];
    b.extend_from_slice(s.as_bytes());
    b
}

/// A MessagePack array header of `n` values (array 32).
fn array32(n: u32) -> Vec<u8> {
    let mut b = vec![0xdd];
    b.extend_from_slice(&n.to_be_bytes());
    b
}

/// The specs of a u8 box of `n` elements whose `low` (and `high`, if `high`) arrays
/// announce `n` values, `given` of them written, each the one-byte 1: a number a byte,
/// the cheapest per-element bound on the wire.
fn box_specs(n: u32, given: usize, high: bool) -> Vec<u8> {
    let mut b = vec![0x82];
    b.extend(str8("action"));
    b.push(0x82);
    b.extend(str8("kind"));
    b.extend(str8("discrete"));
    b.extend(str8("n"));
    b.push(2);
    b.extend(str8("observation"));
    b.push(if high { 0x85 } else { 0x84 });
    b.extend(str8("kind"));
    b.extend(str8("box"));
    b.extend(str8("dtype"));
    b.extend(str8("u8"));
    b.extend(str8("shape"));
    b.push(0x91);
    b.push(0xce);
    b.extend_from_slice(&n.to_be_bytes());
    for key in ["low", "high"].into_iter().take(if high { 2 } else { 1 }) {
        b.extend(str8(key));
        b.extend(array32(n));
        b.resize(b.len() + given, 1);
    }
    b
}

/// The body of a `ready` carrying `specs` (and an empty layout).
fn ready_with(specs: &[u8]) -> Vec<u8> {
    let mut b = vec![0x84];
    b.extend(str8("type"));
    b.extend(str8("ready"));
    b.extend(str8("node"));
    b.push(0);
    b.extend(str8("layout"));
    b.push(0x80);
    b.extend(str8("specs"));
    b.extend_from_slice(specs);
    b
}

#[test]
fn the_largest_specs_a_node_may_send_cost_at_most_8_bytes_a_byte_to_decode() {
    // Per-element bounds to the limit, one byte each: a box of 2^19 elements, low and high.
    let n = (MAX_SPEC_VALUES / 2) as u32;
    let specs = box_specs(n, n as usize, true);
    let body = ready_with(&specs);
    let (decoded, peak) = peak_during(|| wire::decode::<NodeFrame>(&body));
    let want = EnvSpecs {
        observation: Space::Box {
            dtype: DType::U8,
            shape: vec![n as usize],
            low: Some(Bounds::Each(vec![1.0; n as usize])),
            high: Some(Bounds::Each(vec![1.0; n as usize])),
        },
        action: Space::Discrete { n: 2, start: 0 },
        agents: None,
    };
    match decoded {
        Ok(NodeFrame::Message(FromNode::Ready { specs: Some(s), .. })) => assert_eq!(*s, want),
        other => panic!("{other:?}"),
    }
    let factor = peak as f64 / body.len() as f64;
    // The derived decoder that read them before, on the same bytes.
    let (derived, derived_peak) = peak_during(|| rmp_serde::from_slice::<EnvSpecs>(&specs));
    assert_eq!(derived.expect("derived decode"), want);
    let derived_factor = derived_peak as f64 / specs.len() as f64;
    println!(
        "a ready of {} bytes: peak {peak} bytes decoding ({factor:.2} a byte); the derived decoder on its \
         specs: {derived_peak} ({derived_factor:.2} a byte)",
        body.len()
    );
    assert!(peak <= 8 * body.len(), "{peak} bytes for a body of {}", body.len());
    assert!(peak < derived_peak, "{peak} against {derived_peak}");
}

#[test]
fn specs_over_the_limits_are_refused_having_allocated_next_to_nothing() {
    let n = 1u32 << 25;
    // The 32 MiB frame: every one of 2^25 bounds there.
    let body = ready_with(&box_specs(n, n as usize, false));
    assert!(body.len() > 32 << 20);
    let (r, peak) = peak_during(|| wire::decode::<NodeFrame>(&body));
    let e = r.expect_err("refused").to_string();
    assert!(
        e.contains(
            "observation: `low`: 33554432 per-element values (bounds, nvec) with 0 before them: more than 1048576"
        ),
        "{e}"
    );
    println!("a ready of {} bytes refused with a peak of {peak} bytes", body.len());
    assert!(peak < 64 * 1024, "{peak} bytes allocated refusing it");
    // Its header alone, with 3 bytes behind it: refused as fast, nothing reserved.
    let body = ready_with(&box_specs(n, 3, false));
    let (r, peak) = peak_during(|| wire::decode::<NodeFrame>(&body));
    assert!(r.expect_err("refused").to_string().contains("frame cut short"));
    assert!(peak < 64 * 1024, "{peak} bytes allocated refusing it");
}

/// `specs` of a one-group multi-agent env (PROTOCOL.md §3, Multi-agent envs) whose
/// `agents` array announces `n` names, `given` of them written, each of 64 bytes.
fn agents_specs(n: u32, given: usize) -> Vec<u8> {
    let mut b = vec![0x83];
    for key in ["observation", "action"] {
        b.extend(str8(key));
        b.push(0x82);
        b.extend(str8("kind"));
        b.extend(str8("dict"));
        b.extend(str8("spaces"));
        b.push(0x81);
        b.extend(str8("agent"));
        b.push(0x82);
        b.extend(str8("kind"));
        b.extend(str8("discrete"));
        b.extend(str8("n"));
        b.push(2);
    }
    b.extend(str8("agents"));
    b.push(0x81);
    b.extend(str8("agent"));
    b.extend(array32(n));
    for i in 0..given {
        b.extend(str8(&format!("{i:064}")));
    }
    b
}

#[test]
fn a_multi_agent_envs_agents_are_bounded_before_anything_is_built_for_them() {
    use rollout::space::MAX_AGENTS;
    // The most agents a node may name, of the longest names: read, and cheaply.
    let body = ready_with(&agents_specs(MAX_AGENTS as u32, MAX_AGENTS));
    let (decoded, peak) = peak_during(|| wire::decode::<NodeFrame>(&body));
    match decoded {
        Ok(NodeFrame::Message(FromNode::Ready { specs: Some(s), .. })) => {
            assert_eq!(s.agents.as_ref().map(|g| g["agent"].len()), Some(MAX_AGENTS));
            s.validate().expect("valid");
        }
        other => panic!("{other:?}"),
    }
    assert!(peak <= 8 * body.len(), "{peak} bytes for a body of {}", body.len());
    // One more, or 2^32 - 1 announced with three bytes behind: refused, nothing reserved.
    for (n, given) in [(MAX_AGENTS as u32 + 1, MAX_AGENTS + 1), (u32::MAX, 0)] {
        let body = ready_with(&agents_specs(n, given));
        let (r, peak) = peak_during(|| wire::decode::<NodeFrame>(&body));
        let e = r.expect_err("refused").to_string();
        assert!(
            e.contains(&format!(
                "agents: agent: {n} agents with 0 before them (at most {MAX_AGENTS} in all)"
            )),
            "{e}"
        );
        assert!(peak < 64 * 1024, "{peak} bytes allocated refusing it");
    }
}
