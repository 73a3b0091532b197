"""EnvPool as the node's env backend (issue 43): an env id ``envpool:<task>`` (``envpool:Pong-v5``,
``envpool:HalfCheetah-v5``; any of ``envpool.list_all_envs()``) is EnvPool's own env, not
gymnasium's (its ``Pong-v5`` is 84x84 gray frames stacked 4), and ``spec.env.config`` holds
``envpool.make``'s keyword arguments.

Each worker of ``envs_per_worker = K`` envs is one EnvPool instance of ``num_envs = K``,
``batch_size = K`` (sync stepping), stepped with one ``step`` call of all its envs per column.
Env ``k`` of the node is env ``k % K`` of worker ``k // K``'s pool, seeded ``(seed + k) mod 2^31``
(EnvPool takes int32 seeds, one per env: ``seed=[...]``), the Python node's seed chain.

Episode ends follow the node's same-step autoreset: EnvPool's own autoreset step (the call
after an env is done, whose action is ignored and which returns the first observation with
reward 0) is never recorded; the node resets the envs that ended at once (``reset(env_id)``,
no seed: the env's generator goes on, as the autoreset's does) and their next frame starts
the new episode. EnvPool truncates at its own ``max_episode_steps``.

EnvPool cannot reseed one env in place: a ``seed`` frame, or a worker restart, builds the
worker's pool again with the new seeds. An EnvPool call that raises restarts its whole
worker (the K envs share the pool): each env reseeded with its restart seed, the worker's
rows collected again from the start of the batch. EnvPool keeps its envs' state out of
reach, so ``snapshot`` and ``restore`` answer ``checkpoint_failed``.
"""

import time

import numpy as np

from .collect import (
    _MASK64,
    STOP_CHECK_STEPS,
    BuildError,
    CheckpointError,
    NodeFailed,
    Stopped,
    Workers,
    _EnvFailed,
    restart_seed,
)

#: The env id prefix that names this backend: ``envpool:Pong-v5``.
PREFIX = "envpool:"
#: ``envpool.make`` arguments the node sets itself, and from what.
_OWN = {
    "num_envs": "envs_per_worker",
    "batch_size": "envs_per_worker (sync stepping)",
    "seed": "rollout.seed and the trainer's seed chain",
    "env_seed": "rollout.seed and the trainer's seed chain",
    "env_type": "the node, which steps EnvPool's gymnasium API",
}
#: EnvPool's seeds are int32: the node's u64 seeds are taken modulo this.
SEED_MODULUS = 1 << 31


def is_envpool(name):
    """Whether env id ``name`` names an EnvPool env (``envpool:<task>``)."""
    return isinstance(name, str) and name.startswith(PREFIX)


def make_workers(spec, double_to_float=False, allow_pickled_env=False):
    """The node's workers for ``spec``: EnvPool's for an ``envpool:`` id, PettingZoo's for a
    ``pettingzoo:`` id (``pettingzoo_backend``), gymnasium's otherwise (a pickled torchrl
    env's too, if ``allow_pickled_env``)."""
    env = spec.get("env") if isinstance(spec, dict) else None
    name = env.get("name") if isinstance(env, dict) else None
    if is_envpool(name):
        return EnvPoolWorkers(spec, double_to_float)
    if isinstance(name, str) and name.startswith("pettingzoo:"):
        from .pettingzoo_backend import PettingZooWorkers  # pettingzoo imported only for these ids

        return PettingZooWorkers(spec, double_to_float)
    return Workers(spec, double_to_float, allow_pickled_env)


def envpool_seed(seed):
    """The int32 seed EnvPool gets for the node's seed ``seed`` of one env."""
    return int(seed) % SEED_MODULUS


def _envpool(name):
    try:
        import envpool
    except ImportError as e:
        raise BuildError(f"env `{name}` is an EnvPool env: install envpool (pip install envpool): {e}") from None
    return envpool


def check_config(name, config):
    """``config`` as ``envpool.make`` keyword arguments, or BuildError naming the field the node
    sets itself."""
    if not isinstance(config, dict):
        raise BuildError(f"spec.env.config of `{name}` must be a map of envpool.make arguments")
    for key in config:
        if key in _OWN:
            raise BuildError(f"spec.env.config.{key} cannot be given for `{name}`: the node sets it from {_OWN[key]}")
    return dict(config)


def make_pool(name, config, seeds):
    """One EnvPool of ``len(seeds)`` envs of ``envpool:<task>`` ``name``, stepped in sync, env
    ``j`` seeded ``envpool_seed(seeds[j])``; BuildError when EnvPool refuses."""
    envpool = _envpool(name)
    task = name[len(PREFIX):]
    if task not in envpool.list_all_envs():
        raise BuildError(f"env `{name}`: EnvPool has no task `{task}` (envpool.list_all_envs() lists them)")
    n = len(seeds)
    try:
        return envpool.make(task, env_type="gymnasium", num_envs=n, batch_size=n,
                            seed=[envpool_seed(s) for s in seeds], **check_config(name, config))
    except BuildError:
        raise
    except Exception as e:  # EnvPool checks its arguments with asserts and its own errors
        raise BuildError(f"cannot make env `{name}` with config {config}: {type(e).__name__}: {e}") from None


class EnvPoolEnv:
    """One env of EnvPool with gymnasium's ``reset(seed=)``/``step`` (a pool of one): what a
    replay by seed steps. ``reset(seed=s)`` builds the pool seeded ``s``; ``reset()`` resets
    it without a seed, as the node does after an episode ends."""

    def __init__(self, name, config=None):
        self.name, self.config, self.pool = name, dict(config or {}), None
        self._ids = np.zeros(1, np.int32)

    def reset(self, seed=None):
        """The first observation of a new episode and its info (EnvPool's, unbatched)."""
        if seed is not None or self.pool is None:
            self.pool = make_pool(self.name, self.config, [0 if seed is None else seed])
            obs, info = self.pool.reset()
        else:
            obs, info = self.pool.reset(self._ids)
        return _unbatch(obs), info

    def step(self, action):
        """``(obs, reward, terminated, truncated, info)`` of one step."""
        obs, r, te, tr, info = self.pool.step(np.asarray(action)[None], self._ids)
        return _unbatch(obs), float(r[0]), bool(te[0]), bool(tr[0]), info

    def close(self):
        """Drops the pool."""
        self.pool = None


def _unbatch(obs):
    if isinstance(obs, dict):
        return {k: _unbatch(v) for k, v in obs.items()}
    return obs[0]


class EnvPoolWorkers(Workers):
    """:class:`Workers` whose envs are EnvPool's: one pool per worker (see the module's doc)."""

    def _build_envs(self, config):
        self.config = check_config(self.env_name, config)
        #: EnvPool truncates at its own ``max_episode_steps``: the node adds no limit.
        self.time_limit = None
        self.W = self.E // self.K
        self._ids = np.arange(self.K, dtype=np.int32)
        seeds = [[(self.seed + k) & _MASK64 for k in self._rows(g)] for g in range(self.W)]
        self.pools = [make_pool(self.env_name, self.config, s) for s in seeds]
        #: The seeds each pool was built with while it has not been reset yet (None after):
        #: a first reset with those seeds needs no new pool.
        self._built = seeds

    def _rows(self, g):
        return range(g * self.K, (g + 1) * self.K)

    def _spaces(self):
        p = self.pools[0]
        return p.observation_space, p.action_space

    def refuse_checkpoint(self):
        raise CheckpointError(
            f"env `{self.env_name}` runs in EnvPool, which keeps its envs' state out of reach: "
            "the envpool backend cannot snapshot or restore"
        )

    def _leaf_rows(self, obs):
        """EnvPool's batched observation as one array per batch entry, ``[n, ...]``."""
        return [leaf.get(obs) for leaf in self.leaves]

    def _reset(self, rows):
        """Starts a new episode in every env of ``rows``: a worker whose envs all have a
        pending seed is built again with those seeds (or its new pool reset, if it was built
        with them), the others are reset without a seed."""
        K = self.K
        rows = sorted(int(k) for k in rows)
        for g in sorted({k // K for k in rows}):
            ks = [k for k in rows if k // K == g]
            seeds = [self.pending_seed[k] for k in ks]
            try:
                if any(s is not None for s in seeds):
                    if len(ks) != K or any(s is None for s in seeds):
                        raise NodeFailed(f"env worker {g}: a seed for some of its EnvPool's envs only")
                    if self._built[g] != seeds:
                        self.pools[g] = make_pool(self.env_name, self.config, seeds)
                    obs, _ = self.pools[g].reset()
                else:
                    obs, _ = self.pools[g].reset(np.array([k - g * K for k in ks], np.int32))
            except (NodeFailed, BuildError):
                raise
            except Exception as e:
                raise _EnvFailed(ks[0], e) from e
            self._built[g] = None
            idx = np.array(ks)
            for c, v in zip(self.cur, self._leaf_rows(obs)):
                c[idx] = v
            if self.nan_is_failure and self._has_nan([c[idx] for c in self.cur]):
                raise _EnvFailed(ks[0], ValueError(f"env worker {g} produced a NaN observation"))
            for k in ks:
                self.pending_seed[k] = None
            self.traj_id[idx] = self.next_id[idx]
            self.next_id[idx] += self.lanes
            self.step_count[idx] = 0
            self.needs_reset[idx] = False
            self.fresh[idx] = False

    def collect(self, frames, stop=None):
        """One batch of ``frames`` frames, ``[E, T, ...]``: each worker's pool stepped once per
        column with one policy call for every row still collecting (see the module's doc);
        ``stop`` as :meth:`Workers.collect`'s."""
        E, K, W = self.E, self.K, self.W
        if frames == 0 or frames % E:
            raise NodeFailed(f"{frames} frames do not split evenly over {E} env workers")
        T = frames // E
        if self.reset_each:
            self.needs_reset[:] = True
            self.fresh[:] = False
        b = self._new_batch(T)
        pos = np.zeros(W, np.int64)  # each worker's next column: a restarted one starts over
        steps = 0
        while True:
            active = [g for g in range(W) if pos[g] < T]
            if not active:
                break
            if stop is not None and steps % STOP_CHECK_STEPS == 0 and stop.is_set():
                raise Stopped()
            steps += 1
            if len(active) == W:
                rows, mask = None, None
            else:
                rows = np.concatenate([np.arange(g * K, (g + 1) * K) for g in active])
                mask = np.zeros(E, bool)
                mask[rows] = True
            try:
                reset = self.needs_reset if mask is None else self.needs_reset & mask
                if reset.any():
                    self._reset(np.nonzero(reset)[0])
                fresh = self.fresh if mask is None else self.fresh & mask
                if fresh.any():
                    self._start_fresh(fresh)
                acts, rec = self._actions(rows)
            except _EnvFailed as f:
                self._restart(f.k, f.cause)
                pos[f.k // K] = 0
                continue
            # Every pool steps (in EnvPool's threads) while this thread writes what the column
            # holds before the step; then each pool's results are read and written.
            sent = []
            for i, g in enumerate(active):
                if len(active) > 1:
                    part = slice(i * K, (i + 1) * K)
                    acts_g, rec_g = acts[part], None if rec is None else {k: v[part] for k, v in rec.items()}
                else:
                    acts_g, rec_g = acts, rec
                try:
                    self.pools[g].send(acts_g, self._ids)
                except Exception as e:
                    self._restart(g * K, e)
                    pos[g] = 0
                    continue
                sent.append((g, acts_g, rec_g))
            for g, acts_g, rec_g in sent:
                self._write_before(b, g, int(pos[g]), acts_g, rec_g)
            for g, _, _ in sent:
                try:
                    self._write_after(b, g, int(pos[g]))
                except _EnvFailed as f:
                    self._restart(f.k, f.cause)
                    pos[g] = 0
                    continue
                pos[g] += 1
        np.logical_or(b["next.terminated"], b["next.truncated"], out=b["next.done"])
        for k in range(E):
            self.delivered_max_id[k] = max(self.delivered_max_id[k], int(b["collector.traj_ids"][k].max()))
            self.delivered_frames[k] += T
        if not self.init_random:  # counted frame by frame only when init_random_frames reads them
            self.frames[:] = self.delivered_frames
        return b

    def _write_before(self, b, g, t, acts, rec):
        """Writes worker ``g``'s rows of column ``t`` that its step does not change: the
        observation, the action and what the policy recorded, the ids and step counts."""
        sl = slice(g * self.K, (g + 1) * self.K)
        for leaf, c in zip(self.leaves, self.cur):
            b["observation" + leaf.suffix][sl, t] = c[sl]
        b["action"][sl, t] = acts
        if rec is not None:
            for key, v in rec.items():
                b[key][sl, t] = v
            if self.recurrent is not None:
                self.recurrent.advance(sl, rec)
        b["collector.traj_ids"][sl, t] = self.traj_id[sl]
        b["step_count"][sl, t, 0] = self.step_count[sl]

    def _write_after(self, b, g, t):
        """Reads worker ``g``'s step (sent) and writes the rest of its rows of column ``t``; the
        envs that ended are reset at once (their next frame starts the new episode)."""
        K = self.K
        sl = slice(g * K, (g + 1) * K)
        try:
            obs, r, te, tr, _ = self.pools[g].recv(reset=False, return_info=True)
        except Exception as e:
            raise _EnvFailed(g * K, e) from e
        nxt = self._leaf_rows(obs)
        for leaf, c, n in zip(self.leaves, self.cur, nxt):
            b["next.observation" + leaf.suffix][sl, t] = n
            c[sl] = n
        sc = self.step_count[sl]
        trunc = tr
        if self.max_traj is not None:
            trunc = tr | ((sc + 1 >= self.max_traj) & ~te)
        end = te | trunc
        b["next.reward"][sl, t, 0] = r
        b["next.terminated"][sl, t, 0] = te
        b["next.truncated"][sl, t, 0] = trunc  # `next.done` is written once per batch
        sc += 1
        if self.init_random:
            self.frames[sl] += 1
        if self.nan_is_failure:
            bad = self._nan_rows_of(nxt) & ~end
            if bad.any():
                raise NodeFailed(f"env worker {g * K + int(np.nonzero(bad)[0][0])} produced a NaN observation")
        if end.any():
            ended = np.nonzero(end)[0].astype(np.int32)
            try:
                first, _ = self.pools[g].reset(ended)
            except Exception as e:
                raise _EnvFailed(g * K, e) from e
            idx = ended + g * K
            for c, v in zip(self.cur, self._leaf_rows(first)):
                c[idx] = v
            if self.nan_is_failure and self._has_nan([c[idx] for c in self.cur]):
                raise NodeFailed(f"env worker {int(idx[0])} produced a NaN observation")
            self.fresh[idx] = True  # its trajectory id is handed out at its first step

    def _nan_rows_of(self, arrays):
        """Rows of ``arrays`` (one per entry, ``[K, ...]``) with a NaN in a float entry."""
        bad = np.zeros(self.K, bool)
        for i in self._floats:
            bad |= np.isnan(arrays[i].reshape(self.K, -1)).any(axis=1)
        return bad

    def _restart(self, k, cause):
        """Rebuilds the pool of env ``k``'s worker after ``cause``, each of its envs reseeded
        with its restart seed and its ids moved past those delivered, or fails the node past
        the restart budget (counted per worker)."""
        K = self.K
        g = k // K
        now = time.monotonic()
        recent = [t for t in self.restarts[g * K] if now - t < self.window]
        if len(recent) >= self.max_restarts:
            raise NodeFailed(
                f"env worker {g} (EnvPool) failed after {self.restart_count[g * K]} restarts: "
                f"{len(recent) + 1} failures within {int(self.window * 1000)} ms, last: {cause!r}"
            )
        recent.append(now)
        self.restarts[g * K] = recent
        seeds = []
        for j in self._rows(g):
            self.restart_count[j] += 1
            seeds.append(restart_seed((self.base_seed + j) & _MASK64, self.restart_count[j]))
        try:
            self.pools[g] = make_pool(self.env_name, self.config, seeds)
        except BuildError as e:
            raise NodeFailed(f"env worker {g} (EnvPool) cannot be rebuilt: {e}") from None
        self._built[g] = seeds
        for j, s in zip(self._rows(g), seeds):
            self.pending_seed[j] = s
            self.needs_reset[j] = True
            self.fresh[j] = False
            floor = int(self.delivered_max_id[j]) + 1
            while self.next_id[j] < floor:
                self.next_id[j] += self.lanes
            self.frames[j] = self.delivered_frames[j]

    def close(self):
        """Drops the pools (EnvPool stops their threads)."""
        self.pools = []
