use serde_json::json;

use super::*;
use crate::space::Space;

/// MessagePack of a JSON value as msgpack-python writes it: integers as integers,
/// floats as float64, keys in the JSON map's order (sorted: `kind` is not first).
fn pack(v: &serde_json::Value) -> Vec<u8> {
    let value = rmpv::ext::to_value(v).expect("JSON to msgpack");
    let mut b = Vec::new();
    rmpv::encode::write_value(&mut b, &value).expect("encode");
    b
}

/// `bytes` decoded as specs, every byte of them read.
fn specs_of(bytes: &[u8]) -> Result<EnvSpecs, String> {
    let mut c = Cursor::new(bytes);
    let s = env_specs(&mut c)?;
    assert!(c.is_empty(), "the whole value was read");
    Ok(s)
}

fn layout_of(bytes: &[u8]) -> Result<BatchLayout, String> {
    let mut c = Cursor::new(bytes);
    let l = layout(&mut c)?;
    assert!(c.is_empty(), "the whole value was read");
    Ok(l)
}

fn discrete(n: u64) -> serde_json::Value {
    json!({"kind": "discrete", "n": n})
}

/// Specs of every kind of space, as the Rust node's serde encodes them.
fn every_kind() -> EnvSpecs {
    let pixels = Space::Box {
        dtype: DType::U8,
        shape: vec![210, 160, 3],
        low: Some(Bounds::Uniform(0.0)),
        high: Some(Bounds::Uniform(255.0)),
    };
    let pos = Space::Box {
        dtype: DType::F64,
        shape: vec![3],
        low: Some(Bounds::Each(vec![f64::NEG_INFINITY, -1.5, 0.0])),
        high: None,
    };
    let inner = Space::Dict {
        spaces: BTreeMap::from([
            ("pos".to_string(), pos),
            ("bits".to_string(), Space::MultiBinary { n: 5 }),
        ]),
    };
    EnvSpecs {
        observation: Space::Dict {
            spaces: BTreeMap::from([
                ("pixels".to_string(), pixels),
                ("inner".to_string(), inner),
                ("step".to_string(), Space::Discrete { n: 10, start: -3 }),
                (
                    "count".to_string(),
                    Space::Box {
                        dtype: DType::I64,
                        shape: vec![],
                        low: Some(Bounds::Uniform(i64::MIN as f64)),
                        high: Some(Bounds::Uniform(f64::INFINITY)),
                    },
                ),
            ]),
        },
        action: Space::MultiDiscrete {
            nvec: vec![3, 2, u64::from(u32::MAX) + 1],
        },
        agents: None,
    }
}

#[test]
fn specs_the_rust_node_encodes_decode_to_themselves() {
    let cases = [
        every_kind(),
        EnvSpecs::from_specs(
            &crate::spec::Spec::uniform_box(4, -4.8, 4.8),
            &crate::spec::Spec::Discrete { n: 2 },
        ),
        EnvSpecs::from_specs(
            &crate::spec::Spec::uniform_box(3, -8.0, 8.0),
            &crate::spec::Spec::uniform_box(1, -2.0, 2.0),
        ),
    ];
    for specs in cases {
        let bytes = rmp_serde::to_vec_named(&specs).expect("encode");
        assert_eq!(specs_of(&bytes), Ok(specs.clone()));
        // And the derived decoder, which read them before, agrees.
        assert_eq!(rmp_serde::from_slice::<EnvSpecs>(&bytes).expect("derived"), specs);
        let layout = specs.batch_layout();
        let bytes = rmp_serde::to_vec_named(&layout).expect("encode");
        assert_eq!(layout_of(&bytes), Ok(layout));
    }
}

#[test]
fn specs_as_the_python_node_writes_them_decode_with_keys_in_any_order() {
    // Sorted keys: `kind` comes after `dtype` and `high`; integers for float bounds,
    // floats for others, a nil bound, an explicit `start`, unknown keys skipped.
    let v = json!({
        "observation": {"kind": "box", "dtype": "f32", "shape": [2], "low": [-1, -2.5], "high": 3,
                        "doc": {"nested": [1, 2, {"x": null}]}},
        "action": {"kind": "discrete", "n": 6, "start": 1, "low": null},
        "version": "future field",
    });
    let specs = specs_of(&pack(&v)).expect("decoded");
    assert_eq!(
        specs,
        EnvSpecs {
            observation: Space::Box {
                dtype: DType::F32,
                shape: vec![2],
                low: Some(Bounds::Each(vec![-1.0, -2.5])),
                high: Some(Bounds::Uniform(3.0)),
            },
            action: Space::Discrete { n: 6, start: 1 },
            agents: None,
        }
    );
    let v = json!({"observation": {"kind": "box", "dtype": "u8", "shape": [210, 160, 3], "low": null,
                                   "high": 255.0},
                   "action": {"kind": "discrete", "n": 6, "start": null}});
    let specs = specs_of(&pack(&v)).expect("decoded");
    assert_eq!(specs.action, Space::Discrete { n: 6, start: 0 }, "nil start is 0");
    assert!(matches!(specs.observation, Space::Box { low: None, high: Some(Bounds::Uniform(h)), .. } if h == 255.0));
}

#[test]
fn every_integer_and_float_form_reads_as_its_value() {
    // Bounds in every MessagePack number form: fixint, uint 8-64, negative fixint,
    // int 8-64, float 32 and 64.
    let forms: [(&[u8], f64); 12] = [
        (&[0x05], 5.0),
        (&[0xcc, 0xff], 255.0),
        (&[0xcd, 0x01, 0x00], 256.0),
        (&[0xce, 0, 1, 0, 0], 65536.0),
        (&[0xcf, 0, 0, 0, 1, 0, 0, 0, 0], 4294967296.0),
        (&[0xff], -1.0),
        (&[0xd0, 0x80], -128.0),
        (&[0xd1, 0xff, 0x00], -256.0),
        (&[0xd2, 0xff, 0xff, 0xff, 0xfe], -2.0),
        (&[0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0], i64::MIN as f64),
        (&[0xca, 0x3f, 0xc0, 0, 0], 1.5),
        (&[0xcb, 0x7f, 0xf0, 0, 0, 0, 0, 0, 0], f64::INFINITY),
    ];
    for (bytes, want) in forms {
        assert_eq!(number(&mut Cursor::new(bytes)), Ok(want), "{bytes:02x?}");
    }
    assert_eq!(int(&mut Cursor::new(&[0xd1, 0x80, 0x00])), Ok(-32768));
    assert!(
        int(&mut Cursor::new(&[0xcf, 0x80, 0, 0, 0, 0, 0, 0, 0])).is_err(),
        "2^63 is no i64"
    );
    assert_eq!(number(&mut Cursor::new(&[0xc0])), Err("expected a number".into()));
}

#[test]
fn every_limit_is_refused_naming_the_key() {
    let obs = |o: serde_json::Value| json!({"observation": o, "action": discrete(2)});
    let refused = |v: serde_json::Value| specs_of(&pack(&v)).expect_err("refused");
    let big = 1u64 << 40;
    let cases = [
        (
            obs(json!({"kind": "box", "dtype": "u8", "shape": [big, big]})),
            format!("observation: a box of shape [{big}, {big}] has more than {MAX_ELEMENTS} elements"),
        ),
        (
            obs(json!({"kind": "box", "dtype": "u8", "shape": [1, 1, 1, 1, 1, 1, 1, 1, 1]})),
            format!("observation: `shape`: 9 dimensions (at most {MAX_RANK})"),
        ),
        (
            obs(json!({"kind": "box", "dtype": "f32", "shape": [3], "low": [0, 1]})),
            "observation: `low`: 2 bounds for a box of 3 elements".to_string(),
        ),
        (
            obs(json!({"kind": "box", "dtype": "q7", "shape": [3]})),
            "observation: `dtype`: unknown dtype `q7` (dtypes: f32, f64, i64, bool, u8)".to_string(),
        ),
        (
            obs(json!({"kind": "torus", "n": 3})),
            "observation: unknown kind `torus` (kinds: box, discrete, multi_discrete, multi_binary, dict)".to_string(),
        ),
        (
            obs(json!({"kind": "dict", "spaces": {"pixels": {"kind": "torus"}}})),
            "observation.pixels: unknown kind `torus` (kinds: box, discrete, multi_discrete, multi_binary, dict)"
                .to_string(),
        ),
        (
            obs(json!({"kind": "dict", "spaces": {"pixels": {"dtype": "u8", "shape": [2]}}})),
            "observation.pixels: missing `kind`".to_string(),
        ),
        (obs(json!({"kind": "discrete"})), "observation: missing `n`".to_string()),
        (
            json!({"observation": {"kind": "discrete", "n": 2}, "action": {"kind": "discrete", "n": 2, "start": u64::MAX}}),
            format!("action: `start`: {} is out of range", u64::MAX),
        ),
        (json!({"observation": discrete(2)}), "missing `action`".to_string()),
    ];
    for (v, want) in cases {
        assert_eq!(refused(v), want);
    }
}

#[test]
fn dicts_are_bounded_in_depth_entries_and_names() {
    let nested = (0..40).fold(discrete(2), |inner, _| json!({"kind": "dict", "spaces": {"a": inner}}));
    let e = specs_of(&pack(&json!({"observation": nested, "action": discrete(2)}))).unwrap_err();
    assert_eq!(
        e,
        format!("observation.a.a.a.a: dicts nested deeper than {MAX_DICT_DEPTH}")
    );
    // Depth 4 is the deepest allowed.
    let ok = (0..MAX_DICT_DEPTH).fold(discrete(2), |inner, _| json!({"kind": "dict", "spaces": {"a": inner}}));
    specs_of(&pack(&json!({"observation": ok, "action": discrete(2)}))).expect("4 deep");

    let wide: serde_json::Map<String, serde_json::Value> = (0..=MAX_DICT_ENTRIES)
        .map(|i| (format!("k{i:03}"), discrete(2)))
        .collect();
    let e = specs_of(&pack(
        &json!({"observation": {"kind": "dict", "spaces": wide}, "action": discrete(2)}),
    ))
    .unwrap_err();
    assert_eq!(e, format!("observation: more than {MAX_DICT_ENTRIES} dict entries"));
    // Counted over every level: 40 + 40 entries.
    let half: serde_json::Map<String, serde_json::Value> = (0..40).map(|i| (format!("k{i:03}"), discrete(2))).collect();
    let two = json!({"kind": "dict", "spaces": {"a": {"kind": "dict", "spaces": half.clone()}, "b": {"kind": "dict", "spaces": half}}});
    let e = specs_of(&pack(&json!({"observation": two, "action": discrete(2)}))).unwrap_err();
    assert_eq!(e, format!("observation.b: more than {MAX_DICT_ENTRIES} dict entries"));

    let long = "x".repeat(MAX_NAME_LEN + 1);
    let e = specs_of(&pack(
        &json!({"observation": {"kind": "dict", "spaces": {long: discrete(2)}}, "action": discrete(2)}),
    ))
    .unwrap_err();
    assert_eq!(
        e,
        format!("observation: an entry name: a string of 65 bytes (at most 64) (names are 1 to {MAX_NAME_LEN} bytes)")
    );
}

#[test]
fn a_key_given_twice_is_refused_at_every_level() {
    // JSON maps cannot hold a key twice: these are written by hand.
    let fixstr = |s: &str| {
        let mut b = vec![0xa0 | s.len() as u8];
        b.extend_from_slice(s.as_bytes());
        b
    };
    let map = |entries: &[(&str, Vec<u8>)]| {
        let mut b = vec![0x80 | entries.len() as u8];
        for (k, v) in entries {
            b.extend(fixstr(k));
            b.extend_from_slice(v);
        }
        b
    };
    let disc = map(&[("kind", fixstr("discrete")), ("n", vec![2])]);
    let twice = map(&[
        ("observation", disc.clone()),
        ("observation", disc.clone()),
        ("action", disc.clone()),
    ]);
    assert_eq!(specs_of(&twice), Err("`observation` given twice".into()));
    let n_twice = map(&[("kind", fixstr("discrete")), ("n", vec![2]), ("n", vec![3])]);
    let v = map(&[("observation", disc.clone()), ("action", n_twice)]);
    assert_eq!(specs_of(&v), Err("action: `n` given twice".into()));
    let kind_twice = map(&[("kind", fixstr("discrete")), ("n", vec![2]), ("kind", fixstr("box"))]);
    let v = map(&[("observation", kind_twice), ("action", disc.clone())]);
    assert_eq!(specs_of(&v), Err("observation: `kind` given twice".into()));
    let spaces = map(&[("a", disc.clone()), ("a", disc.clone())]);
    let dict = map(&[("kind", fixstr("dict")), ("spaces", spaces)]);
    let v = map(&[("observation", dict), ("action", disc.clone())]);
    assert_eq!(specs_of(&v), Err("observation.a: given twice".into()));
    let entry = [0x92, 0xa3, b'f', b'3', b'2', 0x91, 0x04].to_vec();
    let layout = map(&[("observation", entry.clone()), ("observation", entry)]);
    assert_eq!(layout_of(&layout), Err("observation: given twice".into()));
}

#[test]
fn per_element_values_are_bounded_over_the_whole_specs() {
    // Half the budget in the observation's low bounds, half in its high: fits.
    let half = MAX_SPEC_VALUES / 2;
    let box_of = |n: usize, fill: u8| json!({"kind": "box", "dtype": "f32", "shape": [n], "low": vec![0u8; n], "high": vec![fill; n]});
    let v = json!({"observation": box_of(half, 1), "action": discrete(2)});
    specs_of(&pack(&v)).expect("exactly the budget");
    // One more value, in the action's nvec (read first: keys sorted): refused where
    // the budget runs out, naming the key.
    let v = json!({"observation": box_of(half, 1), "action": {"kind": "multi_discrete", "nvec": [2]}});
    let e = specs_of(&pack(&v)).unwrap_err();
    assert!(
        e.starts_with(&format!(
            "observation: `high`: {half} per-element values (bounds, nvec) with {} before them: more than \
             {MAX_SPEC_VALUES} in all",
            half + 1
        )),
        "{e}"
    );
    // The same box with uniform bounds costs nothing of it.
    let v = json!({"observation": {"kind": "box", "dtype": "f32", "shape": [MAX_ELEMENTS], "low": 0, "high": 1},
                   "action": {"kind": "multi_discrete", "nvec": [2]}});
    specs_of(&pack(&v)).expect("uniform bounds");
}

#[test]
fn an_array_announced_longer_than_the_bytes_behind_it_fails_fast() {
    // A box [2^25] whose `low` header announces 2^25 values, 3 bytes behind it.
    let n = 1u32 << 25;
    let mut b = vec![0x82];
    b.extend_from_slice(b"\xabobservation");
    b.extend_from_slice(b"\x84\xa4kind\xa3box\xa5dtype\xa2u8\xa5shape\x91\xce");
    b.extend_from_slice(&n.to_be_bytes());
    b.extend_from_slice(b"\xa3low\xdd");
    b.extend_from_slice(&n.to_be_bytes());
    b.extend_from_slice(&[1, 2, 3]);
    assert_eq!(specs_of(&b), Err("observation: frame cut short".into()));
    // Read directly (no skip before it), the array's length is checked against the
    // bytes left before anything is reserved.
    let mut arr = vec![0xdd];
    arr.extend_from_slice(&n.to_be_bytes());
    arr.extend_from_slice(&[1, 2, 3]);
    let e = bounds(&mut Cursor::new(&arr), n as usize, &mut Budget::default()).unwrap_err();
    assert_eq!(e, format!("an array of {n} values in 3 bytes"));
    // With every byte there (a 32 MiB frame), the budget refuses it before reserving.
    let mut whole = arr[..5].to_vec();
    whole.resize(5 + n as usize, 1);
    let e = bounds(&mut Cursor::new(&whole), n as usize, &mut Budget::default()).unwrap_err();
    assert!(e.starts_with(&format!("{n} per-element values")), "{e}");
}

#[test]
fn layouts_are_bounded_in_entries_keys_and_ranks() {
    let entry = json!(["f32", [4]]);
    let many: serde_json::Map<String, serde_json::Value> = (0..=MAX_LAYOUT_ENTRIES)
        .map(|i| (format!("k{i}"), entry.clone()))
        .collect();
    let e = layout_of(&pack(&serde_json::Value::Object(many))).unwrap_err();
    assert_eq!(
        e,
        format!("{} entries (at most {MAX_LAYOUT_ENTRIES})", MAX_LAYOUT_ENTRIES + 1)
    );
    let long = "k".repeat(MAX_LAYOUT_KEY_LEN + 1);
    let e = layout_of(&pack(&json!({long: entry}))).unwrap_err();
    assert!(e.starts_with("a key: a string of 513 bytes"), "{e}");
    let e = layout_of(&pack(&json!({"observation": ["f32", [1, 1, 1, 1, 1, 1, 1, 1, 1]]}))).unwrap_err();
    assert_eq!(e, format!("observation: 9 dimensions (at most {MAX_RANK})"));
    let e = layout_of(&pack(&json!({"observation": ["f32"]}))).unwrap_err();
    assert_eq!(e, "observation: expected [dtype, shape]");
    let e = layout_of(&pack(&json!({"observation": ["f16", [1]]}))).unwrap_err();
    assert!(e.starts_with("observation: unknown dtype `f16`"), "{e}");
}

/// A multi-agent env's specs as the Python node writes them (PROTOCOL.md §3,
/// Multi-agent envs): two groups, `agents` last.
fn two_groups() -> serde_json::Value {
    let obs = json!({"kind": "box", "dtype": "f32", "shape": [18], "low": -1e30, "high": 1e30});
    json!({
        "observation": {"kind": "dict", "spaces": {"agent": obs, "adversary": {"kind": "box", "dtype": "f32", "shape": [8]}}},
        "action": {"kind": "dict", "spaces": {"agent": discrete(5), "adversary": {"kind": "box", "dtype": "f32", "shape": [2], "low": -1, "high": 1}}},
        "agents": {"agent": ["agent_0", "agent_1", "agent_2"], "adversary": ["adversary_0"]}
    })
}

#[test]
fn a_multi_agent_envs_groups_decode_to_what_serde_writes() {
    let specs = specs_of(&pack(&two_groups())).unwrap();
    specs.validate().unwrap();
    let agents = specs.agents.as_ref().unwrap();
    assert_eq!(agents["agent"], ["agent_0", "agent_1", "agent_2"]);
    assert_eq!(agents["adversary"], ["adversary_0"]);
    let serde: EnvSpecs = rmp_serde::from_slice(&rmp_serde::to_vec_named(&specs).unwrap()).unwrap();
    assert_eq!(serde, specs);
    // Absent or nil: one agent, and the specs of one agent written as before.
    let mut one = two_groups();
    one["agents"] = serde_json::Value::Null;
    assert_eq!(specs_of(&pack(&one)).unwrap().agents, None);
    let single = EnvSpecs::from_specs(
        &crate::spec::Spec::uniform_box(2, -1.0, 1.0),
        &crate::spec::Spec::Discrete { n: 2 },
    );
    let bytes = rmp_serde::to_vec_named(&single).unwrap();
    assert!(
        !bytes.windows(6).any(|w| w == b"agents"),
        "no `agents` key for one agent"
    );
}

#[test]
fn agents_are_bounded_as_they_are_read() {
    let with = |agents: serde_json::Value| {
        let mut v = two_groups();
        v["agents"] = agents;
        specs_of(&pack(&v))
    };
    let many_groups: serde_json::Map<String, serde_json::Value> =
        (0..=MAX_GROUPS).map(|g| (format!("g{g}"), json!(["a"]))).collect();
    let e = with(serde_json::Value::Object(many_groups)).unwrap_err();
    assert!(
        e.contains(&format!("{} groups (at most {MAX_GROUPS})", MAX_GROUPS + 1)),
        "{e}"
    );
    let many_agents: Vec<String> = (0..=MAX_AGENTS).map(|i| format!("agent_{i}")).collect();
    let e = with(json!({ "agent": many_agents })).unwrap_err();
    assert!(e.contains(&format!("at most {MAX_AGENTS} in all")), "{e}");
    let long = "a".repeat(MAX_NAME_LEN + 1);
    let e = with(json!({ "agent": [long] })).unwrap_err();
    assert!(e.starts_with("agents: agent: an agent name"), "{e}");
    // A group given twice, written by hand (JSON maps cannot hold it).
    let mut twice = Vec::new();
    rmpv::encode::write_value(
        &mut twice,
        &rmpv::Value::Map(vec![(
            "agents".into(),
            rmpv::Value::Map(vec![
                ("g".into(), rmpv::Value::Array(vec!["a".into()])),
                ("g".into(), rmpv::Value::Array(vec!["b".into()])),
            ]),
        )]),
    )
    .unwrap();
    let e = specs_of(&twice).unwrap_err();
    assert!(e.contains("g: given twice"), "{e}");
}

#[test]
fn a_group_name_in_an_error_is_escaped() {
    let mut v = two_groups();
    v["agents"] = json!({ "a\nb": (0..=MAX_AGENTS).map(|i| format!("x{i}")).collect::<Vec<_>>() });
    let e = specs_of(&pack(&v)).unwrap_err();
    assert!(e.starts_with("agents: a\\nb: ") && !e.contains('\n'), "{e}");
}
