"""An env's gymnasium spaces as the node reports them in ``ready.specs`` (PROTOCOL.md §3,
Spaces; ``rollout::space`` on the Rust side), and the batch entries they give.

Box -> ``box`` of f32, f64 (f32 with ``double_to_float``, as torchrl's DoubleToFloat), u8
(uint8 and bool) or i64 (every other integer dtype); Discrete -> ``discrete`` (n, start);
1-D MultiDiscrete -> ``multi_discrete``; 1-D MultiBinary -> ``multi_binary``; Dict ->
``dict`` (observations only), each leaf a batch key of its own (``observation.<name>``).
Anything else raises :class:`SpaceError` naming the batch key and the space.
"""

import gymnasium as gym
import numpy as np

#: The wire's dtype names of the batch entries, as numpy dtypes.
NUMPY = {"f32": np.dtype(np.float32), "f64": np.dtype(np.float64), "u8": np.dtype(np.uint8), "i64": np.dtype(np.int64)}

#: Policies with weights: they take a 1-D float box observation and a discrete or 1-D box action.
WEIGHTED = ("linear", "mlp", "constant")

_SUPPORTED = "spaces are Box, Discrete, 1-D MultiDiscrete, 1-D MultiBinary and (observations) Dict"

#: The most per-element numbers ``ready.specs`` may hold over all its spaces (per-element
#: bounds and ``nvec`` entries; ``MAX_SPEC_VALUES`` on the Rust side): a box with more
#: elements must have the same bound for every element, sent as one number.
MAX_SPEC_VALUES = 1 << 20


class SpaceError(Exception):
    """A space the node cannot collect (or its policy cannot take); ``key`` is the batch key."""

    def __init__(self, key, reason, message=None):
        super().__init__(message or f"{key}: {reason}")
        self.key, self.reason = key, reason


def box_dtype(space, key, double_to_float=False):
    """The wire dtype a Box's values are kept in."""
    dt = np.dtype(space.dtype)
    if dt == np.float32:
        return "f32"
    if dt == np.float64:
        return "f32" if double_to_float else "f64"
    if dt == np.uint8 or dt == np.bool_:
        return "u8"
    if np.issubdtype(dt, np.integer):
        return "i64"
    raise SpaceError(key, f"{space} of {dt} cannot be collected (boxes are of floats, integers or bools)")


def _bounds(values, dtype):
    """One float when every element is the same, else one per element in C order; the values
    as the box's wire dtype holds them (an f64 box taken as f32 has f32 bounds)."""
    a = np.asarray(values)
    a = a.astype(np.float32 if dtype == "f32" else np.float64).astype(np.float64).reshape(-1)
    if a.size and (a == a[0]).all():
        return float(a[0])
    return [float(v) for v in a]


def _int_list(values, key, what):
    a = np.asarray(values)
    if a.ndim != 1:
        raise SpaceError(key, f"{what} of shape {list(a.shape)} cannot be collected (only 1-D ones)")
    return [int(v) for v in a]


def to_wire(space, key, double_to_float=False):
    """The ``Space`` map of ``space`` (found under batch key ``key``)."""
    if isinstance(space, gym.spaces.Box):
        dtype = box_dtype(space, key, double_to_float)
        return {"kind": "box", "dtype": dtype, "shape": [int(d) for d in space.shape],
                "low": _bounds(space.low, dtype), "high": _bounds(space.high, dtype)}
    if isinstance(space, gym.spaces.Discrete):
        out = {"kind": "discrete", "n": int(space.n)}
        if int(space.start) != 0:
            out["start"] = int(space.start)
        return out
    if isinstance(space, gym.spaces.MultiDiscrete):
        nvec = _int_list(space.nvec, key, f"{space}")
        if any(int(s) != 0 for s in np.asarray(space.start).reshape(-1)):
            raise SpaceError(key, f"{space} starts at {np.asarray(space.start).tolist()}: multi-discrete values start at 0")
        return {"kind": "multi_discrete", "nvec": nvec}
    if isinstance(space, gym.spaces.MultiBinary):
        if len(space.shape) != 1:
            raise SpaceError(key, f"{space} of shape {list(space.shape)} cannot be collected (only 1-D ones)")
        return {"kind": "multi_binary", "n": int(space.shape[0])}
    if isinstance(space, gym.spaces.Dict):
        out = {}
        for name, sub in space.spaces.items():
            if not isinstance(name, str) or not name or "." in name:
                raise SpaceError(key, f"{space}: entry name {name!r} is not a non-empty string without a dot")
            out[name] = to_wire(sub, f"{key}.{name}", double_to_float)
        return {"kind": "dict", "spaces": out}
    raise SpaceError(key, f"{space} cannot be collected ({_SUPPORTED})")


class Leaf:
    """One batch entry of an observation: ``suffix`` ("" or ``.name``...) after
    ``observation``/``next.observation``, ``path`` (the dict keys down to it), the wire
    dtype, the numpy dtype and the feature shape."""

    def __init__(self, suffix, path, dtype, shape):
        self.suffix, self.path, self.dtype, self.shape = suffix, path, dtype, tuple(shape)
        self.np = NUMPY[dtype]

    def get(self, obs):
        """This leaf's value in one observation of the env."""
        for name in self.path:
            obs = obs[name]
        return obs


def entry(wire_space, action=False):
    """The batch entry ``(dtype, shape)`` of a space that is no dict (``EnvSpecs::batch_layout``)."""
    kind = wire_space["kind"]
    if kind == "box":
        return ("f32" if action else wire_space["dtype"]), list(wire_space["shape"])
    if kind == "discrete":
        return "i64", []
    if kind == "multi_discrete":
        return "i64", [len(wire_space["nvec"])]
    return "u8", [wire_space["n"]]


def leaves(wire_space, suffix="", path=()):
    """The observation's batch entries, a dict's leaves in name order."""
    if wire_space["kind"] == "dict":
        out = []
        for name in sorted(wire_space["spaces"]):
            out += leaves(wire_space["spaces"][name], f"{suffix}.{name}", path + (name,))
        return out
    return [Leaf(suffix, path, *entry(wire_space))]


def specs(observation_space, action_space, double_to_float=False):
    """``ready.specs`` of an env of these spaces (SpaceError when one cannot be collected)."""
    action = to_wire(action_space, "action", double_to_float)
    if action["kind"] == "dict":
        raise SpaceError("action", f"{action_space}: a dict action space cannot be collected")
    if action["kind"] == "box" and action["dtype"] not in ("f32", "f64"):
        raise SpaceError("action", f"{action_space}: box actions are of floats")
    out = {"observation": to_wire(observation_space, "observation", double_to_float), "action": action}
    used = 0
    for key in ("observation", "action"):
        used = _count_values(out[key], key, used)
    return out


def _count_values(wire_space, key, used):
    """``used`` plus the per-element numbers of ``wire_space``; SpaceError naming the key
    of the space that takes them past MAX_SPEC_VALUES (the trainer would refuse them)."""
    if wire_space["kind"] == "dict":
        for name in sorted(wire_space["spaces"]):
            used = _count_values(wire_space["spaces"][name], f"{key}.{name}", used)
        return used
    lists = [wire_space.get(k) for k in ("low", "high", "nvec")]
    used += sum(len(v) for v in lists if isinstance(v, list))
    if used > MAX_SPEC_VALUES:
        raise SpaceError(key, f"{describe(wire_space)} has bounds that differ per element, more than "
                              f"{MAX_SPEC_VALUES} numbers in all: the trainer takes as many per-element bounds "
                              "at most (a bound the same for every element is one number)")
    return used


def layout(env_specs):
    """The layout of every batch of an env of ``env_specs`` (``EnvSpecs::batch_layout``):
    ``{key: [dtype, shape]}``."""
    out = {}
    for leaf in leaves(env_specs["observation"]):
        for head in ("observation", "next.observation"):
            out[head + leaf.suffix] = [leaf.dtype, list(leaf.shape)]
    out["action"] = list(entry(env_specs["action"], action=True))
    out.update({
        "next.reward": ["f32", [1]], "next.done": ["bool", [1]], "next.terminated": ["bool", [1]],
        "next.truncated": ["bool", [1]], "collector.traj_ids": ["i64", []], "step_count": ["i64", [1]],
    })
    return out


def describe(wire_space):
    """How errors show a space, as the trainer does: ``u8 box [210, 160, 3]``, ``discrete 6``."""
    kind = wire_space["kind"]
    if kind == "box":
        return f"{wire_space['dtype']} box {list(wire_space['shape'])}"
    if kind == "discrete":
        start = wire_space.get("start", 0)
        return f"discrete {wire_space['n']}" + (f" from {start}" if start else "")
    if kind == "multi_discrete":
        return f"multi-discrete {wire_space['nvec']}"
    if kind == "multi_binary":
        return f"multi-binary {wire_space['n']}"
    return "dict {" + ", ".join(sorted(wire_space["spaces"])) + "}"


def check_policy(kind, env_specs):
    """Refuses specs a policy with weights cannot take (``EnvSpecs::policy_specs``), naming the key."""
    if kind not in WEIGHTED:
        return
    for key in ("observation", "action"):
        s = env_specs[key]
        ok = (s["kind"] == "box" and s["dtype"] in ("f32", "f64") and len(s["shape"]) == 1) or s["kind"] == "discrete"
        if key == "observation" and s["kind"] == "discrete":
            ok = False
        if not ok:
            takes = "a 1-D f32 or f64 box" if key == "observation" else "a 1-D f32 or f64 box or a discrete space"
            reason = f"{describe(s)} (it takes {takes})"
            raise SpaceError(key, reason, f"policy {kind} cannot take {key}: {reason}")
