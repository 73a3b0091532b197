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
_ENV = [("name", _str, True), ("config", _any, False)]
_POLICY = [("config", _map, True), ("exploration", _str, False), ("init_seed", _uint, False)]
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
