"""The node's envs, as the Rust node lays them out (PROTOCOL.md §§3, 5, 8): env ``k`` of
``envs_per_node`` is one env of a gymnasium ``SyncVectorEnv``, row ``k`` of every batch,
trajectory-id lane ``first_lane + k``, first reset with seed ``rollout.seed + k``. Envs are
grouped into workers of ``envs_per_worker`` (a snapshot's worker entries, and the frames
``init_random_frames`` counts, are per worker).

A batch is stepped column by column with one policy call on every row's observation. An env
that raises is rebuilt alone (reseeded with the documented restart seed, its ids moved past
the ones it delivered) and its row of the batch collected again; the other rows keep theirs.

A recurrent ``onnx`` policy's state is kept here, one per env (``recurrent.RecurrentState``):
handed to the model with each frame, advanced once the frame is kept in the batch (a row
stepped again after another row's env failed reads the state it read the first time). A
rebuilt env's first frame starts an episode, so its state starts at zero. An exploration
module's noise (PROTOCOL.md §8, Exploration modules) is part of that state, kept the same way:
only the policy tells the model's tensors from the module's.
"""

import dataclasses
import time

import gymnasium as gym
import numpy as np

from . import node_spec, spaces, torchrl_env
from .policy import ActionSpace, Policy, fill_recorded, random_actions, random_log_density
from .recurrent import RecurrentState
from .torchrl_env import PICKLED_ENV

#: Defaults of ``spec.max_restarts`` and ``spec.restart_window_ms``.
DEFAULT_MAX_RESTARTS = 5
DEFAULT_RESTART_WINDOW_MS = 5000
_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
#: Entries of at least this many bytes per frame (images) are written straight into the
#: batch: a time-major scratch copy pays only for small ones.
_DIRECT_BYTES = 4096
#: Entries of feature shape [1] kept as one value per frame in the scratch columns.
_SCALAR_COLUMNS = ("next.reward", "next.terminated", "next.truncated", "step_count")
#: The numpy dtypes of what a policy records: its head's parameters and a recurrent state
#: (f32), ``is_init`` (bool).
_RECORDED_DTYPES = {"f32": np.float32, "bool": np.bool_}


class BuildError(Exception):
    """The env or the policy cannot be built from the trainer's spec."""


class NodeFailed(Exception):
    """The node cannot go on; the message is the `failed` frame's reason."""


class CheckpointError(Exception):
    """A snapshot or restore this node cannot do; it goes on serving."""


class Stopped(Exception):
    """``collect``'s stop event was set (the trainer said ``shutdown``, or the connection
    ended): the batch ended between steps and what it held is dropped, not a failure."""


#: Steps between two looks at ``collect``'s stop event, as in the Rust node: a stop is seen
#: within this many steps, at the cost of one test per step.
STOP_CHECK_STEPS = 64


def restart_seed(seed, restart):
    """The seed of restart ``restart`` of a worker whose own seed is ``seed`` (splitmix64)."""
    z = (seed ^ ((restart * _GOLDEN) & _MASK64)) & _MASK64
    z = (z + _GOLDEN) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


class _EnvFailed(Exception):
    """Env ``k`` raised ``cause``."""

    def __init__(self, k, cause):
        super().__init__(f"env {k}: {cause!r}")
        self.k, self.cause = k, cause


class _Blame(gym.Wrapper):
    """Names the env that raised in the vector env's resets and in the steps after a failure
    (the fast loop steps the env inside and names it itself)."""

    def __init__(self, env, k):
        super().__init__(env)
        self.k = k

    def step(self, action):
        try:
            return self.env.step(action)
        except Exception as e:
            raise _EnvFailed(self.k, e) from e

    def reset(self, **kwargs):
        try:
            return self.env.reset(**kwargs)
        except Exception as e:
            raise _EnvFailed(self.k, e) from e


def _import_for(name):
    """Registers the envs ``name`` needs that gymnasium does not know by itself: ``ALE/...``
    ids are ale-py's (importing it registers them)."""
    if name.startswith("ALE/") and name not in gym.registry:
        try:
            import ale_py

            gym.register_envs(ale_py)
        except ImportError as e:
            raise BuildError(f"env `{name}` is an Atari env: install ale-py (pip install ale-py): {e}") from None


class Workers:
    """The ``E`` env workers of one node and the state of their episodes."""

    def __init__(self, spec, double_to_float=False, allow_pickled_env=False):
        try:
            node_spec.check(spec)
        except node_spec.SpecError as e:
            raise BuildError(str(e)) from None
        env = spec.get("env") or {}
        self.env_name = env.get("name")
        config = env.get("config") or {}
        if not isinstance(self.env_name, str) or not isinstance(config, dict):
            raise BuildError("spec.env must be {name: str, config: map or nil}")
        self.config = config
        #: Multi-agent envs: the episode ends once any agent is done (else once every agent
        #: is); an env of one agent ends alike either way.
        self.done_on_any = bool(env.get("done_on_any", False))
        self.E = spec.get("envs_per_node")
        if not isinstance(self.E, int) or self.E < 1:
            raise BuildError("envs_per_node must be at least 1")
        self.K = spec.get("envs_per_worker", 1)
        if not isinstance(self.K, int) or self.K < 1 or self.E % self.K:
            raise BuildError(f"envs_per_worker must divide envs_per_node ({self.E}), got {self.K!r}")
        r = spec.get("rollout") or {}
        self.rollout = r
        self.seed = int(r.get("seed", 0))
        self.max_traj = r.get("max_frames_per_traj")
        self.reset_each = bool(r.get("reset_at_each_iter", False))
        self.init_random = int(r.get("init_random_frames", 0))
        self.nan_is_failure = bool(r.get("nan_is_failure", False))
        self.lanes = int(spec.get("lanes", 1))
        self.first_lane = int(spec.get("first_lane", 0))
        if self.lanes < 1 or self.first_lane + self.E > self.lanes:
            raise BuildError(f"lanes {self.first_lane}..{self.first_lane + self.E} are not in 0..{self.lanes}")
        self.max_restarts = int(spec.get("max_restarts", DEFAULT_MAX_RESTARTS))
        self.window = max(int(spec.get("restart_window_ms", DEFAULT_RESTART_WINDOW_MS)), 1) / 1000.0
        self.base_seed = self.seed
        self.allow_pickled_env = allow_pickled_env
        #: A torchrl env the trainer pickled (``torchrl_env``): it truncates its episodes itself.
        self.pickled = self.env_name == PICKLED_ENV
        try:
            self._build_envs(config)
        except BuildError:
            raise
        except Exception as e:
            if self.pickled:  # its config is the pickle: not shown
                raise BuildError(f"cannot make the pickled torchrl env: {e}") from None
            raise BuildError(f"cannot make env `{self.env_name}` with config {config}: {e}") from None
        try:
            self._build_policy(spec, double_to_float)
        except BaseException:
            self.close()
            raise
        E = self.E
        self.cur = [np.zeros((E,) + leaf.shape, leaf.np) for leaf in self.leaves]
        self.traj_id = np.full(E, -1, np.int64)
        self.step_count = np.zeros(E, np.int64)
        self.needs_reset = np.ones(E, bool)
        # Reset by the vector env inside its step (an episode ended): the new episode's
        # trajectory id is handed out at its first step, as the Rust node does at its reset.
        self.fresh = np.zeros(E, bool)
        self.pending_seed = [(self.seed + k) & _MASK64 for k in range(E)]
        self.next_id = np.array([self.first_lane + k for k in range(E)], np.int64)
        self.frames = np.zeros(E, np.int64)  # per worker: init_random_frames counts per worker
        self.delivered_max_id = np.full(E, -1, np.int64)
        self.delivered_frames = np.zeros(E, np.int64)
        self.restarts = [[] for _ in range(E)]  # times of each worker's restarts
        self.restart_count = [0] * E
        #: Arrays of batches sent already (``recycle``), by shape and dtype: a batch written
        #: into them touches no fresh page (an Atari batch is 200 kB a frame).
        self._pool = {}

    def _build_envs(self, config):
        """Builds the node's envs (a backend of other envs overrides it, with
        :meth:`_spaces`): here one gymnasium ``SyncVectorEnv`` of all ``E``, each made by
        ``gym.make`` or, for a pickled torchrl env, by the trainer's pickle."""
        if self.pickled:
            try:
                self._make_env = torchrl_env.factory(config, self.allow_pickled_env)
            except torchrl_env.PickledEnvError as e:
                raise BuildError(str(e)) from None
        else:
            _import_for(self.env_name)
            name = self.env_name
            self._make_env = lambda: _make(name, config)
        #: Episodes are truncated after this many steps (None: never), as gymnasium's
        #: ``TimeLimit`` would; the node applies it (see :func:`_make`).
        self.time_limit = None if self.pickled else time_limit(self.env_name, config)
        self.vec = gym.vector.SyncVectorEnv(
            [self._factory(k) for k in range(self.E)],
            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        )

    def _spaces(self):
        """One env's ``(observation_space, action_space)``."""
        return self.vec.single_observation_space, self.vec.single_action_space

    def refuse_checkpoint(self):
        """Raises CheckpointError when these envs cannot be snapshotted or restored at all
        (a pickled torchrl env; a backend whose env state is out of reach overrides it);
        gymnasium's envs are checked one by one in :func:`snapshot`."""
        if self.pickled:
            raise CheckpointError(
                "a pickled torchrl env cannot be checkpointed by the Python node (its state is the env's and "
                "its transforms', which the node cannot save); checkpoint runs of env ids"
            )

    def _build_policy(self, spec, double_to_float):
        """The specs, the observation's batch entries, the action space and the policy
        (SpaceError for a space the node or its policy cannot take)."""
        #: ``ready.specs`` (PROTOCOL.md §3, Spaces).
        self.specs = spaces.specs(*self._spaces(), double_to_float)
        self.leaves = spaces.leaves(self.specs["observation"])
        #: One observation entry (no dict): the fast loop writes the env's value as it is.
        self.single = len(self.leaves) == 1 and not self.leaves[0].path
        self._floats = [i for i, leaf in enumerate(self.leaves) if leaf.dtype in ("f32", "f64")]
        self.action = ActionSpace.of(self._spaces()[1])
        pol = spec.get("policy") or {}
        config = pol.get("config") if isinstance(pol.get("config"), dict) else {}
        kind = config.get("kind")
        #: The onnx policy takes every observation leaf (a model input each), as it is.
        self._all_leaves = kind == "onnx"
        #: A policy's state, per env: a recurrent model's and an exploration module's
        #: (None: a policy without one).
        self.recurrent = None
        if self._all_leaves:  # onnxruntime is imported only for it
            from .onnx_policy import OnnxPolicy

            self._cast = False
            seed = (self.seed * _GOLDEN) & _MASK64 ^ 1
            self.policy = OnnxPolicy(pol, self.leaves, self.action, seed, env_keys=spaces.layout(self.specs))
            self._withhold_records(pol)
            if self.policy.state:
                self.recurrent = RecurrentState(self.policy.state, self.E)
            return
        spaces.check_policy(kind, self.specs)
        weighted = kind in spaces.WEIGHTED
        self.obs_dim = self.leaves[0].shape[0] if weighted else None
        # A network's forward pass is f32: an f64 observation is cast for it (and only then).
        self._cast = weighted and self.leaves[0].dtype != "f32"
        self.policy = Policy(pol, self.obs_dim, self.action, (self.seed * _GOLDEN) & _MASK64 ^ 1)
        self._withhold_records(pol)

    def _withhold_records(self, pol):
        """``self.recorded``: what the policy records beside its actions, ``{key: [dtype,
        shape]}``, or nothing when the spec's ``policy.record`` is false (PROTOCOL.md §3,
        version 9): the policy's records are then dropped from each step's (``_actions``)."""
        #: The keys the policy records but the batches leave out.
        self._withheld = ()
        self.recorded = self.policy.recorded_layout()
        if pol.get("record", True) is False:
            self._withheld = tuple(self.recorded)
            self.recorded = {}

    def _factory(self, k):
        make = self._make_env
        return lambda: _Blame(make(), k)

    def layout(self):
        """The ``ready`` layout: each key's dtype and feature shape (``EnvSpecs::batch_layout``),
        with what the policy records (``EnvSpecs::batch_layout_recording``)."""
        return {**spaces.layout(self.specs), **self.recording()}

    def recording(self):
        """The keys the policy records in a batch beside the env's, ``{key: [dtype, shape]}``:
        its head's (``recorded``) and a recurrent policy's ``is_init`` and state keys."""
        if self.recurrent is None:
            return self.recorded
        return {**self.recorded, **self.recurrent.layout()}

    def set_seed(self, seed):
        """``seed {seed}``: env ``w`` starts a new episode seeded ``seed + w`` at its next step
        (the running one is cut, without ``done``); returns ``next_seed``."""
        self.base_seed = seed
        for k in range(self.E):
            self.pending_seed[k] = (seed + k) & _MASK64
        self.needs_reset[:] = True
        self.fresh[:] = False
        self.policy.reseed(((seed + self.E) * _GOLDEN) & _MASK64)
        return (seed + self.E) & _MASK64

    def _write(self, dsts, k, o):
        """Writes observation ``o`` of the env into row ``k`` of ``dsts`` (one array per entry)."""
        if self.single:
            dsts[0][k] = o
        else:
            for leaf, d in zip(self.leaves, dsts):
                d[k] = leaf.get(o)

    def _entries(self, o):
        """Observation ``o`` as one array per batch entry."""
        return [np.array(leaf.get(o), leaf.np) for leaf in self.leaves]

    def _nan_rows(self, arrays):
        """Rows of ``arrays`` (one per entry, ``[E, ...]``) with a NaN in a float entry."""
        bad = np.zeros(self.E, bool)
        for i in self._floats:
            bad |= np.isnan(arrays[i].reshape(self.E, -1)).any(axis=1)
        return bad

    def _has_nan(self, entries):
        return any(np.isnan(entries[i]).any() for i in self._floats)

    def _reset(self, rows):
        """Starts a new episode in every env of ``rows``, each reset with its pending seed."""
        # Fresh arrays: the old ones may be held by the batch being collected.
        self.cur = [c.copy() for c in self.cur]
        self.traj_id, self.step_count = self.traj_id.copy(), self.step_count.copy()
        self.needs_reset = self.needs_reset.copy()
        self.fresh = self.fresh.copy()
        for k in rows:
            seed, self.pending_seed[k] = self.pending_seed[k], None
            try:
                obs, _ = self.vec.envs[k].reset(seed=seed)
            except _EnvFailed:
                raise
            except Exception as e:
                raise _EnvFailed(int(k), e) from e
            self.fresh[k] = False
            self._write(self.cur, k, obs)
            if self.nan_is_failure and self._has_nan([c[k] for c in self.cur]):
                raise _EnvFailed(int(k), ValueError(f"env {k} produced a NaN observation"))
            self.traj_id[k] = self.next_id[k]
            self.next_id[k] += self.lanes
            self.step_count[k] = 0
            self.needs_reset[k] = False

    def _start_fresh(self, mask):
        """Hands out trajectory ids to the episodes the vector env started in ``mask``'s rows."""
        self.traj_id = np.where(mask, self.next_id, self.traj_id)
        self.next_id = self.next_id + self.lanes * mask
        self.step_count = np.where(mask, 0, self.step_count)
        self.fresh = self.fresh & ~mask

    def _actions(self, rows, stepped=0):
        """``_acting`` less what the batches leave out (``_withhold_records``)."""
        acts, rec = self._acting(rows, stepped)
        for key in self._withheld:
            rec.pop(key, None)
        return acts, rec

    def _acting(self, rows, stepped=0):
        """The actions of ``rows`` (None: every row), for their observation (a network's input:
        the first entry, f32): the random policy's for a worker still
        within its ``init_random_frames``, the policy's otherwise. ``stepped``: frames each
        row collected since ``frames`` was last brought up to date (the fast loop's)."""
        obs = self.cur[0] if rows is None else self.cur[0][rows]
        k = obs.shape[0]
        if self._cast:  # a network's forward pass is f32
            obs = obs.astype(np.float32)
        if self._all_leaves:
            obs = self.cur if rows is None else [c[rows] for c in self.cur]
        if self.recurrent is not None:
            return self._recurrent_actions(rows, obs, k, stepped)
        if not self.init_random:
            return self.policy.act_recording(obs)
        random = self._random_rows(rows, stepped)
        if random.all():
            return random_actions(self.action, self.policy.rng, k), self._random_record(k)
        acts, rec = self.policy.act_recording(obs)
        if random.any():
            self._act_randomly(acts, rec, random)
        return acts, rec

    def _recurrent_actions(self, rows, obs, k, stepped):
        """``_actions`` of a recurrent policy: the rows' state (zeroed where a frame starts an
        episode) goes into the model with their observations, and into the record with
        ``is_init`` and the model's ``next.<name>``. Rows acted by ``init_random_frames``' policy
        do not call the model: their ``next.<name>`` is the state they read."""
        step = self.recurrent.begin(rows, self.step_count if rows is None else self.step_count[rows])
        random = self._random_rows(rows, stepped) if self.init_random else None
        if random is not None and random.all():
            rec = self.recurrent.record(step, self._random_record(k), held=True)
            return random_actions(self.action, self.policy.rng, k), rec
        acts, rec = self.policy.act_recording(obs, step)
        if random is not None and random.any():
            self._act_randomly(acts, rec, random)
            return acts, self.recurrent.record(step, rec, held=random)
        return acts, self.recurrent.record(step, rec)

    def _random_rows(self, rows, stepped):
        """Which of ``rows`` (None: all) are still within their worker's ``init_random_frames``."""
        frames = self._worker_frames(self.frames + stepped)
        return (frames if rows is None else frames[rows]) < self.init_random

    def _act_randomly(self, acts, rec, random):
        """Replaces the policy's actions and records of the rows of ``random`` by the
        ``init_random_frames`` policy's."""
        n = int(random.sum())
        acts[random] = random_actions(self.action, self.policy.rng, n)
        for key, v in self._random_record(n).items():
            rec[key][random] = v

    def _random_record(self, k):
        """What ``k`` frames acted by the ``init_random_frames`` policy record under the main
        policy's keys: the uniform log-density and the fill values (``fill_recorded``)."""
        rec = fill_recorded(self.recorded, k)
        if "action_log_prob" in self.recorded:
            rec["action_log_prob"] = np.full(k, random_log_density(self.action), np.float32)
        return rec

    def _worker_frames(self, per_env):
        """Each row's worker's frames: the sum over the ``envs_per_worker`` envs it steps."""
        if self.K == 1:
            return per_env
        return np.repeat(per_env.reshape(-1, self.K).sum(axis=1), self.K)

    def _array(self, shape, dtype):
        """An array for a batch: a recycled one (every element is written), else a new one."""
        free = self._pool.get((shape, np.dtype(dtype).str))
        return free.pop() if free else np.zeros(shape, dtype)

    def recycle(self, batch):
        """Takes back the arrays of ``batch``, a batch of ``collect`` nobody reads any more
        (sent): later batches are written into them. Any thread may call it."""
        for a in batch.values():
            free = self._pool.setdefault((a.shape, a.dtype.str), [])
            if len(free) < 2:
                free.append(a)

    def _new_batch(self, T):
        """A batch of ``T`` frames per row to be written, ``{key: [E, T, ...]}``: the layout's
        keys, in arrays recycled where there are some."""
        E = self.E
        new = self._array
        b = {"observation" + leaf.suffix: new((E, T) + leaf.shape, leaf.np) for leaf in self.leaves}
        b["action"] = new((E, T) + self.action.shape, self.action.dtype)
        for leaf in self.leaves:
            b["next.observation" + leaf.suffix] = new((E, T) + leaf.shape, leaf.np)
        b.update({
            "next.reward": new((E, T, 1), np.float32),
            "next.done": new((E, T, 1), bool),
            "next.terminated": new((E, T, 1), bool),
            "next.truncated": new((E, T, 1), bool),
            "collector.traj_ids": new((E, T), np.int64),
            "step_count": new((E, T, 1), np.int64),
        })
        for key, (dtype, shape) in self.recording().items():
            b[key] = new((E, T, *shape), _RECORDED_DTYPES[dtype])
        return b

    def collect(self, frames, stop=None):
        """One batch of ``frames`` frames as a dict of numpy arrays ``[E, T, ...]``. ``stop``
        (a ``threading.Event``, set by another thread) is looked at before the first step and
        every ``STOP_CHECK_STEPS`` steps: once set, :class:`Stopped` is raised there."""
        E = self.E
        if frames == 0 or frames % E:
            raise NodeFailed(f"{frames} frames do not split evenly over {E} env workers")
        T = frames // E
        if self.reset_each:
            self.needs_reset[:] = True
            self.fresh[:] = False
        b = self._new_batch(T)
        pos = np.zeros(E, np.int64)
        self._salvaged = []
        t = self._collect_columns(b, T, stop)  # the fast path: every row at the same column
        pos[:] = t
        pos[self._salvaged] = t + 1
        if t < T:
            pos[self._failed] = 0
        steps = 0
        while (pos < T).any():  # after a failure: rows at different columns
            if stop is not None and steps % STOP_CHECK_STEPS == 0 and stop.is_set():
                raise Stopped()
            steps += 1
            rows = np.nonzero(pos < T)[0]
            results, acts, rec = [], None, None
            try:
                resets = [int(k) for k in rows if self.needs_reset[k]]
                if resets:
                    self._reset(resets)
                mask = np.zeros(E, bool)
                mask[rows] = True
                if (self.fresh & mask).any():
                    self._start_fresh(self.fresh & mask)
                acts, rec = self._actions(rows)
                # Each row's env on its own, without the vector env's autoreset: a row that ends
                # is reset at its next step (`_record` marks it), once, as in the fast loop.
                for i, k in enumerate(rows):
                    o, r, te, tr, _ = self.vec.envs[k].step(acts[i])
                    results.append((self._entries(o), r, te, tr))
            except _EnvFailed as f:
                # Rows stepped before the failing one keep this column; rows after it were
                # not stepped and step it again; the failed row starts over.
                for i, res in enumerate(results):  # the rows before the failing one, in order
                    k = rows[i]
                    self._record(b, int(k), int(pos[k]), acts[i], res, _row(rec, i))
                    pos[k] += 1
                self._restart(f.k, f.cause)
                pos[f.k] = 0
                continue
            for i, k in enumerate(rows):
                self._record(b, int(k), int(pos[k]), acts[i], results[i], _row(rec, i))
                pos[k] += 1
        for k in range(E):
            self.delivered_max_id[k] = max(self.delivered_max_id[k], int(b["collector.traj_ids"][k].max()))
            self.delivered_frames[k] += T
        return b

    def _collect_columns(self, b, T, stop=None):
        """Steps every row together, one column at a time, until the batch is full (returns
        ``T``) or an env fails (its row restarts; returns the column the others are at, after
        keeping the rows stepped before the failing one).

        The envs of the vector env are stepped here, one call each, with its same-step
        autoreset (an env that ends is reset at once, without a seed), and each result is
        written straight into the column: ``SyncVectorEnv.step`` would stack and copy the
        observations and build info dicts that a batch does not use. The loop names the env
        that raised (its index), so the supervision costs nothing until one does."""
        E = self.E
        single = self.single
        leaves = self.leaves
        nan = self.nan_is_failure
        max_traj = self.max_traj
        limit = self.time_limit
        envs = [e.env if isinstance(e, _Blame) else e for e in self.vec.envs]
        steps = [e.step for e in envs]
        resets = [e.reset for e in envs]
        rows = range(E)
        # Time-major scratch [T, E, ...]: a column is one contiguous write; into `b` once at the
        # end. Large entries (images) are written into `b` at once, through a [T, E] view.
        cols = {}
        for key, a in b.items():
            if key == "next.done":
                continue
            tail = () if key in _SCALAR_COLUMNS else a.shape[2:]
            if a[0, 0].nbytes >= _DIRECT_BYTES:
                cols[key] = a.swapaxes(0, 1)
            else:
                cols[key] = np.empty((T, E) + tail, a.dtype)
        c_obs = [cols["observation" + leaf.suffix] for leaf in leaves]
        c_next = [cols["next.observation" + leaf.suffix] for leaf in leaves]
        c_act = cols["action"]
        c_obs0, c_next0 = c_obs[0], c_next[0]
        c_rew, c_term, c_trunc = cols["next.reward"], cols["next.terminated"], cols["next.truncated"]
        c_ids, c_sc = cols["collector.traj_ids"], cols["step_count"]
        c_rec = [(key, cols[key]) for key in self.recording()]
        recurrent = self.recurrent
        t = 0
        t0 = 0
        need_reset = bool(self.needs_reset.any())
        need_ids = bool(self.fresh.any())
        try:
            while t < T:
                if stop is not None and t % STOP_CHECK_STEPS == 0 and stop.is_set():
                    raise Stopped()
                acts = ended = rec = None
                try:
                    if need_reset:
                        self._reset([int(k) for k in np.nonzero(self.needs_reset)[0]])
                        need_reset = False
                    if need_ids:
                        self._start_fresh(self.fresh)
                        need_ids = False
                    acts, rec = self._actions(None, t - t0)
                    cur = self.cur
                    if single:
                        c_obs0[t] = cur[0]
                        nx = c_next0[t]
                    else:
                        for c, x in zip(c_obs, cur):
                            c[t] = x
                        nxs = [c[t] for c in c_next]
                    rw, te_t, tr_t = c_rew[t], c_term[t], c_trunc[t]
                    # Rows whose step reaches the time limit (`step_count` is the steps before it).
                    at_limit = None if limit is None else self.step_count + 1 >= limit
                    for k in rows:
                        try:
                            o, r, te, tr, _ = steps[k](acts[k])
                        except Exception as e:
                            raise _EnvFailed(k, e) from e
                        if at_limit is not None and at_limit[k]:
                            tr = True
                        if single:
                            nx[k] = o
                        else:
                            for leaf, d in zip(leaves, nxs):
                                d[k] = leaf.get(o)
                        rw[k] = r
                        te_t[k] = te
                        tr_t[k] = tr
                        if te or tr:
                            try:
                                o, _ = resets[k]()
                            except Exception as e:
                                raise _EnvFailed(k, e) from e
                            if ended is None:
                                ended = []
                            ended.append((k, o))
                except _EnvFailed as f:
                    self.frames += t - t0
                    t0 = t
                    kept = [] if acts is None else [
                        ([c[t, j].copy() for c in c_next], c_rew[t, j], c_term[t, j], c_trunc[t, j]) for j in range(f.k)
                    ]
                    self._flush(b, cols, t)
                    return self._salvage(b, t, acts, f, kept, ended or [], rec)
                c_act[t] = acts
                for key, c in c_rec:
                    c[t] = rec[key]
                if recurrent is not None:
                    recurrent.advance(None, rec)
                # The next observation is the step's, or the new episode's first for an env that
                # ended (reset inside the step); `nx` keeps the step's (the final observation).
                if single:
                    cur[0][:] = nx
                else:
                    for x, n in zip(cur, nxs):
                        x[:] = n
                ended_rows = None
                if ended is not None:
                    ended_rows = np.zeros(E, bool)
                    for k, o in ended:
                        self._write(cur, k, o)
                        ended_rows[k] = True
                sc = self.step_count
                c_ids[t] = self.traj_id
                c_sc[t] = sc
                sc += 1
                t += 1
                cut = None  # rows cut by max_frames_per_traj, not ended by the env: reset next step
                if max_traj is not None:
                    over = (sc >= max_traj) & ~te_t
                    if over.any():
                        tr_t |= over
                        cut = over if ended_rows is None else over & ~ended_rows
                if ended_rows is not None or cut is not None:
                    self.needs_reset = cut if cut is not None else np.zeros(E, bool)
                    self.fresh = ended_rows if ended_rows is not None else np.zeros(E, bool)
                    need_reset = cut is not None and bool(cut.any())
                    need_ids = ended_rows is not None
                if nan:
                    bad = self._nan_rows(cur) if cut is None else self._nan_rows(cur) & ~cut
                    if bad.any():
                        raise NodeFailed(f"env worker {int(np.nonzero(bad)[0][0])} produced a NaN observation")
        finally:
            self.frames += t - t0
            self._flush(b, cols, t)
        return T

    @staticmethod
    def _flush(b, cols, t):
        """Writes columns ``0 .. t`` of the time-major scratch into ``b`` (once per call), with
        ``next.done`` as ``next.terminated | next.truncated``."""
        if t == 0 or not cols:
            cols.clear()
            return
        for k, c in cols.items():
            if c.base is b[k]:
                continue  # a view of the batch: written already
            dst = b[k][:, :t]
            dst[...] = c[:t].swapaxes(0, 1).reshape(dst.shape)
        done = b["next.done"][:, :t]
        np.logical_or(b["next.terminated"][:, :t], b["next.truncated"][:, :t], out=done)
        cols.clear()

    def _salvage(self, b, t, acts, f, kept, ended, rec=None):
        """Env ``f.k`` failed in column ``t``: rows stepped before it (``kept``: their results)
        keep the column, the failed row is rebuilt and starts over. Returns ``t``; the caller
        moves those rows on. Rows of ``ended`` (row, first observation) ended their episode
        in this column and were reset in the step: they go on with that episode."""
        for k, res in enumerate(kept):
            self._record(b, k, t, acts[k], res, _row(rec, k))
        self._started(ended)
        self._restart(f.k, f.cause)
        self._salvaged, self._failed = list(range(len(kept))), f.k
        return t

    def _started(self, ended):
        """The envs of ``ended`` (row, first observation) were reset by their step: each row goes
        on with that episode, whose trajectory id is handed out at its first step."""
        for k, o in ended:
            self._write(self.cur, k, o)
            self.needs_reset[k] = False
            self.fresh[k] = True
            if self.nan_is_failure and self._has_nan([c[k] for c in self.cur]):
                raise NodeFailed(f"env worker {k} produced a NaN observation")

    def _record(self, b, k, t, action, result, rec=None):
        nxt, r, te, tr = result
        for key, v in (rec or {}).items():
            b[key][k, t] = v
        for leaf, c, n in zip(self.leaves, self.cur, nxt):
            b["observation" + leaf.suffix][k, t] = c[k]
            b["next.observation" + leaf.suffix][k, t] = n
        b["action"][k, t] = action
        if self.recurrent is not None:
            self.recurrent.advance(k, rec)
        sc = int(self.step_count[k])
        te = bool(te)
        cut = self.max_traj is not None and sc + 1 >= self.max_traj and not te
        timed_out = self.time_limit is not None and sc + 1 >= self.time_limit
        trunc = bool(tr) or cut or timed_out
        end = te or trunc
        b["next.reward"][k, t, 0] = np.float32(r)
        b["next.terminated"][k, t, 0] = te
        b["next.truncated"][k, t, 0] = trunc
        b["next.done"][k, t, 0] = end
        b["collector.traj_ids"][k, t] = self.traj_id[k]
        b["step_count"][k, t, 0] = sc
        self.step_count[k] = sc + 1
        self.needs_reset[k] = end
        for c, n in zip(self.cur, nxt):
            c[k] = n
        self.frames[k] += 1
        if self.nan_is_failure and not end and self._has_nan(nxt):
            raise NodeFailed(f"env worker {k} produced a NaN observation")

    def _restart(self, k, cause):
        """Rebuilds env ``k`` after ``cause`` (the Rust node's supervision), or fails the node."""
        now = time.monotonic()
        recent = [t for t in self.restarts[k] if now - t < self.window]
        if len(recent) >= self.max_restarts:
            raise NodeFailed(
                f"env worker {k} failed after {self.restart_count[k]} restarts: "
                f"{len(recent) + 1} failures within {int(self.window * 1000)} ms, last: {cause!r}"
            )
        recent.append(now)
        self.restarts[k] = recent
        self.restart_count[k] += 1
        seed = restart_seed((self.base_seed + k) & _MASK64, self.restart_count[k])
        try:
            old = self.vec.envs[k]
            try:
                old.close()
            except Exception:
                pass
            self.vec.envs[k] = self._factory(k)()
        except Exception as e:
            raise NodeFailed(f"env worker {k} cannot be rebuilt: {e!r}") from None
        self.pending_seed[k] = seed
        self.needs_reset[k] = True
        self.fresh[k] = False
        floor = int(self.delivered_max_id[k]) + 1
        while self.next_id[k] < floor:
            self.next_id[k] += self.lanes
        self.frames[k] = self.delivered_frames[k]

    def close(self):
        """Closes the envs."""
        try:
            self.vec.close()
        except Exception:
            pass


def _row(rec, i):
    """Row ``i`` of what the policy recorded for a set of rows (None: nothing)."""
    return None if rec is None else {key: v[i] for key, v in rec.items()}


def _rng_state(gen):
    """A numpy PCG64 generator's state in the form of PROTOCOL.md's ``RngState``: 128-bit
    state then increment as the 32 ``seed`` bytes, the buffered 32-bit half in ``stream`` and
    ``word_pos_lo`` (only a Python node reads it back: PROTOCOL.md §9)."""
    st = gen.bit_generator.state
    if st.get("bit_generator") != "PCG64":
        raise CheckpointError(f"a {st.get('bit_generator')} generator cannot be checkpointed (PCG64 only)")
    s = st["state"]
    seed = s["state"].to_bytes(16, "little") + s["inc"].to_bytes(16, "little")
    return {"seed": seed, "stream": int(st["has_uint32"]), "word_pos_hi": 0, "word_pos_lo": int(st["uinteger"])}


def _set_rng_state(gen, r):
    try:
        seed = r["seed"]
        if not isinstance(seed, bytes) or len(seed) != 32:
            raise ValueError("seed must be 32 bytes")
        gen.bit_generator.state = {
            "bit_generator": "PCG64",
            "state": {"state": int.from_bytes(seed[:16], "little"), "inc": int.from_bytes(seed[16:], "little")},
            "has_uint32": int(r["stream"]),
            "uinteger": int(r["word_pos_lo"]),
        }
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"a generator state this node did not write: {e}") from None


def _make(name, config):
    """``gym.make(name, **config)`` without the wrappers that keep state in private
    attributes (``TimeLimit``, ``OrderEnforcing``, the env checker): the node counts an
    episode's steps itself (``step_count``) and truncates at :func:`time_limit`, so a
    checkpoint reads and restores nothing of gymnasium's internals."""
    kwargs = {k: v for k, v in config.items() if k != "max_episode_steps"}
    spec = dataclasses.replace(gym.spec(name), max_episode_steps=None, order_enforce=False)
    return gym.make(spec, disable_env_checker=True, **kwargs)


def time_limit(name, config):
    """The steps after which an episode is truncated: ``max_episode_steps`` of the config,
    else of the env's registration (what ``gym.make``'s ``TimeLimit`` would apply); None
    for no limit."""
    limit = config.get("max_episode_steps", gym.spec(name).max_episode_steps)
    return None if limit is None else int(limit)


def _env_snapshot(env, elapsed):
    """``EnvSnapshot`` of a gymnasium env whose whole state is ``unwrapped.state`` and its
    ``np_random`` (the classic-control envs), ``elapsed`` steps into its episode (the node's
    own count: the env has no ``TimeLimit``, see :func:`_make`); CheckpointError for any
    other."""
    u = env.unwrapped
    state = getattr(u, "state", None)
    try:
        values = [float(v) for v in np.asarray(state, np.float64).reshape(-1)]
    except (TypeError, ValueError):
        values = None
    if state is None or values is None:
        raise CheckpointError(
            f"env `{u.spec.id if u.spec else type(u).__name__}` keeps no `state` array this node can save "
            "(the Python node checkpoints envs whose whole state is `unwrapped.state`, as classic control's)"
        )
    beyond = getattr(u, "steps_beyond_terminated", None)
    return {"state": values, "elapsed_steps": elapsed, "needs_reset": beyond is not None, "rng": _rng_state(u.np_random)}


def _env_restore(env, snap):
    u = env.unwrapped
    if not hasattr(u, "state"):
        # Some envs (Pendulum) make `state` at their first reset, which a node restored
        # before its first batch has not done: reset it (everything is overwritten below).
        try:
            env.reset()
        except Exception as e:
            raise CheckpointError(f"the env cannot be reset to restore it: {e!r}") from None
    if not hasattr(u, "state"):
        raise CheckpointError("this env keeps no `state` array")
    try:
        values = np.asarray(snap["state"], np.float64)
        int(snap["elapsed_steps"])  # the node's step_count, restored with the episode
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"an env state this node did not write: {e}") from None
    if snap.get("rng") is None:
        raise CheckpointError("an env state without a generator (not a Python node's)")
    _set_rng_state(u.np_random, snap["rng"])
    u.state = values
    if hasattr(u, "steps_beyond_terminated"):
        u.steps_beyond_terminated = 0 if snap.get("needs_reset") else None


def snapshot(workers):
    """The ``workers`` entries of a ``NodeState`` (PROTOCOL.md §§3, 9): every worker's env,
    episode and ids, the policy's generator and a recurrent policy's state of its envs
    (``RolloutState.recurrent``, §8); CheckpointError when an env cannot."""
    w = workers
    w.refuse_checkpoint()
    if w.fresh.any():
        w._start_fresh(w.fresh)  # the id the next step would hand out, handed out now
    if not w.single:
        raise CheckpointError("an env of dict observations cannot be checkpointed by the Python node")
    sampler = {"rng": _rng_state(w.policy.rng), "spare": None}
    out = []
    for g in range(w.E // w.K):
        rows = range(g * w.K, (g + 1) * w.K)
        envs = [{
            "name": w.env_name, "env": _env_snapshot(w.vec.envs[k], int(w.step_count[k])),
            "obs": [float(v) for v in w.cur[0][k].reshape(-1)], "traj_id": int(w.traj_id[k]),
            "step_count": int(w.step_count[k]), "needs_reset": bool(w.needs_reset[k]),
            "pending_seed": w.pending_seed[k], "ids": {"next": int(w.next_id[k]), "stride": int(w.lanes)},
        } for k in rows]
        rollout = {"frames": int(sum(w.frames[k] for k in rows)), "envs": envs, "policy": sampler,
                   "random": sampler if w.init_random else None}
        if w.recurrent is not None:
            rollout["recurrent"] = w.recurrent.to_wire(slice(rows.start, rows.stop))
        out.append({
            "rollout": rollout,
            "next_traj_id": int(max(w.delivered_max_id[k] for k in rows) + 1),
            "frames": int(sum(w.delivered_frames[k] for k in rows)),
        })
    return out


def restore(workers, state):
    """Goes on from a ``NodeState`` a Python node of the same spec wrote (checked first:
    nothing changes when it does not fit)."""
    w = workers
    w.refuse_checkpoint()
    ws = state.get("workers")
    if not isinstance(ws, list) or len(ws) != w.E // w.K:
        raise CheckpointError(f"the state has {len(ws) if isinstance(ws, list) else 'no'} workers, this node {w.E // w.K}")
    envs = []
    for k in range(w.E):
        g, entry = k // w.K, ws[k // w.K]
        try:
            r = entry["rollout"]
            if len(r["envs"]) != w.K:
                raise CheckpointError(f"worker {g} has {len(r['envs'])} envs in the state, {w.K} here")
            e = r["envs"][k % w.K]
            if e["name"] != w.env_name:
                raise CheckpointError(f"worker {k}'s env is `{e['name']}` in the state, `{w.env_name}` here")
            if int(e["ids"]["stride"]) != w.lanes or int(e["ids"]["next"]) % w.lanes != (w.first_lane + k) % w.lanes:
                raise CheckpointError(f"worker {k}'s trajectory ids are of another lane")
            if not w.single or len(e["obs"]) != w.cur[0][k].size:
                raise CheckpointError(f"worker {k}'s observation has {len(e['obs'])} values, expected {w.cur[0][k].size}")
            envs.append((r, e, entry))
        except (KeyError, TypeError, ValueError) as ex:
            raise CheckpointError(f"worker {k}'s state is not of this form: {ex!r}") from None
    sampler = envs[0][0].get("policy")
    if not isinstance(sampler, dict):
        raise CheckpointError("the state has no policy generator (not a Python node's)")
    recurrent = _recurrent_from(w, ws)
    for k, (_, e, _) in enumerate(envs):
        _env_restore(w.vec.envs[k], e["env"])
    _set_rng_state(w.policy.rng, sampler["rng"])
    leaf = w.leaves[0]
    w.cur = [np.array([e["obs"] for _, e, _ in envs], np.float64).astype(leaf.np).reshape((w.E,) + leaf.shape)]
    w.traj_id = np.array([e["traj_id"] for _, e, _ in envs], np.int64)
    w.step_count = np.array([e["step_count"] for _, e, _ in envs], np.int64)
    w.needs_reset = np.array([bool(e["needs_reset"]) for _, e, _ in envs], bool)
    w.fresh = np.zeros(w.E, bool)
    w.pending_seed = [e["pending_seed"] for _, e, _ in envs]
    w.next_id = np.array([e["ids"]["next"] for _, e, _ in envs], np.int64)
    # A worker's counts are its envs' together; its envs step together, so each holds a
    # K-th of them, and every env's restart floor is past the worker's highest id.
    w.frames = np.array([int(r["frames"]) // w.K for r, _, _ in envs], np.int64)
    w.delivered_max_id = np.array([int(x["next_traj_id"]) - 1 for _, _, x in envs], np.int64)
    w.delivered_frames = np.array([int(x["frames"]) // w.K for _, _, x in envs], np.int64)
    for g, arrays in enumerate(recurrent):
        w.recurrent.put(slice(g * w.K, (g + 1) * w.K), arrays)
    base = state.get("base_seed")
    if isinstance(base, int):
        w.base_seed = base


def _recurrent_from(w, ws):
    """Each worker's recurrent state in ``ws`` (a ``NodeState``'s ``workers``), checked against
    ``w``'s policy: ``[]`` for a policy without state (CheckpointError when the state holds
    one, or when a recurrent policy's is missing or does not fit)."""
    if w.recurrent is None:
        if any(entry["rollout"].get("recurrent") is not None for entry in ws):
            raise CheckpointError("the state holds a recurrent policy's state, this node's policy keeps none")
        return []
    try:
        return [w.recurrent.from_wire(entry["rollout"].get("recurrent"), w.K, g) for g, entry in enumerate(ws)]
    except ValueError as e:
        raise CheckpointError(str(e)) from None
