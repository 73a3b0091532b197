"""The ``welcome`` frame's spec (PROTOCOL.md §3, NodeSpec) checked field by field before
anything is built from it: a malformed one is a one-line reason naming the field (sent
as ``failed``), not a traceback from deep inside the env or policy code."""


class SpecError(ValueError):
    """A field of the spec is missing or of the wrong type; the message names it."""


def _uint(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _bool(v):
    return isinstance(v, bool)


def _str(v):
    return isinstance(v, str)


def _map(v):
    return isinstance(v, dict)


def _any(v):
    return True


_KINDS = {_uint: "a uint", _int: "an int", _bool: "a bool", _str: "a string", _map: "a map", _any: "anything"}

# (name, type check, required); a field that is not required may be absent (nil where
# PROTOCOL.md writes `T?`).
_TOP = [
    ("index", _uint, True),
    ("env", _map, True),
    ("policy", _map, True),
    ("envs_per_node", _uint, True),
    ("envs_per_worker", _uint, False),
    ("first_lane", _uint, True),
    ("lanes", _uint, True),
    ("rollout", _map, True),
    ("max_restarts", _uint, False),
    ("restart_window_ms", _uint, False),
    ("worker_nice", _int, False),
]
_ENV = [("name", _str, True), ("config", _any, False), ("done_on_any", _bool, False)]
_POLICY = [("config", _map, True), ("exploration", _str, False), ("init_seed", _uint, False), ("record", _bool, False)]
_ROLLOUT = [
    ("frames_per_batch", _uint, True),
    ("max_frames_per_traj", _uint, False),
    ("reset_at_each_iter", _bool, True),
    ("init_random_frames", _uint, True),
    ("seed", _uint, True),
    ("nan_is_failure", _bool, True),
]


def _fields(value, where, fields, nil_allowed=()):
    for name, ok, required in fields:
        path = f"{where}.{name}"
        if name not in value:
            if required:
                raise SpecError(f"{path} is missing")
            continue
        v = value[name]
        if v is None and name in nil_allowed:
            continue
        if not ok(v):
            raise SpecError(f"{path} must be {_KINDS[ok]}, got {type(v).__name__} {v!r:.40}")


def check(spec):
    """Raises :class:`SpecError` naming the first field of ``spec`` that is missing or
    mistyped; unknown fields are ignored (a newer trainer may send more)."""
    if not _map(spec):
        raise SpecError(f"spec must be a map, got {type(spec).__name__}")
    _fields(spec, "spec", _TOP)
    _fields(spec["env"], "spec.env", _ENV)
    _fields(spec["policy"], "spec.policy", _POLICY)
    _fields(spec["rollout"], "spec.rollout", _ROLLOUT, nil_allowed=("max_frames_per_traj",))
    config = spec["policy"]["config"]
    if config.get("kind") == "onnx":
        state_tensors(config.get("state"))


#: Limits of a recurrent policy's ``state`` (PROTOCOL.md §8, Recurrent): tensors, elements
#: of one per env; and what the trainer's ``ready.layout`` reader takes of a key (§3,
#: Spaces): its bytes, its feature dimensions.
MAX_STATE_TENSORS = 8
MAX_STATE_ELEMENTS = 1 << 20
MAX_STATE_NAME_BYTES = 128
MAX_RANK = 8
#: Names a state tensor may not take, nor any under them: keys every batch holds or its
#: recurrent part or a head adds, and the groups of the ``next.`` and ``collector.`` keys.
_RESERVED = (
    "observation",
    "action",
    "is_init",
    "step_count",
    "action_log_prob",
    "logits",
    "loc",
    "scale",
    "action_value",
    "chosen_action_value",
    "next",
    "collector",
)
_RESERVED_PREFIXES = tuple(r + "." for r in _RESERVED)
_STATE = "spec.policy.config.state"


def state_tensors(state):
    """The ``[(name, shape)]`` of an ``onnx`` config's ``state`` (absent, nil or empty: ``[]``,
    a policy without state), checked: each entry ``{name: str, shape: [uint]}``, the name a
    batch key of its own, at most 8 tensors of at most 2^20 elements each and no zero
    dimension, names unique and none nested under another.
    Raises :class:`SpecError` naming the entry's field. (Clashes with the keys of this env's
    observation and of the head are checked once they are known: :func:`check_state_keys`.)"""
    if state is None:
        return []
    if not isinstance(state, list):
        raise SpecError(f"{_STATE} must be an array, got {type(state).__name__} {state!r:.40}")
    if len(state) > MAX_STATE_TENSORS:
        raise SpecError(f"{_STATE} has {len(state)} tensors, at most {MAX_STATE_TENSORS} are allowed")
    out = []
    for i, entry in enumerate(state):
        where = f"{_STATE}[{i}]"
        if not _map(entry):
            raise SpecError(f"{where} must be a map, got {type(entry).__name__} {entry!r:.40}")
        _fields(entry, where, [("name", _str, True), ("shape", _any, True)])
        name = _state_name(entry["name"], where)
        if name in (n for n, _ in out):
            raise SpecError(f"{where}.name `{name}` is the name of another state tensor")
        nested = next((n for n, _ in out if name.startswith(n + ".") or n.startswith(name + ".")), None)
        if nested is not None:
            raise SpecError(f"{where}.name `{name}` and `{nested}` nest one under the other")
        out.append((name, _state_shape(entry["shape"], where)))
    return out


def _state_name(name, where):
    """``name`` if it may be a state tensor's batch key (SpecError naming ``where.name``)."""
    if len(name.encode("utf-8")) > MAX_STATE_NAME_BYTES:
        raise SpecError(
            f"{where}.name is {len(name.encode('utf-8'))} bytes, a state tensor's name at most {MAX_STATE_NAME_BYTES}"
        )
    if not name or any(not s for s in name.split(".")):
        raise SpecError(f"{where}.name {name!r:.60} is not a batch key (dotted, non-empty segments)")
    if name in _RESERVED or name.startswith(_RESERVED_PREFIXES):
        raise SpecError(
            f"{where}.name `{name}` is a key the batch has already, or nested under one ({', '.join(_RESERVED)})"
        )
    return name


def _state_shape(shape, where):
    """``shape`` as a tuple if it is an array of uint of at most 2^20 elements (checked as it
    is multiplied: SpecError naming ``where.shape``)."""
    if not isinstance(shape, list) or not all(_uint(d) for d in shape):
        raise SpecError(f"{where}.shape must be an array of uint, got {type(shape).__name__} {shape!r:.40}")
    if len(shape) > MAX_RANK:
        raise SpecError(f"{where}.shape has {len(shape)} dimensions, a batch key's feature shape at most {MAX_RANK}")
    if 0 in shape:
        raise SpecError(f"{where}.shape {shape} has a zero dimension")
    n = 1
    for d in shape:
        n *= d
        if n > MAX_STATE_ELEMENTS:
            raise SpecError(f"{where}.shape {shape} has over {MAX_STATE_ELEMENTS} elements (2^20 per env at most)")
    return tuple(shape)


def check_state_keys(state, keys):
    """Refuses a state tensor named as a key of the batch (``keys``: the env's and the head's),
    or above or under one (a TensorDict key cannot be a tensor and hold others): SpecError
    naming the entry."""
    for i, (name, _) in enumerate(state):
        for key in keys:
            if name == key or name.startswith(key + ".") or key.startswith(name + "."):
                how = "is" if name == key else "nests with"
                raise SpecError(f"{_STATE}[{i}].name `{name}` {how} the batch key `{key}`")
