"""A recurrent policy's state, one per env (PROTOCOL.md §8, Recurrent; an exploration module's
noise is kept here the same way, §8, Exploration modules): every tensor zero when
the env is built and again on the first frame of each episode (``is_init``), handed to the
model with the frame and replaced by the model's ``next.<name>`` once the frame is kept.

The batch records, per frame, ``is_init`` (bool ``[1]``), the state the model read as
``<name>`` and the state it returned as ``next.<name>`` (f32, the state's shape). A frame the
``init_random_frames`` policy acts does not call the model: both keys record the state as it
stands, which does not advance.

A checkpoint holds each env's state as ``RolloutState.recurrent`` (``{"state": [[f32 ...]
per tensor, K rows each], "names": [str]}``, the reference node's form); whether an env's
next frame starts an episode needs no field of its own: it is ``step_count`` 0 after the
reset ``needs_reset`` asks for, both in ``EnvState``.
"""

import numpy as np

#: The batch key (and a recurrent model's input) saying a frame starts its episode
#: (torchrl's ``InitTracker``).
IS_INIT = "is_init"
#: The prefix of the state a model returns, as its outputs' names and as batch keys.
NEXT = "next."


class RecurrentState:
    """The state of every env of a node: ``tensors`` is the policy's ``[(name, shape)]``,
    ``envs`` the node's envs (the rows of its batches)."""

    def __init__(self, tensors, envs):
        self.names = [name for name, _ in tensors]
        self.shapes = [tuple(shape) for _, shape in tensors]
        self.values = [np.zeros((envs, *shape), np.float32) for shape in self.shapes]

    def layout(self):
        """The batch's recurrent keys, ``{key: [dtype, feature shape]}``: ``is_init``, then
        ``<name>`` and ``next.<name>`` of each tensor."""
        out = {IS_INIT: ["bool", [1]]}
        for name, shape in zip(self.names, self.shapes):
            out[name] = ["f32", list(shape)]
            out[NEXT + name] = ["f32", list(shape)]
        return out

    def begin(self, rows, step_count):
        """What the frames of the envs ``rows`` (None: all), at ``step_count``, read:
        ``(is_init, values)`` as ``OnnxPolicy.act_recording`` takes them, bool ``[k]`` and a
        copy of each tensor's rows. A frame of step 0 starts its episode: its env's state is
        zeroed first."""
        is_init = step_count == 0
        if is_init.any():
            where = is_init if rows is None else np.asarray(rows)[is_init]
            for v in self.values:
                v[where] = 0
        return is_init, [v.copy() if rows is None else v[rows] for v in self.values]

    def record(self, step, rec, held=None):
        """Adds the frames' ``is_init`` and ``<name>`` (``step``, from :meth:`begin`) to ``rec``
        (what the policy recorded, its ``next.<name>`` among it); ``held`` (bool ``[k]``, or
        True: all): rows the model did not act, whose ``next.<name>`` is the state they read
        (the ``init_random_frames`` frames)."""
        is_init, values = step
        rec[IS_INIT] = is_init.reshape(-1, 1)
        for name, v in zip(self.names, values):
            rec[name] = v
            if held is True:
                rec[NEXT + name] = v.copy()
            elif held is not None:
                rec[NEXT + name][held] = v[held]
        return rec

    def advance(self, env, rec):
        """The frames ``rec`` recorded are kept: each env's state is its frame's ``next.<name>``
        (``env`` None: a frame of every env; else that env's frame alone)."""
        for name, v in zip(self.names, self.values):
            if env is None:
                v[...] = rec[NEXT + name]
            else:
                v[env] = rec[NEXT + name]

    def to_wire(self, rows):
        """``RolloutState.recurrent`` of the envs ``rows`` (one worker's): per tensor, its rows'
        values flat in C order."""
        return {"state": [v[rows].reshape(-1).tolist() for v in self.values], "names": list(self.names)}

    def from_wire(self, r, k, worker):
        """The ``[k, *shape]`` arrays of ``RolloutState.recurrent`` ``r`` of ``worker`` (its
        ``k`` envs), checked against this policy's tensors (ValueError naming what does not
        fit); nothing is changed: :meth:`put` applies them."""
        where = f"worker {worker}'s recurrent state (RolloutState.recurrent)"
        if not isinstance(r, dict):
            raise ValueError(
                f"{where} is missing: this node's policy keeps a state per env (a trainer that drops the field cannot resume it)"
            )
        names, state = r.get("names"), r.get("state")
        if names != self.names:
            raise ValueError(f"{where} is of the tensors {names!r:.200}, this policy's are {self.names}")
        if not isinstance(state, list) or len(state) != len(self.names):
            raise ValueError(f"{where}: `state` must hold one array per tensor ({len(self.names)})")
        out = []
        for name, shape, values in zip(self.names, self.shapes, state):
            n = k * int(np.prod(shape, dtype=np.int64))
            if not isinstance(values, list) or len(values) != n:
                got = len(values) if isinstance(values, list) else type(values).__name__
                raise ValueError(f"{where}: `{name}` has {got} values, {k} envs of {list(shape)} are {n}")
            try:
                out.append(np.array(values, np.float32).reshape((k, *shape)))
            except (TypeError, ValueError) as e:
                raise ValueError(f"{where}: `{name}` holds a value that is not a float: {e}") from None
        return out

    def put(self, rows, arrays):
        """Sets the envs ``rows``' state to ``arrays`` (from :meth:`from_wire`)."""
        for v, a in zip(self.values, arrays):
            v[rows] = a
