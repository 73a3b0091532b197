//! The spaces of any env, as a node reports them in `ready` (PROTOCOL.md §3, Spaces):
//! boxes of f32, f64, u8 or i64 of any shape, discrete values, multi-discrete and
//! multi-binary vectors, and dicts of those for observations.
//!
//! [`Spec`](crate::spec::Spec) is what rollout's own envs and policies speak (an f32
//! vector or a choice); a [`Space`] is what any env may have. The trainer learns a
//! run's [`EnvSpecs`] from its nodes (or from the user) when it cannot build the env,
//! derives from them the layout every batch must have, and builds the policy's weights
//! from them when the policy can take them ([`EnvSpecs::policy_specs`]).
//!
//! Everything here may come from a peer: every size is checked with checked
//! arithmetic and bounded ([`EnvSpecs::validate`]) before anything is sized by it.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::peer_text::{Bounded, BoundedDisplay};
use crate::policy::{PolicyConfig, PolicySpec, Recorded, StateTensor};
use crate::schema::{batch_layout, keys, BatchLayout};
use crate::spec::Spec;
use crate::tensor::DType;

/// The most elements one value of a space may have (a 4K RGB frame is 25 M).
pub const MAX_ELEMENTS: usize = 1 << 26;
/// The most entries a dict space may have, over all its levels.
pub const MAX_DICT_ENTRIES: usize = 64;
/// The deepest a dict space may nest (a dict in a dict is depth 2).
pub const MAX_DICT_DEPTH: usize = 4;
/// The longest name of a dict entry, in bytes.
pub const MAX_NAME_LEN: usize = 64;
/// The most dimensions a box's shape may have.
pub const MAX_RANK: usize = 8;
/// The most per-element numbers one [`EnvSpecs`] may hold over all its spaces: every
/// value of a per-element `low` or `high` and every entry of an `nvec` (8 MiB as f64).
/// A box with more elements sends uniform bounds (one number each), as the Python
/// node does whenever every element's bound is the same.
pub const MAX_SPEC_VALUES: usize = 1 << 20;
/// The most agents a multi-agent env may have over all its groups.
pub const MAX_AGENTS: usize = 1024;
/// The most groups a multi-agent env may have: each is an entry of both the observation
/// and the action dict, and gives its batch about ten entries (a layout holds at most
/// [`crate::schema::MAX_LAYOUT_ENTRIES`]).
pub const MAX_GROUPS: usize = 16;

/// The bounds of a box: one value for every element, or one per element (C order).
/// Absent (`None` where a `Bounds` is expected) means unbounded.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Bounds {
    /// The same bound for every element.
    Uniform(f64),
    /// One bound per element, in C order.
    Each(Vec<f64>),
}

impl Bounds {
    /// The bound of element `i` (`i` below the box's element count).
    pub fn get(&self, i: usize) -> f64 {
        match self {
            Bounds::Uniform(v) => *v,
            Bounds::Each(v) => v.get(i).copied().unwrap_or(f64::NAN),
        }
    }
}

/// The space one value lives in.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Space {
    /// An array of numbers of one dtype and shape, each within its bounds.
    Box {
        /// The element type: f32, f64, u8 or i64.
        dtype: DType,
        /// The shape, outermost first (`[]`: one number).
        shape: Vec<usize>,
        /// Lower bounds (absent: unbounded below).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        low: Option<Bounds>,
        /// Upper bounds (absent: unbounded above).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        high: Option<Bounds>,
    },
    /// One integer in `start..start + n`.
    Discrete {
        /// Number of choices.
        n: u64,
        /// The first choice (absent: 0).
        #[serde(default, skip_serializing_if = "is_zero")]
        start: i64,
    },
    /// A vector of integers, element `i` in `0..nvec[i]`.
    MultiDiscrete {
        /// Choices per element.
        nvec: Vec<u64>,
    },
    /// A vector of `n` zeros and ones.
    MultiBinary {
        /// Elements.
        n: usize,
    },
    /// Named spaces (observations only): entry `name` is the batch key `observation.name`.
    Dict {
        /// The entries, by name.
        spaces: BTreeMap<String, Space>,
    },
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

/// An env's observation and action spaces: what a node reports in `ready`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EnvSpecs {
    /// The observation's space; of a multi-agent env, a dict of one entry per group
    /// holding one agent's space.
    pub observation: Space,
    /// The action's space; of a multi-agent env, a dict of one entry per group holding
    /// one agent's space.
    pub action: Space,
    /// A multi-agent env's groups (PROTOCOL.md §3, Multi-agent envs; version 10): each
    /// group's agents in the order of its agent axis. `None` (absent on the wire, and not
    /// written): an env of one agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agents: Option<BTreeMap<String, Vec<String>>>,
}

/// Names no group may have: its keys would be the batch's own (`next.…`,
/// `collector.…`, `step_count`) or those of the root flags torchrl's TensorDicts carry.
pub const RESERVED_GROUPS: [&str; 6] = ["next", "collector", "step_count", "done", "terminated", "truncated"];

/// One group of a multi-agent env's agents, borrowed from its [`EnvSpecs`]: agents that
/// share their spaces, stacked on one agent axis in the batch (torchrl's `group_map`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AgentGroup<'a> {
    /// The group's name: the first part of its batch keys (`agent.observation`).
    pub name: &'a str,
    /// Its agents, in the order of the agent axis.
    pub agents: &'a [String],
    /// One agent's observation space.
    pub observation: &'a Space,
    /// One agent's action space.
    pub action: &'a Space,
}

/// Why a space cannot be collected. `key` names the batch key at fault
/// (`observation.pixels`, `action`); it may hold a node's names, so it is shown
/// bounded and escaped ([`crate::peer_text`]), as are the names in `reason`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {reason}", Bounded(key))]
pub struct SpaceError {
    /// The batch key of the space at fault.
    pub key: String,
    /// What is wrong.
    pub reason: String,
}

fn err(key: &str, reason: impl Into<String>) -> SpaceError {
    SpaceError {
        key: key.to_string(),
        reason: reason.into(),
    }
}

/// The element count of `shape`, if it does not overflow.
fn numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

impl Space {
    /// A space from one of rollout's own specs: an f32 box `[D]` or a discrete choice.
    pub fn from_spec(spec: &Spec) -> Space {
        match spec {
            Spec::Box { low, high } => Space::Box {
                dtype: DType::F32,
                shape: vec![low.len()],
                low: Some(Bounds::Each(low.iter().map(|&v| f64::from(v)).collect())),
                high: Some(Bounds::Each(high.iter().map(|&v| f64::from(v)).collect())),
            },
            Spec::Discrete { n } => Space::Discrete { n: *n, start: 0 },
        }
    }

    /// Checks the space found under batch key `key` (`depth` dicts deep, `entries`
    /// dict entries counted so far over the whole tree).
    fn check(&self, key: &str, depth: usize, entries: &mut usize) -> Result<(), SpaceError> {
        match self {
            Space::Box {
                dtype,
                shape,
                low,
                high,
            } => {
                if !matches!(dtype, DType::F32 | DType::F64 | DType::U8 | DType::I64) {
                    return Err(err(key, format!("a box of {dtype} (boxes are f32, f64, u8 or i64)")));
                }
                let n = numel(shape).filter(|&n| n <= MAX_ELEMENTS).ok_or_else(|| {
                    err(
                        key,
                        format!(
                            "a box of shape {} has more than {MAX_ELEMENTS} elements",
                            BoundedDisplay(format_args!("{shape:?}"))
                        ),
                    )
                })?;
                if n == 0 {
                    return Err(err(
                        key,
                        format!(
                            "a box of shape {} has no element",
                            BoundedDisplay(format_args!("{shape:?}"))
                        ),
                    ));
                }
                for (name, b) in [("low", low), ("high", high)] {
                    match b {
                        Some(Bounds::Each(v)) if v.len() != n => {
                            return Err(err(key, format!("{} {name} bounds for a box of {n} elements", v.len())))
                        }
                        Some(b @ Bounds::Each(_)) | Some(b @ Bounds::Uniform(_)) => {
                            if let Some(i) = (0..n).find(|&i| b.get(i).is_nan()) {
                                return Err(err(key, format!("{name} bound {i} is NaN")));
                            }
                        }
                        None => {}
                    }
                }
                if let (Some(l), Some(h)) = (low, high) {
                    if let Some(i) = (0..n).find(|&i| l.get(i) > h.get(i)) {
                        return Err(err(
                            key,
                            format!("bounds {}..{} of element {i} are inverted", l.get(i), h.get(i)),
                        ));
                    }
                }
                Ok(())
            }
            Space::Discrete { n, start } => {
                if *n == 0 {
                    return Err(err(key, "a discrete space of no choice"));
                }
                // `n` itself an i64 (as gymnasium's and torchrl's), and so the last choice.
                let last = i64::try_from(*n).ok().and_then(|n| start.checked_add(n - 1));
                if last.is_none() {
                    return Err(err(key, format!("choices {start} + {n} overflow i64")));
                }
                Ok(())
            }
            Space::MultiDiscrete { nvec } => {
                if nvec.is_empty() || nvec.len() > MAX_ELEMENTS {
                    return Err(err(key, format!("a multi-discrete space of {} elements", nvec.len())));
                }
                if let Some(i) = nvec.iter().position(|&c| c == 0 || c > i64::MAX as u64) {
                    return Err(err(key, format!("element {i} has {} choices", nvec[i])));
                }
                Ok(())
            }
            Space::MultiBinary { n } => {
                if *n == 0 || *n > MAX_ELEMENTS {
                    return Err(err(key, format!("a multi-binary space of {n} elements")));
                }
                Ok(())
            }
            Space::Dict { spaces } => {
                if depth >= MAX_DICT_DEPTH {
                    return Err(err(key, format!("dicts nested deeper than {MAX_DICT_DEPTH}")));
                }
                if spaces.is_empty() {
                    return Err(err(key, "an empty dict"));
                }
                for (name, s) in spaces {
                    *entries += 1;
                    if *entries > MAX_DICT_ENTRIES {
                        return Err(err(key, format!("more than {MAX_DICT_ENTRIES} dict entries")));
                    }
                    if name.is_empty() || name.len() > MAX_NAME_LEN || name.contains('.') {
                        return Err(err(
                            key,
                            format!(
                                "entry name \"{}\": names are 1 to {MAX_NAME_LEN} bytes without a dot (they become batch keys)",
                                Bounded(name)
                            ),
                        ));
                    }
                    s.check(&format!("{key}.{name}"), depth + 1, entries)?;
                }
                Ok(())
            }
        }
    }

    /// The dtype and feature shape of one value in a batch, for a space that is not a dict.
    fn entry(&self, action: bool) -> (DType, Vec<usize>) {
        match self {
            Space::Box { dtype, shape, .. } => (if action { DType::F32 } else { *dtype }, shape.clone()),
            Space::Discrete { .. } => (DType::I64, vec![]),
            Space::MultiDiscrete { nvec } => (DType::I64, vec![nvec.len()]),
            Space::MultiBinary { n } => (DType::U8, vec![*n]),
            Space::Dict { .. } => (DType::U8, vec![]),
        }
    }

    /// Adds the entries of this space under `key` to `layout`: one, or one per leaf
    /// of a dict (`key.name`, recursively), each feature shape after the dimensions
    /// `lead` (a multi-agent group's agent axis; none for one agent).
    fn layout_into(&self, key: &str, action: bool, lead: &[usize], layout: &mut BatchLayout) {
        match self {
            Space::Dict { spaces } => {
                for (name, s) in spaces {
                    s.layout_into(&format!("{key}.{name}"), action, lead, layout);
                }
            }
            leaf => {
                let (dtype, shape) = leaf.entry(action);
                layout.insert(key.to_string(), (dtype, lead.iter().chain(&shape).copied().collect()));
            }
        }
    }

    /// Rollout's own spec of this space, if it is one built-in policies take: a 1-D
    /// box of f32 or f64 (taken as f32), or a discrete space (the policy chooses an
    /// index in `0..n`; the node adds `start`).
    pub fn as_spec(&self) -> Result<Spec, String> {
        match self {
            Space::Box {
                dtype: DType::F32 | DType::F64,
                shape,
                low,
                high,
            } if shape.len() == 1 => {
                let d = shape[0];
                let bound = |b: &Option<Bounds>, none: f64| -> Vec<f32> {
                    (0..d).map(|i| b.as_ref().map_or(none, |b| b.get(i)) as f32).collect()
                };
                Ok(Spec::Box {
                    low: bound(low, f64::NEG_INFINITY),
                    high: bound(high, f64::INFINITY),
                })
            }
            Space::Discrete { n, .. } => Ok(Spec::Discrete { n: *n }),
            other => Err(format!(
                "{other}: built-in policies take a 1-D f32 or f64 box or a discrete space"
            )),
        }
    }
}

impl Space {
    /// The same space, each bound in its one form: at the precision of the box's
    /// dtype (an f32 box's bounds are f32 numbers, however many digits they were
    /// written with), bounds equal for every element as one number, and unbounded
    /// (every low -inf, every high +inf) as absent. A node may write the same bounds
    /// either way (JSON has no infinite numbers).
    pub fn canonical(&self) -> Space {
        fn bound(b: &Option<Bounds>, unbounded: f64, f32_box: bool) -> Option<Bounds> {
            let round = |x: f64| if f32_box { f64::from(x as f32) } else { x };
            let b = match b {
                Some(Bounds::Each(v)) if v.first().is_some_and(|f| v.iter().all(|x| round(*x) == round(*f))) => {
                    Bounds::Uniform(round(v[0]))
                }
                Some(Bounds::Each(v)) => Bounds::Each(v.iter().map(|&x| round(x)).collect()),
                Some(Bounds::Uniform(x)) => Bounds::Uniform(round(*x)),
                None => return None,
            };
            (b != Bounds::Uniform(unbounded)).then_some(b)
        }
        match self {
            Space::Box {
                dtype,
                shape,
                low,
                high,
            } => Space::Box {
                dtype: *dtype,
                shape: shape.clone(),
                low: bound(low, f64::NEG_INFINITY, *dtype == DType::F32),
                high: bound(high, f64::INFINITY, *dtype == DType::F32),
            },
            Space::Dict { spaces } => Space::Dict {
                spaces: spaces.iter().map(|(k, s)| (k.clone(), s.canonical())).collect(),
            },
            other => other.clone(),
        }
    }
}

impl fmt::Display for Space {
    /// `f32 box [4]`, `discrete 2`, `multi-discrete [3, 2]`, `multi-binary 5`,
    /// `dict {a, b}`: how errors show a space.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Space::Box { dtype, shape, .. } => write!(f, "{dtype} box {}", BoundedDisplay(format_args!("{shape:?}"))),
            Space::Discrete { n, start: 0 } => write!(f, "discrete {n}"),
            Space::Discrete { n, start } => write!(f, "discrete {n} from {start}"),
            Space::MultiDiscrete { nvec } => write!(f, "multi-discrete {}", BoundedDisplay(format_args!("{nvec:?}"))),
            Space::MultiBinary { n } => write!(f, "multi-binary {n}"),
            Space::Dict { spaces } => {
                let names: Vec<&str> = spaces.keys().map(String::as_str).collect();
                write!(f, "dict {{{}}}", Bounded(&names.join(", ")))
            }
        }
    }
}

impl EnvSpecs {
    /// The specs of one of rollout's own envs (an f32 box observation).
    pub fn from_specs(observation: &Spec, action: &Spec) -> EnvSpecs {
        EnvSpecs {
            observation: Space::from_spec(observation),
            action: Space::from_spec(action),
            agents: None,
        }
    }

    /// A multi-agent env's groups in name order (empty for an env of one agent); call on
    /// validated specs (a group without both spaces is left out).
    pub fn groups(&self) -> Vec<AgentGroup<'_>> {
        let (Some(agents), Space::Dict { spaces: obs }, Space::Dict { spaces: act }) =
            (&self.agents, &self.observation, &self.action)
        else {
            return Vec::new();
        };
        agents
            .iter()
            .filter_map(|(name, agents)| {
                Some(AgentGroup {
                    name,
                    agents,
                    observation: obs.get(name)?,
                    action: act.get(name)?,
                })
            })
            .collect()
    }

    /// Whether these are a multi-agent env's specs (`agents` given).
    pub fn is_multi_agent(&self) -> bool {
        self.agents.is_some()
    }

    /// Checks that a rollout can collect an env of these specs: every size within
    /// bounds (checked arithmetic), every bound a number, no dict action. The error
    /// names the batch key at fault.
    pub fn validate(&self) -> Result<(), SpaceError> {
        if let Some(agents) = &self.agents {
            return self.validate_agents(agents);
        }
        self.observation.check(keys::OBSERVATION, 0, &mut 0)?;
        if let Space::Dict { .. } = self.action {
            return Err(err(keys::ACTION, "a dict action space cannot be collected"));
        }
        if let Space::Box { dtype, .. } = &self.action {
            if !matches!(dtype, DType::F32 | DType::F64) {
                return Err(err(
                    keys::ACTION,
                    format!("a box action of {dtype} cannot be collected (box actions are f32 or f64)"),
                ));
            }
        }
        self.action.check(keys::ACTION, 0, &mut 0)
    }

    /// [`EnvSpecs::validate`] for a multi-agent env: at most [`MAX_GROUPS`] groups of at
    /// least one agent, at most [`MAX_AGENTS`] agents in all, names as a dict's (1 to
    /// [`MAX_NAME_LEN`] bytes; a group's without a dot), none twice; the observation
    /// and action dicts of exactly the groups, each group's spaces checked as one
    /// agent's under its batch keys (`agent.observation`, `agent.action`).
    fn validate_agents(&self, agents: &BTreeMap<String, Vec<String>>) -> Result<(), SpaceError> {
        const KEY: &str = "agents";
        if agents.is_empty() || agents.len() > MAX_GROUPS {
            return Err(err(KEY, format!("{} groups (1 to {MAX_GROUPS})", agents.len())));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (group, names) in agents {
            if RESERVED_GROUPS.contains(&group.as_str()) {
                return Err(err(
                    KEY,
                    format!(
                        "group name \"{group}\" is a batch's own (groups are none of {})",
                        RESERVED_GROUPS.join(", ")
                    ),
                ));
            }
            if group.is_empty() || group.len() > MAX_NAME_LEN || group.contains('.') {
                return Err(err(
                    KEY,
                    format!(
                        "group name \"{}\": names are 1 to {MAX_NAME_LEN} bytes without a dot (they become batch keys)",
                        Bounded(group)
                    ),
                ));
            }
            if names.is_empty() {
                return Err(err(&format!("{KEY}.{group}"), "a group of no agent"));
            }
            for name in names {
                if name.is_empty() || name.len() > MAX_NAME_LEN {
                    return Err(err(
                        &format!("{KEY}.{group}"),
                        format!("agent name \"{}\": names are 1 to {MAX_NAME_LEN} bytes", Bounded(name)),
                    ));
                }
                if seen.len() >= MAX_AGENTS {
                    return Err(err(KEY, format!("more than {MAX_AGENTS} agents")));
                }
                if !seen.insert(name.as_str()) {
                    return Err(err(
                        &format!("{KEY}.{group}"),
                        format!("agent \"{}\" given twice", Bounded(name)),
                    ));
                }
            }
        }
        let mut entries = 0;
        for (key, space) in [(keys::OBSERVATION, &self.observation), (keys::ACTION, &self.action)] {
            let Space::Dict { spaces } = space else {
                return Err(err(
                    key,
                    format!("{space}: a multi-agent env's {key} is a dict of its groups"),
                ));
            };
            if let Some(name) = spaces.keys().find(|k| !agents.contains_key(*k)) {
                return Err(err(key, format!("entry \"{}\" is no group of `agents`", Bounded(name))));
            }
            if let Some(name) = agents.keys().find(|k| !spaces.contains_key(*k)) {
                return Err(err(key, format!("group \"{}\" has no entry", Bounded(name))));
            }
            entries += spaces.len();
        }
        for g in self.groups() {
            let obs_key = format!("{}.{}", g.name, keys::OBSERVATION);
            g.observation.check(&obs_key, 1, &mut entries)?;
            let act_key = format!("{}.{}", g.name, keys::ACTION);
            match g.action {
                Space::Dict { .. } => return Err(err(&act_key, "a dict action space cannot be collected")),
                Space::Box { dtype, .. } if !matches!(dtype, DType::F32 | DType::F64) => {
                    return Err(err(
                        &act_key,
                        format!("a box action of {dtype} cannot be collected (box actions are f32 or f64)"),
                    ))
                }
                _ => {}
            }
            g.action.check(&act_key, 1, &mut entries)?;
        }
        Ok(())
    }

    /// The layout of every batch of an env with these specs: the observation's
    /// entries under `observation` and `next.observation` (a dict's leaves as
    /// `observation.name`), the action under `action` (a box action as f32), and the
    /// keys every rollout writes. Call on validated specs.
    ///
    /// A multi-agent env's batches hold instead, for each group `g` of `n` agents,
    /// `g.observation` and `next.g.observation` (`[n, *shape]`), `g.action`, `g.mask`
    /// and `next.g.mask` (bool `[n]`), `next.g.reward` (f32 `[n, 1]`), `next.g.done`, `next.g.terminated`
    /// and `next.g.truncated` (bool `[n, 1]`), and the env's `next.done`,
    /// `next.terminated`, `next.truncated` with the trajectory keys; no root reward
    /// (PROTOCOL.md §3, Multi-agent envs; torchrl's `PettingZooEnv` layout).
    pub fn batch_layout(&self) -> BatchLayout {
        // The keys that do not depend on the env, from the one definition of them.
        let mut layout = batch_layout(&Spec::Discrete { n: 1 }, &Spec::Discrete { n: 1 });
        for k in [keys::OBSERVATION, keys::NEXT_OBSERVATION, keys::ACTION] {
            layout.remove(k);
        }
        if self.is_multi_agent() {
            layout.remove(keys::NEXT_REWARD);
            for g in self.groups() {
                let n = g.agents.len();
                let key = |k: &str| format!("{}.{k}", g.name);
                let next = |k: &str| format!("next.{}.{k}", g.name);
                g.observation
                    .layout_into(&key(keys::OBSERVATION), false, &[n], &mut layout);
                g.observation
                    .layout_into(&next(keys::OBSERVATION), false, &[n], &mut layout);
                g.action.layout_into(&key(keys::ACTION), true, &[n], &mut layout);
                layout.insert(key(keys::AGENT_MASK), (DType::Bool, vec![n]));
                layout.insert(next(keys::AGENT_MASK), (DType::Bool, vec![n]));
                layout.insert(next("reward"), (DType::F32, vec![n, 1]));
                for flag in ["done", "terminated", "truncated"] {
                    layout.insert(next(flag), (DType::Bool, vec![n, 1]));
                }
            }
            return layout;
        }
        self.observation.layout_into(keys::OBSERVATION, false, &[], &mut layout);
        self.observation
            .layout_into(keys::NEXT_OBSERVATION, false, &[], &mut layout);
        self.action.layout_into(keys::ACTION, true, &[], &mut layout);
        layout
    }

    /// [`EnvSpecs::batch_layout`] with what a policy records beside its actions (see
    /// [`EnvSpecs::recorded`]): the layout every batch of a run must have.
    pub fn batch_layout_recording(&self, recorded: Recorded) -> BatchLayout {
        self.batch_layout_with(recorded, &[])
    }

    /// [`EnvSpecs::batch_layout_recording`] with a recurrent policy's keys (`is_init`,
    /// each state tensor and its `next.` key; none for no state).
    ///
    /// On a multi-agent env `recorded` is the kind, sized for each group by its action
    /// ([`Recorded::sized_for`]) and written under it with the agent axis
    /// (`agent.action_log_prob` `[n]`).
    pub fn batch_layout_with(&self, recorded: Recorded, state: &[StateTensor]) -> BatchLayout {
        let mut layout = self.batch_layout();
        if self.is_multi_agent() {
            for g in self.groups() {
                let mut own = BatchLayout::new();
                let sized = g.action.as_spec().map_or(Recorded::None, |a| recorded.sized_for(&a));
                sized.extend_layout(&mut own);
                for (k, (dtype, shape)) in own {
                    let shape = std::iter::once(g.agents.len()).chain(shape).collect();
                    layout.insert(format!("{}.{k}", g.name), (dtype, shape));
                }
            }
            crate::policy::extend_state_layout(state, &mut layout);
            return layout;
        }
        recorded.extend_layout(&mut layout);
        crate::policy::extend_state_layout(state, &mut layout);
        layout
    }

    /// The layout every batch of a run of `policy` on an env of these specs has: what
    /// it records ([`EnvSpecs::recorded_by`]) and its state.
    pub fn batch_layout_for(&self, policy: &PolicySpec) -> BatchLayout {
        self.batch_layout_with(self.recorded_by(policy), policy.config.state())
    }

    /// What the batches of `policy` carry beside its actions for an env of these
    /// specs: what its kind records ([`EnvSpecs::recorded`]), nothing when the run
    /// asked for no recording (`record` off).
    pub fn recorded_by(&self, policy: &PolicySpec) -> Recorded {
        if policy.record {
            self.recorded(&policy.config)
        } else {
            Recorded::None
        }
    }

    /// What a policy of `config` records for an env of these specs: `random` a
    /// log-probability for every action space kind; `onnx` what its head records for
    /// the action (its observation may be any the model takes: an image, a dict); the
    /// others as [`PolicyConfig::recorded`] says for the action as a [`Spec`], nothing
    /// when they cannot take it (they are then refused before any node acts).
    ///
    /// On a multi-agent env, the kind its first group's action gives (each group's
    /// sizes are its own: [`EnvSpecs::batch_layout_with`]); built-in policies other
    /// than `random` serve one agent and record nothing there (they are refused).
    pub fn recorded(&self, config: &PolicyConfig) -> Recorded {
        if self.is_multi_agent() {
            return match config {
                PolicyConfig::Random => Recorded::LogProb,
                PolicyConfig::Onnx { .. } => self
                    .groups()
                    .first()
                    .and_then(|g| g.action.as_spec().ok())
                    .map_or(Recorded::None, |a| config.recorded(&a)),
                _ => Recorded::None,
            };
        }
        match config {
            PolicyConfig::Random => Recorded::LogProb,
            PolicyConfig::Onnx { .. } => self.action.as_spec().map_or(Recorded::None, |a| config.recorded(&a)),
            _ => self.policy_specs().map_or(Recorded::None, |(_, a)| config.recorded(&a)),
        }
    }

    /// Bytes of tensors one frame of this layout takes in a batch, if it does not
    /// overflow.
    pub fn bytes_per_frame(&self) -> Option<usize> {
        self.batch_layout().values().try_fold(0usize, |acc, (dtype, shape)| {
            numel(shape)
                .and_then(|n| n.checked_mul(dtype.size()))
                .and_then(|b| acc.checked_add(b))
        })
    }

    /// The specs rollout's built-in policies are built from (see [`Space::as_spec`]),
    /// or why they cannot take these, naming the key. The observation must be a 1-D
    /// box: a discrete one (an index) is refused here, as the Python node refuses it,
    /// though rollout's own envs may hand their policies an index as one input.
    ///
    /// A multi-agent env is refused naming `agents`: the built-ins serve one agent.
    pub fn policy_specs(&self) -> Result<(Spec, Spec), SpaceError> {
        if self.is_multi_agent() {
            return Err(err(
                "agents",
                "a multi-agent env (built-in policies other than random serve one agent; a multi-agent env takes random or onnx)",
            ));
        }
        if let Space::Discrete { .. } = self.observation {
            return Err(err(
                keys::OBSERVATION,
                format!(
                    "{}: built-in policies take a 1-D f32 or f64 box observation",
                    self.observation
                ),
            ));
        }
        let obs = self.observation.as_spec().map_err(|r| err(keys::OBSERVATION, r))?;
        let act = self.action.as_spec().map_err(|r| err(keys::ACTION, r))?;
        Ok((obs, act))
    }

    /// The same specs, each bound in its one form ([`Space::canonical`]): two specs are
    /// the same exactly when their canonical forms are equal.
    pub fn canonical(&self) -> EnvSpecs {
        EnvSpecs {
            observation: self.observation.canonical(),
            action: self.action.canonical(),
            agents: self.agents.clone(),
        }
    }

    /// The first difference between specs `a` of `name_a` and `b` of `name_b` (bounds
    /// compared in their canonical form: absent is unbounded), worded for an error (`node 1's observation is f64 box [17], node 0's is f32 box [17]`);
    /// `None` when they are equal.
    pub fn difference(name_a: &str, a: &EnvSpecs, name_b: &str, b: &EnvSpecs) -> Option<String> {
        let (la, lb) = (a.batch_layout(), b.batch_layout());
        if let Some(d) = crate::schema::named_difference(name_a, &la, name_b, &lb) {
            return Some(d);
        }
        if a.agents != b.agents {
            let show = |s: &EnvSpecs| {
                s.agents
                    .as_ref()
                    .map_or_else(|| "one agent".to_string(), |g| format!("{g:?}"))
            };
            return Some(format!(
                "{name_a}'s agents are {}, {name_b}'s are {}",
                BoundedDisplay(format_args!("{}", show(a))),
                BoundedDisplay(format_args!("{}", show(b)))
            ));
        }
        [
            (keys::OBSERVATION, &a.observation, &b.observation),
            (keys::ACTION, &a.action, &b.action),
        ]
        .into_iter()
        .find(|(_, x, y)| x.canonical() != y.canonical())
        .map(|(k, x, y)| match first_bound_difference(k, x, y) {
            Some((what, u, v)) => format!("{name_a}'s {} is {u}, {name_b}'s is {v}", Bounded(&what)),
            None => format!("{name_a}'s {k} is {x}, {name_b}'s is {y} (the same layout, other bounds or choices)"),
        })
    }
}

/// The first bound two boxes of one shape under batch key `key` disagree on (dicts
/// searched entry by entry), as `(observation.pos low bound 1, value, value)`.
fn first_bound_difference(key: &str, a: &Space, b: &Space) -> Option<(String, f64, f64)> {
    match (a.canonical(), b.canonical()) {
        (
            Space::Box {
                shape,
                low: la,
                high: ha,
                ..
            },
            Space::Box { low: lb, high: hb, .. },
        ) => {
            let n = numel(&shape)?;
            let get = |b: &Option<Bounds>, i: usize, none: f64| b.as_ref().map_or(none, |b| b.get(i));
            [("low", &la, &lb, f64::NEG_INFINITY), ("high", &ha, &hb, f64::INFINITY)]
                .into_iter()
                .find_map(|(name, x, y, none)| {
                    (0..n)
                        .find(|&i| get(x, i, none) != get(y, i, none))
                        .map(|i| (format!("{key} {name} bound {i}"), get(x, i, none), get(y, i, none)))
                })
        }
        (Space::Dict { spaces: sa }, Space::Dict { spaces: sb }) => sa.iter().find_map(|(name, x)| {
            let y = sb.get(name)?;
            first_bound_difference(&format!("{key}.{name}"), x, y)
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nodes_dict_names_and_shapes_are_shown_bounded_in_errors() {
        // The issue's 8 MiB dict name of control characters: a line of at most a few hundred bytes.
        let name = "\u{1}".repeat(8 << 20);
        let named = EnvSpecs {
            observation: Space::Dict {
                spaces: BTreeMap::from([(name, f32_box(&[1]))]),
            },
            action: Space::Discrete { n: 2, start: 0 },
            agents: None,
        };
        let e = named.validate().unwrap_err().to_string();
        assert!(e.len() < 2 * crate::peer_text::MAX_PRINTED, "{} bytes", e.len());
        assert!(
            e.contains(&format!(" … ({} bytes)", 8 << 20)) && !e.contains('\u{1}'),
            "{e}"
        );
        let shown = named.observation.to_string();
        assert!(
            shown.len() <= crate::peer_text::MAX_PRINTED + 7,
            "{} bytes",
            shown.len()
        );
        let wide = Space::Box {
            dtype: DType::F32,
            shape: vec![0; 1 << 20],
            low: None,
            high: None,
        };
        let e = EnvSpecs {
            observation: wide,
            action: Space::Discrete { n: 2, start: 0 },
            agents: None,
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.len() < 2 * crate::peer_text::MAX_PRINTED, "{} bytes: {e}", e.len());
        let key = SpaceError {
            key: format!("observation.{}", "\n".repeat(1000)),
            reason: "bad".into(),
        };
        assert!(key.to_string().ends_with(" … (1012 bytes): bad"), "{key}");
    }

    fn f32_box(shape: &[usize]) -> Space {
        Space::Box {
            dtype: DType::F32,
            shape: shape.to_vec(),
            low: Some(Bounds::Uniform(-1.0)),
            high: Some(Bounds::Uniform(1.0)),
        }
    }

    #[test]
    fn a_builtin_envs_specs_give_the_layout_they_always_had() {
        let obs = Spec::uniform_box(4, -1.0, 1.0);
        let act = Spec::Discrete { n: 2 };
        let specs = EnvSpecs::from_specs(&obs, &act);
        specs.validate().unwrap();
        assert_eq!(specs.batch_layout(), batch_layout(&obs, &act));
        let cont = Spec::uniform_box(1, -2.0, 2.0);
        assert_eq!(
            EnvSpecs::from_specs(&obs, &cont).batch_layout(),
            batch_layout(&obs, &cont)
        );
        assert_eq!(specs.policy_specs(), Ok((obs, act)), "and give back the same specs");
    }

    #[test]
    fn observations_keep_their_dtype_and_dicts_become_nested_keys() {
        let pixels = Space::Box {
            dtype: DType::U8,
            shape: vec![210, 160, 3],
            low: Some(Bounds::Uniform(0.0)),
            high: Some(Bounds::Uniform(255.0)),
        };
        let specs = EnvSpecs {
            observation: Space::Dict {
                spaces: BTreeMap::from([
                    ("pixels".to_string(), pixels),
                    ("step".to_string(), Space::Discrete { n: 10, start: 0 }),
                ]),
            },
            action: Space::MultiDiscrete { nvec: vec![3, 2] },
            agents: None,
        };
        specs.validate().unwrap();
        let l = specs.batch_layout();
        assert_eq!(l["observation.pixels"], (DType::U8, vec![210, 160, 3]));
        assert_eq!(l["next.observation.pixels"], (DType::U8, vec![210, 160, 3]));
        assert_eq!(l["observation.step"], (DType::I64, vec![]));
        assert_eq!(l[keys::ACTION], (DType::I64, vec![2]));
        assert!(!l.contains_key(keys::OBSERVATION));
        assert_eq!(l[keys::NEXT_DONE], (DType::Bool, vec![1]));
        let per = 2 * (210 * 160 * 3 + 8) + 2 * 8 + 4 + 3 + 8 + 8;
        assert_eq!(specs.bytes_per_frame(), Some(per));
        let e = specs.policy_specs().unwrap_err();
        assert_eq!(e.key, "observation");
        assert!(e.reason.contains("dict {pixels, step}"), "{e}");
    }

    #[test]
    fn a_hostile_space_is_refused_naming_the_key_before_anything_is_sized_by_it() {
        let huge = EnvSpecs {
            observation: Space::Box {
                dtype: DType::F64,
                shape: vec![usize::MAX, 2],
                low: None,
                high: None,
            },
            action: Space::Discrete { n: 2, start: 0 },
            agents: None,
        };
        let e = huge.validate().unwrap_err();
        assert_eq!(e.key, "observation");
        assert!(e.reason.contains("more than"), "{e}");
        let deep = (0..=MAX_DICT_DEPTH).fold(f32_box(&[1]), |s, _| Space::Dict {
            spaces: BTreeMap::from([("a".to_string(), s)]),
        });
        let e = EnvSpecs {
            observation: deep,
            action: Space::Discrete { n: 2, start: 0 },
            agents: None,
        }
        .validate()
        .unwrap_err();
        assert!(e.reason.contains("nested deeper"), "{e}");
        let dotted = Space::Dict {
            spaces: BTreeMap::from([("a.b".to_string(), f32_box(&[1]))]),
        };
        let e = EnvSpecs {
            observation: dotted,
            action: Space::Discrete { n: 2, start: 0 },
            agents: None,
        }
        .validate()
        .unwrap_err();
        assert!(e.reason.contains("without a dot"), "{e}");
        let e = EnvSpecs {
            observation: f32_box(&[3]),
            action: Space::Discrete { n: 3, start: i64::MAX },
            agents: None,
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.key, "action");
        let bounds = Space::Box {
            dtype: DType::F32,
            shape: vec![3],
            low: Some(Bounds::Each(vec![0.0; 2])),
            high: None,
        };
        let e = EnvSpecs {
            observation: bounds,
            action: Space::Discrete { n: 2, start: 0 },
            agents: None,
        }
        .validate()
        .unwrap_err();
        assert!(e.reason.contains("2 low bounds for a box of 3"), "{e}");
        let e = EnvSpecs {
            observation: f32_box(&[3]),
            action: Space::Dict {
                spaces: BTreeMap::from([("a".to_string(), f32_box(&[1]))]),
            },
            agents: None,
        }
        .validate()
        .unwrap_err();
        assert!(e.reason.contains("dict action"), "{e}");
    }

    #[test]
    fn specs_read_from_json_and_msgpack_as_protocol_md_writes_them() {
        let json = r#"{"observation": {"kind": "box", "dtype": "f64", "shape": [17]},
                       "action": {"kind": "box", "dtype": "f32", "shape": [6], "low": -1, "high": 1}}"#;
        let specs: EnvSpecs = serde_json::from_str(json).unwrap();
        specs.validate().unwrap();
        assert_eq!(specs.batch_layout()[keys::OBSERVATION], (DType::F64, vec![17]));
        let (obs, act) = specs.policy_specs().unwrap();
        assert_eq!(obs.dim(), 17);
        assert_eq!(act, Spec::uniform_box(6, -1.0, 1.0));
        let bytes = rmp_serde::to_vec_named(&specs).unwrap();
        assert_eq!(rmp_serde::from_slice::<EnvSpecs>(&bytes).unwrap(), specs);
    }

    #[test]
    fn bounds_compare_at_the_boxs_precision_and_the_first_different_one_is_named() {
        let node = EnvSpecs::from_specs(
            &Spec::Box {
                low: vec![-1.0, -4.0 * std::f32::consts::PI],
                high: vec![1.0, 4.0 * std::f32::consts::PI],
            },
            &Spec::Discrete { n: 3 },
        );
        let json = r#"{"observation": {"kind": "box", "dtype": "f32", "shape": [2],
                       "low": [-1, -12.566371], "high": [1, 12.566371]},
                       "action": {"kind": "discrete", "n": 3}}"#;
        let declared: EnvSpecs = serde_json::from_str(json).unwrap();
        assert_eq!(EnvSpecs::difference("node 0", &node, "declared", &declared), None);
        let unbounded: EnvSpecs = serde_json::from_str(
            r#"{"observation": {"kind": "box", "dtype": "f32", "shape": [2], "low": -1, "high": [1, 12.566371]},
                "action": {"kind": "discrete", "n": 3}}"#,
        )
        .unwrap();
        let d = EnvSpecs::difference("node 0", &node, "declared", &unbounded).unwrap();
        assert!(
            d.starts_with("node 0's observation low bound 1 is -12.566370964050293, declared's is -1"),
            "{d}"
        );
    }

    #[test]
    fn a_discrete_observation_is_refused_for_built_in_policies_as_the_python_node_refuses_it() {
        let specs = EnvSpecs {
            observation: Space::Discrete { n: 16, start: 0 },
            action: Space::Discrete { n: 4, start: 0 },
            agents: None,
        };
        specs.validate().unwrap();
        let e = specs.policy_specs().unwrap_err();
        assert_eq!(e.key, "observation");
        assert!(e.reason.contains("discrete 16"), "{e}");
    }

    #[test]
    fn two_specs_differ_first_by_layout_then_by_bounds() {
        let a = EnvSpecs::from_specs(&Spec::uniform_box(4, -1.0, 1.0), &Spec::Discrete { n: 2 });
        let b = EnvSpecs::from_specs(&Spec::uniform_box(4, -2.0, 2.0), &Spec::Discrete { n: 2 });
        let c = EnvSpecs::from_specs(&Spec::uniform_box(4, -1.0, 1.0), &Spec::Discrete { n: 3 });
        assert_eq!(EnvSpecs::difference("node 1", &a, "node 0", &a), None);
        let d = EnvSpecs::difference("node 1", &b, "node 0", &a).unwrap();
        assert!(
            d.starts_with("node 1's observation low bound 0 is -2, node 0's is -1"),
            "{d}"
        );
        let d = EnvSpecs::difference("node 1", &c, "node 0", &a).unwrap();
        assert!(
            d.starts_with("node 1's action is discrete 3, node 0's is discrete 2"),
            "{d}"
        );
    }

    #[test]
    fn bounds_written_either_way_are_the_same_specs_and_other_bounds_are_not() {
        let unbounded = EnvSpecs::from_specs(
            &Spec::uniform_box(2, f32::NEG_INFINITY, f32::INFINITY),
            &Spec::Discrete { n: 2 },
        );
        let absent = EnvSpecs {
            observation: Space::Box {
                dtype: DType::F32,
                shape: vec![2],
                low: None,
                high: None,
            },
            action: Space::Discrete { n: 2, start: 0 },
            agents: None,
        };
        assert_ne!(unbounded, absent, "written otherwise");
        assert_eq!(EnvSpecs::difference("a", &unbounded, "b", &absent), None);
        // JSON has no infinity: the canonical form goes through it unchanged.
        let json = serde_json::to_string(&unbounded.canonical()).unwrap();
        let back: EnvSpecs = serde_json::from_str(&json).unwrap();
        assert_eq!(back, absent);
        let uniform = EnvSpecs::from_specs(&Spec::uniform_box(2, -1.0, 1.0), &Spec::Discrete { n: 2 });
        let mut each = uniform.clone();
        each.observation = f32_box(&[2]);
        assert_eq!(EnvSpecs::difference("a", &uniform, "b", &each), None, "[-1, -1] is -1");
        let d = EnvSpecs::difference("a", &uniform, "b", &absent).expect("bounded and unbounded differ");
        assert!(d.starts_with("a's observation low bound 0 is -1, b's is -inf"), "{d}");
    }

    #[test]
    fn an_onnx_policy_records_by_its_head_whatever_the_observation() {
        use crate::policy::{OnnxHead, OnnxModel, PolicyConfig, Recorded};
        let specs = EnvSpecs {
            observation: Space::Box {
                dtype: DType::U8,
                shape: vec![12, 12, 3],
                low: Some(Bounds::Uniform(0.0)),
                high: Some(Bounds::Uniform(255.0)),
            },
            action: Space::Discrete { n: 3, start: 0 },
            agents: None,
        };
        let onnx = |head| PolicyConfig::Onnx {
            model: OnnxModel::new(Vec::new()),
            head,
            state: vec![],
            exploration: None,
        };
        assert_eq!(
            specs.recorded(&onnx(OnnxHead::Categorical)),
            Recorded::Categorical { n: 3 }
        );
        assert_eq!(specs.recorded(&onnx(OnnxHead::Deterministic)), Recorded::None);
        // The built-ins cannot take an image: they record nothing and are refused elsewhere.
        assert_eq!(specs.recorded(&PolicyConfig::Linear), Recorded::None);
    }

    /// simple_spread's specs (one group `agent` of three) plus a group of one with a
    /// dict observation and a box action.
    fn two_groups() -> EnvSpecs {
        EnvSpecs {
            observation: Space::Dict {
                spaces: BTreeMap::from([
                    ("agent".to_string(), f32_box(&[18])),
                    (
                        "adversary".to_string(),
                        Space::Dict {
                            spaces: BTreeMap::from([("pos".to_string(), f32_box(&[2]))]),
                        },
                    ),
                ]),
            },
            action: Space::Dict {
                spaces: BTreeMap::from([
                    ("agent".to_string(), Space::Discrete { n: 5, start: 0 }),
                    ("adversary".to_string(), f32_box(&[2])),
                ]),
            },
            agents: Some(BTreeMap::from([
                (
                    "agent".to_string(),
                    vec!["agent_0".to_string(), "agent_1".to_string(), "agent_2".to_string()],
                ),
                ("adversary".to_string(), vec!["adversary_0".to_string()]),
            ])),
        }
    }

    #[test]
    fn a_multi_agent_envs_batches_have_torchrls_per_group_layout() {
        let specs = two_groups();
        specs.validate().unwrap();
        let l = specs.batch_layout();
        assert_eq!(l["agent.observation"], (DType::F32, vec![3, 18]));
        assert_eq!(l["next.agent.observation"], (DType::F32, vec![3, 18]));
        assert_eq!(l["agent.action"], (DType::I64, vec![3]));
        assert_eq!(l["agent.mask"], (DType::Bool, vec![3]));
        assert_eq!(l["next.agent.reward"], (DType::F32, vec![3, 1]));
        for flag in ["done", "terminated", "truncated"] {
            assert_eq!(l[&format!("next.agent.{flag}")], (DType::Bool, vec![3, 1]));
            assert_eq!(l[&format!("next.adversary.{flag}")], (DType::Bool, vec![1, 1]));
            assert_eq!(l[&format!("next.{flag}")], (DType::Bool, vec![1]), "the env's own");
        }
        assert_eq!(l["adversary.observation.pos"], (DType::F32, vec![1, 2]));
        assert_eq!(l["adversary.action"], (DType::F32, vec![1, 2]));
        for single in [
            keys::OBSERVATION,
            keys::ACTION,
            keys::NEXT_REWARD,
            keys::NEXT_OBSERVATION,
        ] {
            assert!(!l.contains_key(single), "no root {single}");
        }
        assert_eq!(l[keys::TRAJ_IDS], (DType::I64, vec![]));
        assert_eq!(l[keys::STEP_COUNT], (DType::I64, vec![1]));
        assert_eq!(l["next.agent.mask"], (DType::Bool, vec![3]));
        assert_eq!(l.len(), 2 * 9 + 3 + 2, "{l:?}");
        // What a policy records is per agent, sized by each group's own action.
        let recorded = specs.recorded(&PolicyConfig::Random);
        assert_eq!(recorded, Recorded::LogProb);
        let r = specs.batch_layout_with(Recorded::Categorical { n: 5 }, &[]);
        assert_eq!(r["agent.action_log_prob"], (DType::F32, vec![3]));
        assert_eq!(r["agent.logits"], (DType::F32, vec![3, 5]));
        assert!(
            !r.contains_key("adversary.logits"),
            "a categorical head cannot act on a box"
        );
        let r = specs.batch_layout_with(Recorded::Normal { d: 9 }, &[]);
        assert_eq!(r["adversary.loc"], (DType::F32, vec![1, 2]));
        assert!(!r.contains_key(keys::ACTION_LOG_PROB));
    }

    #[test]
    fn a_multi_agent_envs_groups_are_checked_naming_the_key() {
        let refused = |f: &dyn Fn(&mut EnvSpecs)| {
            let mut s = two_groups();
            f(&mut s);
            s.validate().unwrap_err()
        };
        let e = refused(&|s| {
            s.agents.as_mut().unwrap().get_mut("agent").unwrap()[1] = "adversary_0".into();
        });
        assert!(e.key == "agents.agent" && e.reason.contains("given twice"), "{e}");
        let e = refused(&|s| {
            s.agents.as_mut().unwrap().get_mut("agent").unwrap().clear();
        });
        assert!(e.reason.contains("no agent"), "{e}");
        let e = refused(&|s| {
            s.agents.as_mut().unwrap().remove("adversary");
        });
        assert_eq!(e.key, "observation");
        assert!(e.reason.contains("\"adversary\" is no group"), "{e}");
        let e = refused(&|s| {
            s.action = Space::Discrete { n: 5, start: 0 };
        });
        assert!(e.key == "action" && e.reason.contains("dict of its groups"), "{e}");
        let e = refused(&|s| {
            if let Space::Dict { spaces } = &mut s.action {
                spaces.insert(
                    "agent".into(),
                    Space::Dict {
                        spaces: BTreeMap::from([("x".into(), f32_box(&[1]))]),
                    },
                );
            }
        });
        assert_eq!(e.key, "agent.action");
        let e = refused(&|s| {
            if let Space::Dict { spaces } = &mut s.observation {
                spaces.insert("agent".into(), Space::Discrete { n: 0, start: 0 });
            }
        });
        assert_eq!(e.key, "agent.observation");
        let e = refused(&|s| {
            let groups: BTreeMap<String, Vec<String>> = (0..=MAX_GROUPS)
                .map(|g| (format!("g{g}"), vec![format!("a{g}")]))
                .collect();
            s.agents = Some(groups);
        });
        assert!(e.reason.contains(&format!("{} groups", MAX_GROUPS + 1)), "{e}");
        let e = refused(&|s| {
            let agents = s.agents.as_mut().unwrap();
            let a = agents.remove("adversary").unwrap();
            agents.insert("next".into(), a);
        });
        assert!(e.reason.contains("\"next\" is a batch's own"), "{e}");
        // The built-ins other than random serve one agent.
        let e = two_groups().policy_specs().unwrap_err();
        assert_eq!(e.key, "agents");
        // Specs of other agents differ, naming them.
        let mut other = two_groups();
        other.agents.as_mut().unwrap().get_mut("agent").unwrap()[0] = "agent_9".into();
        let d = EnvSpecs::difference("node 1", &other, "node 0", &two_groups()).unwrap();
        assert!(d.starts_with("node 1's agents are"), "{d}");
        assert_eq!(
            EnvSpecs::difference("node 1", &two_groups(), "node 0", &two_groups()),
            None
        );
    }
}
