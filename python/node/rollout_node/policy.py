"""The policies of ``spec.policy`` (PROTOCOL.md §8), evaluated on a whole batch of
observations with numpy.

The forward pass is float32 throughout and sums in the same order as the Rust node
(``z_j = b_j + w_j0 x_0 + w_j1 x_1 + ...``, each product and sum rounded to f32, no fused
multiply-add), so that in deterministic mode both implementations pick the same action for
the same observation and weights. Sampling (random exploration) uses numpy's generator:
it is random in the same way, not the same random numbers as the Rust node's ChaCha8.
"""

import numpy as np

_f32 = np.float32
# rollout's tanh (docs/policies.md, "tanh"): the constants and the order of operations the
# Rust node uses (src/policy/tanh.rs), so that both get the same bits.
_CLAMP, _SMALL = _f32(10.0), _f32(0.625)
_LOG2E, _LN2_HI, _LN2_LO = _f32(1.442695), _f32(0.693359375), _f32(-2.1219444e-04)
_EXP = [_f32(v) for v in (1.0, 1.0, 4.999999e-01, 1.6666421e-01, 4.166836e-02, 8.374775e-03, 1.3829424e-03)]
_ODD = [_f32(v) for v in (-3.333333e-01, 1.3333206e-01, -5.3946704e-02, 2.1700492e-02, -8.177074e-03, 2.142785e-03)]


def _horner(c, z):
    """``c[0] + z (c[1] + z (c[2] + ...))``, innermost first, each product and sum rounded."""
    p = np.full_like(z, c[-1])
    for v in c[-2::-1]:
        p = p * z + v
    return p


def tanh32(x):
    """f32 tanh as every rollout node computes it: a fixed sequence of float32 operations
    (numpy's are IEEE and unfused, element by element), whole arrays at once."""
    x = np.asarray(x, np.float32)
    a = np.abs(x)
    a = np.where(a > _CLAMP, _CLAMP, a)
    u = a * a
    small = a + (a * u) * _horner(_ODD, u)
    y = a + a
    with np.errstate(invalid="ignore"):  # NaN: any n, the result is NaN through r
        n = (y * _LOG2E + _f32(0.5)).astype(np.int32)
    nf = n.astype(np.float32)
    r = (y - nf * _LN2_HI) - nf * _LN2_LO
    two_n = ((n + np.int32(127)) << np.int32(23)).view(np.float32)
    e = _horner(_EXP, r) * two_n
    large = _f32(1.0) - _f32(2.0) / (e + _f32(1.0))
    return np.copysign(np.where(a < _SMALL, small, large), x).astype(np.float32)


#: Std of the exploration noise as a fraction of the half-range of the action box.
NOISE_FRACTION = np.float32(0.1)


_WIRE = {"float32": "f32", "float64": "f64", "int64": "i64", "bool": "bool", "uint8": "u8"}


class PolicyError(Exception):
    """A policy that cannot be built or weights it cannot use."""


class ActionSpace:
    """What the policy must produce, by ``kind``: ``discrete`` (``n`` choices from ``start``;
    policies choose an index, the env gets ``start + index``), ``box`` (``low``/``high`` as
    flat float32, ``shape``), ``multi_discrete`` (element ``i`` in ``0..nvec[i]``) or
    ``multi_binary`` (``n`` zeros and ones)."""

    def __init__(self, n=None, low=None, high=None, start=0, shape=None, kind=None, nvec=None):
        self.kind = kind or ("discrete" if n is not None else "box")
        self.n, self.start = n, int(start)
        self.low = None if low is None else np.asarray(low, np.float32).reshape(-1)
        self.high = None if high is None else np.asarray(high, np.float32).reshape(-1)
        self.nvec = None if nvec is None else np.asarray(nvec, np.int64).reshape(-1)
        if self.kind == "box":
            self.shape = tuple(shape) if shape is not None else (self.low.size,)
        elif self.kind == "discrete":
            self.shape = ()
        elif self.kind == "multi_discrete":
            self.shape = (self.nvec.size,)
        else:
            self.shape = (int(n),)
        #: The dtype of the batch's ``action`` entry.
        self.dtype = np.dtype(np.float32 if self.kind == "box" else np.uint8 if self.kind == "multi_binary" else np.int64)

    @classmethod
    def of(cls, space):
        """The action space of a gymnasium space ``spaces.specs`` accepted."""
        import gymnasium as gym

        if isinstance(space, gym.spaces.Discrete):
            return cls(n=int(space.n), start=int(space.start))
        if isinstance(space, gym.spaces.Box):
            return cls(low=space.low, high=space.high, shape=space.shape)
        if isinstance(space, gym.spaces.MultiDiscrete):
            return cls(kind="multi_discrete", nvec=space.nvec)
        return cls(kind="multi_binary", n=int(space.shape[0]))

    @property
    def discrete(self):
        """Whether actions are one choice each."""
        return self.kind == "discrete"

    @property
    def dim(self):
        """Raw outputs of a network: ``n`` logits, or one per action element."""
        return self.n if self.discrete else self.low.size

    def value(self, index):
        """The env's values of the policy's choices ``index`` (``start + index``)."""
        return index + self.start if self.start else index


def _rows_dense(w, b, x):
    """``x @ w.T + b`` for every row of ``x``, summed as the Rust node sums (see module doc)."""
    z = np.repeat(b[None, :], x.shape[0], axis=0)
    for i in range(w.shape[1]):
        z += x[:, i : i + 1] * w[None, :, i]
    return z


class Policy:
    """A built-in policy: ``kind`` random, linear, mlp or constant."""

    def __init__(self, spec, obs_dim, action, seed):
        config = spec.get("config") or {}
        if not isinstance(config, dict):
            raise PolicyError("policy.config is not a map")
        self.kind = config.get("kind")
        self.exploration = spec.get("exploration") or "random"
        if self.exploration not in ("random", "deterministic"):
            raise PolicyError(f"unknown exploration {self.exploration!r}")
        self.action = action
        self.obs_dim = obs_dim
        self.rng = np.random.default_rng(seed)
        if self.kind == "linear":
            hidden = []
            self.names = lambda i: ("weight", "bias")
        elif self.kind == "mlp":
            hidden = config.get("hidden")
            if not isinstance(hidden, list) or not all(isinstance(h, int) and h > 0 for h in hidden):
                raise PolicyError("mlp: `hidden` must be an array of widths >= 1")
            self.names = lambda i: (f"layers.{i}.weight", f"layers.{i}.bias")
        elif self.kind == "constant":
            self.layout = {"value": (1,)}
            self.weights = None  # version 0 comes from the trainer, as for every policy with weights
            self.version = None
            return
        elif self.kind == "random":
            self.layout = {}
            self.weights = {}
            self.version = 0
            return
        else:
            raise PolicyError(f"unknown policy kind {self.kind!r}")
        dims = [obs_dim, *hidden, action.dim]
        self.layers = [self.names(i) for i in range(len(dims) - 1)]
        self.layout = {}
        for i, (wn, bn) in enumerate(self.layers):
            self.layout[wn] = (dims[i + 1], dims[i])
            self.layout[bn] = (dims[i + 1],)
        self.weights = None  # a network needs the trainer's weights: it never invents them
        self.version = None
        if not action.discrete:
            low, high = action.low, action.high
            finite = np.isfinite(low) & np.isfinite(high)
            half32 = np.float32(0.5)
            self.mid = np.where(finite, half32 * low + half32 * high, np.float32(0)).astype(np.float32)
            self.half = np.where(finite, half32 * high - half32 * low, np.float32(1)).astype(np.float32)
            self.noise = (NOISE_FRACTION * self.half).astype(np.float32)

    def check_weights(self, tensors):
        """Refuses weights whose names, dtypes or shapes are not this policy's (names the first)."""
        for name, shape in self.layout.items():
            if name not in tensors:
                raise PolicyError(f"bad weights: missing tensor `{name}`")
            if tensors[name].dtype != np.float32 or tuple(tensors[name].shape) != shape:
                raise PolicyError(
                    f"bad weights: `{name}` must be f32 {list(shape)}, got {_WIRE.get(tensors[name].dtype.name, tensors[name].dtype.name)} {list(tensors[name].shape)}"
                )
        for name in tensors:
            if name not in self.layout:
                raise PolicyError(f"bad weights: unexpected tensor `{name}`")

    def set_weights(self, version, tensors):
        """Uses these weights from now on (checked first: nothing changes on error)."""
        self.check_weights(tensors)
        self.weights = {k: np.array(v, np.float32) for k, v in tensors.items()}
        self.version = version

    def reseed(self, seed):
        """Restarts the sampling stream."""
        self.rng = np.random.default_rng(seed)

    def recorded_layout(self):
        """What this policy records beside its actions (``Recorded``, PROTOCOL.md §3), as
        ``{key: [dtype, shape]}``: random ``action_log_prob``; linear/mlp ``action_log_prob``
        and ``logits`` ``[n]`` (discrete) or ``loc``, ``scale`` ``[d]`` (box); constant
        nothing."""
        if self.kind == "random":
            return {"action_log_prob": ["f32", []]}
        if self.kind == "constant":
            return {}
        if self.action.discrete:
            return {"action_log_prob": ["f32", []], "logits": ["f32", [self.action.n]]}
        d = self.action.low.size
        return {"action_log_prob": ["f32", []], "loc": ["f32", [d]], "scale": ["f32", [d]]}

    def act(self, obs):
        """Actions for the ``[k, obs_dim]`` float32 observations (the random policy uses only
        ``k``), as the env takes them: ``[k]`` int64 (``start + index``) or ``[k, *shape]``."""
        return self.act_recording(obs)[0]

    def act_recording(self, obs):
        """``act``, and what the policy records for each row (``recorded_layout``'s keys,
        ``[k, *shape]`` float32 arrays; docs/policies.md gives the formulas)."""
        k = obs.shape[0]
        a = self.action
        if self.kind == "random":
            return random_actions(a, self.rng, k), {"action_log_prob": np.full(k, random_log_density(a), np.float32)}
        if self.kind == "constant":
            value = self.weights["value"][0]
            if a.discrete:
                return a.value(np.full((k,), round_half_away(value), np.int64)), {}
            return np.full((k, a.low.size), value, np.float32), {}
        if self.weights is None:
            raise PolicyError("no weights: the trainer sent none before the first `continue`")
        x = obs
        last = len(self.layers) - 1
        for i, (wn, bn) in enumerate(self.layers):
            x = _rows_dense(self.weights[wn], self.weights[bn], x)
            if i != last:
                x = tanh32(x)
        random = self.exploration == "random"
        if a.discrete:
            if not random:
                index = np.argmax(x, axis=1).astype(np.int64)
            else:
                z = x - x.max(axis=1, keepdims=True)
                p = np.exp(z)
                p /= p.sum(axis=1, keepdims=True)
                u = self.rng.random(k)
                index = np.minimum((p.cumsum(axis=1) <= u[:, None]).sum(axis=1), a.n - 1).astype(np.int64)
            logits = np.asarray(x, np.float32)
            return a.value(index), {"action_log_prob": log_softmax_at(logits, index), "logits": logits}
        loc = (self.mid + self.half * tanh32(x)).astype(np.float32)
        out = loc
        if random:
            out = out + self.noise * self.rng.standard_normal(out.shape).astype(np.float32)
        out = np.minimum(np.maximum(out, a.low), a.high).astype(np.float32)
        scale = np.broadcast_to(self.noise, loc.shape).astype(np.float32)
        return out, {"action_log_prob": normal_log_prob(out, loc, scale), "loc": loc, "scale": scale}


#: ``ln sqrt(2 pi)``.
_LN_SQRT_2PI = 0.9189385332046728


def log_softmax_at(z, index):
    """``ln softmax(z)[a]`` for each row of the ``[k, n]`` logits and choice ``index[k]``:
    ``z_a - m - ln sum_j exp(z_j - m)``, ``m = max z``, in float64 (as every rollout node
    computes it; docs/policies.md), float32 out."""
    z = np.asarray(z, np.float64)
    m = z.max(axis=1, keepdims=True)
    s = np.exp(z - m).sum(axis=1)
    za = np.take_along_axis(z, np.asarray(index, np.int64)[:, None], axis=1)[:, 0]
    return ((za - m[:, 0]) - np.log(s)).astype(np.float32)


def normal_log_prob(x, loc, scale):
    """The normal log-density of each row of ``x`` ``[k, d]``, summed over its ``d``
    elements: ``-((x - loc) / scale)^2 / 2 - ln scale - ln sqrt(2 pi)`` in float64,
    float32 out."""
    x, loc, scale = (np.asarray(v, np.float64) for v in (x, loc, scale))
    z = (x - loc) / scale
    return (-0.5 * z * z - np.log(scale) - _LN_SQRT_2PI).sum(axis=1).astype(np.float32)


def random_log_density(a):
    """The random policy's log-density, the same for every action (docs/policies.md):
    discrete ``-ln n``; box ``-sum ln(high - low)``, ``-ln 2`` for an element with an
    infinite bound (the ``[-1, 1]`` it is drawn from); multi-discrete ``-sum ln nvec``;
    multi-binary ``-n ln 2``. float64 sums, float32 out; computed once per action space
    (the random policy records it at every step)."""
    d = a.__dict__.get("_log_density")
    if d is None:
        d = a._log_density = _log_density(a)
    return d


def _log_density(a):
    if a.discrete:
        return np.float32(-np.log(np.float64(a.n)))
    if a.kind == "multi_discrete":
        return np.float32(-np.log(a.nvec.astype(np.float64)).sum())
    if a.kind == "multi_binary":
        return np.float32(-np.float64(a.n) * np.log(2.0))
    lo, hi = a.low.astype(np.float64), a.high.astype(np.float64)
    finite = np.isfinite(lo) & np.isfinite(hi)
    with np.errstate(invalid="ignore"):
        span = np.where(finite, hi - lo, 2.0)
    return np.float32(-np.log(span).sum())


def fill_recorded(layout, k):
    """What a frame acted by ``init_random_frames``' random policy records under the keys
    of the main policy's ``layout`` (``recorded_layout``): the log-density is written by the
    caller; ``logits`` 0 (exactly the uniform categorical), ``loc``/``scale`` NaN (no
    normal was used)."""
    out = {}
    for key, (_, shape) in layout.items():
        if key == "action_log_prob":
            continue
        value = 0.0 if key == "logits" else np.nan
        out[key] = np.full((k, *shape), value, np.float32)
    return out


def round_half_away(v):
    """Rust's ``f32::round``: halves away from zero (numpy rounds them to even)."""
    v = float(v)
    return int(np.sign(v) * np.floor(abs(v) + 0.5))


def random_actions(a, rng, k):
    """``k`` uniform actions, shaped ``[k, *a.shape]``: indices in ``0..n`` (plus ``start``),
    boxes uniform in ``[low, high]`` (``[-1, 1]`` on an infinite bound), multi-discrete
    element ``i`` in ``0..nvec[i]``, multi-binary elements in ``0..2``."""
    if a.discrete:
        return a.value(rng.integers(0, a.n, size=k, dtype=np.int64))
    if a.kind == "multi_discrete":
        return rng.integers(0, a.nvec, size=(k, a.nvec.size), dtype=np.int64)
    if a.kind == "multi_binary":
        return rng.integers(0, 2, size=(k, a.n), dtype=np.uint8)
    box = a.__dict__.get("_uniform")  # the bounds drawn within, once per action space
    if box is None:
        finite = np.isfinite(a.low) & np.isfinite(a.high)
        lo = np.where(finite, a.low.astype(np.float64), -1.0)
        span = np.where(finite, a.high.astype(np.float64) - a.low.astype(np.float64), 2.0)
        box = a._uniform = (lo, span)
    lo, span = box
    v = (lo + span * rng.random((k, a.low.size))).astype(np.float32)
    return np.minimum(np.maximum(v, a.low), a.high).reshape((k,) + a.shape)
