"""The ``onnx`` policy (PROTOCOL.md §8, docs/policies.md): a network exported as ONNX (from
PyTorch, ``torch.onnx.export``) run with onnxruntime, whose outputs are the parameters of an
action distribution (the *head*): ``categorical``, ``normal``, ``tanh_normal`` or
``deterministic``, or a Q-value actor's action values (``qvalue``, version 8: the greedy
action, optionally epsilon-greedy). One session run per step for every row of the node; the
distribution's arithmetic is float64, what is recorded float32.

A recurrent model (``policy.config.state``, PROTOCOL.md §8, Recurrent) also takes ``is_init``
(bool ``[K, 1]``) and one input per state tensor, and gives ``next.<name>`` for each: the
caller keeps the state per env and hands it in (``act_recording``'s ``state``).

An exploration module (``policy.config.exploration``, PROTOCOL.md §8, Exploration modules:
torchrl's Ornstein-Uhlenbeck noise, ``exploration.py``) acts after a ``deterministic`` model:
its two state tensors end the same ``state`` list and are kept by the caller the same way, but
they are not the model's inputs; its ``eps`` is read from each version of the weights. The
epsilon-greedy module (torchrl's ``EGreedyModule``, §8, Q-value actors) follows a ``qvalue``
model the same way, with its ``eps`` and no state.

Weights are the model's f32 initializers by name (version 0: the file's values). An update
replaces them: the session is rebuilt, fully optimised, from the model with the new values
written into its initializers (see ``_Session``). onnxruntime and onnx are the node's optional
extra ``rollout-node[onnx]``, imported only when an ``onnx`` policy is built.
"""

import math

import numpy as np

from . import exploration as explore
from . import node_spec
from .policy import PolicyError
from .recurrent import IS_INIT, NEXT

#: The heads, by the name ``policy.config.head`` gives.
HEADS = ("categorical", "normal", "tanh_normal", "deterministic", "qvalue")
#: Recorded keys (PROTOCOL.md §3, the batch): the log-probability and the head's parameters.
LOG_PROB, LOGITS, LOC, SCALE = "action_log_prob", "logits", "loc", "scale"
#: What the ``qvalue`` head records: the model's action values and the greedy one's.
ACTION_VALUE, CHOSEN_ACTION_VALUE = "action_value", "chosen_action_value"
#: The keys each head records (``recorded_layout``'s).
_HEAD_KEYS = {
    "categorical": (LOG_PROB, LOGITS),
    "normal": (LOG_PROB, LOC, SCALE),
    "tanh_normal": (LOG_PROB, LOC, SCALE),
    "deterministic": (),
    "qvalue": (ACTION_VALUE, CHOSEN_ACTION_VALUE),
}

_LN_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_LN2 = math.log(2.0)
#: The observation's numpy dtype each ONNX input element type takes (a u8 image stays u8
#: for a u8 input; a float input gets the observation cast).
_INPUT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(uint8)": np.uint8,
    "tensor(int64)": np.int64,
}
_F32 = 1  # onnx.TensorProto.FLOAT
#: How errors name a tensor's dtype (the wire's names, as ``Weights::check_layout``).
_WIRE = {"float32": "f32", "float64": "f64", "int64": "i64", "uint8": "u8", "bool": "bool"}


def _imports():
    """onnx and onnxruntime, or a PolicyError that says how to install them."""
    try:
        import onnx
        import onnxruntime
    except ImportError as e:
        raise PolicyError(
            f"the onnx policy needs onnx and onnxruntime: pip install 'rollout-node[onnx]' ({e})"
        ) from None
    return onnx, onnxruntime


class _Session:
    """An onnxruntime session of the model with some initializers replaced, fully optimised
    (``ORT_ENABLE_ALL``).

    The new values are written into the model's initializers and the session is built from
    those bytes: onnxruntime's optimisers build parts of the graph from the initializers they
    see (a CNN's convolutions in the NCHWc layout, constants folded), so values given as
    ``add_initializer`` overrides would be ignored by an optimised graph, and without the
    optimisers a CNN runs 1.2-1.9x slower (Nature-CNN on Pong, 2026-12-06, BENCHMARKS.md
    "Workloads"). Measured (2026-12-05) for one weight update then a 1,000-frame batch of
    100 runs of 10 rows: a 4-64-64-2 MLP 1.1 ms (the update 0.49), a 10 M-weight MLP 370 ms
    (136 + 233).
    """

    def __init__(self, ort, onnx, model_bytes, weights):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        if weights:
            from onnx import numpy_helper

            proto = onnx.load_from_string(model_bytes)
            for init in proto.graph.initializer:
                if init.name in weights:
                    init.CopyFrom(numpy_helper.from_array(weights[init.name], init.name))
            model_bytes = proto.SerializeToString()
        self.session = ort.InferenceSession(model_bytes, sess_options=opts, providers=["CPUExecutionProvider"])


def _check_float_weights(model):
    """The model's f32 initializers as ``{name: array}`` (PolicyError naming a bad one)."""
    from onnx import numpy_helper

    out = {}
    for t in model.graph.initializer:
        if t.data_type != _F32:
            continue  # non-float initializers stay constants
        if t.name in out:
            raise PolicyError(f"onnx: the model has two initializers named `{t.name}`")
        if t.data_location == 1:  # EXTERNAL
            raise PolicyError(f"onnx: initializer `{t.name}` is stored outside the model (save it with its data inside)")
        try:
            # np.array, not np.ascontiguousarray: the latter makes a scalar (an
            # exploration module's `eps` or `sigma`) one-dimensional.
            out[t.name] = np.array(numpy_helper.to_array(t), dtype=np.float32, order="C")
        except Exception as e:
            raise PolicyError(f"onnx: initializer `{t.name}` cannot be read: {e}") from None
    return out


def _shape_str(shape):
    return "[" + ", ".join(str(d) if isinstance(d, int) else (d or "?") for d in shape) + "]"


def _fits(dims, shape):
    """Whether a model tensor of ``dims`` (ints or symbols) can be ``[K, *shape]``: its rank,
    and every fixed dimension after the first."""
    return len(dims) == 1 + len(shape) and all(not isinstance(d, int) or d == s for d, s in zip(dims[1:], shape))


def _type_str(onnx_type):
    """``tensor(float)`` as ``float``."""
    return onnx_type[len("tensor("):-1] if onnx_type.startswith("tensor(") else onnx_type


class OnnxPolicy:
    """The ``onnx`` policy of ``spec.policy`` for an env of these observation ``leaves``
    (``spaces.Leaf``) and this ``action`` space (``policy.ActionSpace``), whose batches hold
    ``env_keys`` (``spaces.layout``'s: no state tensor may be named as one).

    A multi-agent env (PROTOCOL.md §3, version 10) gives ``groups``, ``[(group, action, n)]``
    in name order, and ``action`` None: the model takes ``g.observation`` (``[K, n, ...]``)
    per group and gives the head's outputs as ``g.<name>`` ``[K, n, ...]``; each agent is one
    row of the head, the K·n rows of each group in turn (``act_groups``)."""

    kind = "onnx"

    def __init__(self, spec, leaves, action, seed, env_keys=(), groups=None):
        config = spec.get("config") or {}
        if groups is not None:
            if config.get("state") is not None:
                raise PolicyError("spec.policy.config.state: a multi-agent (PettingZoo) env takes no recurrent state")
            # Epsilon-greedy keeps no state: it acts per agent row, as torchrl's module does on
            # a group's [K, n] actions. An OU module keeps noise per env and agent: not yet.
            ex = config.get("exploration")
            if ex is not None and not (isinstance(ex, dict) and ex.get("kind") == explore.EGREEDY):
                raise PolicyError("spec.policy.config.exploration: a multi-agent (PettingZoo) env takes no exploration module but epsilon-greedy")
        self.exploration = spec.get("exploration") or "random"
        if self.exploration not in ("random", "deterministic"):
            raise PolicyError(f"unknown exploration {self.exploration!r}")
        self.head = config.get("head")
        if self.head not in HEADS:
            raise PolicyError(f"onnx: policy.config.head must be one of {', '.join(HEADS)}, got {self.head!r}")
        model = config.get("model")
        if not isinstance(model, (bytes, bytearray)):
            raise PolicyError(f"onnx: policy.config.model must be the model file's bytes, got {type(model).__name__}")
        self.model = bytes(model)
        self.action = action
        #: One head per group (one, named None, for a single-agent env).
        self._heads = [_Head(None, action, None)] if groups is None else [_Head(*g) for g in groups]
        self.groups = groups
        for hd in self._heads:
            _check_head_action(self.head, hd.action, hd.group)
        try:
            #: ``[(name, shape)]`` of the state tensors the caller keeps per env (``[]``:
            #: none): a recurrent model's and an exploration module's.
            self.state = node_spec.state_tensors(config.get("state"))
            node_spec.check_state_keys(self.state, [*env_keys, *_HEAD_KEYS[self.head]])
            #: The exploration module run after the model (None: none), and the state
            #: tensors the model itself takes and gives (``self.state`` less the module's).
            self.explorer, self.model_state = explore.from_config(config, self.state, action or self._heads[0].action, self.head)
            # Each group's own (its number of actions); one `eps` for all.
            for hd in self._heads:
                hd.explorer = self.explorer if hd is self._heads[0] else explore.from_config(config, [], hd.action, self.head)[0]
        except (node_spec.SpecError, explore.ExplorationError) as e:
            raise PolicyError(str(e)) from None
        self.rng = np.random.default_rng(seed)
        onnx, self._ort = _imports()
        self._onnx = onnx
        try:
            proto = onnx.load_from_string(self.model)
        except Exception as e:
            raise PolicyError(f"onnx: policy.config.model is not an ONNX model: {e}") from None
        initial = _check_float_weights(proto)
        del proto
        #: ``{name: shape}`` of the weights (the f32 initializers).
        self.layout = {name: tuple(a.shape) for name, a in initial.items()}
        self.weights = initial
        self.version = 0
        #: The exploration module's ``eps``, from the current weights.
        self.eps = self._eps_of(initial)
        try:
            self._session = _Session(self._ort, self._onnx, self.model, {})
        except Exception as e:
            raise PolicyError(f"onnx: onnxruntime cannot load the model: {_first_line(e)}") from None
        self._bind_inputs(leaves)
        self._bind_outputs()

    # -- the model's signature -----------------------------------------------------------
    def _bind_inputs(self, leaves):
        """Which observation leaf feeds which input, and its dtype (PolicyError naming it);
        a recurrent model's ``is_init`` and state inputs are checked by ``_bind_state_inputs``."""
        inputs = self._session.session.get_inputs()
        by_key = {_leaf_key(leaf): (i, leaf) for i, leaf in enumerate(leaves)}
        if self.model_state:
            inputs = self._bind_state_inputs(inputs)
        ins = inputs
        if len(leaves) == 1 and not leaves[0].path and len(inputs) == 1:
            keys = [_leaf_key(leaves[0])]  # the only input, whatever its name
        else:
            keys = [x.name for x in inputs]
        self._feeds = []
        for x, key in zip(ins, keys):
            if key not in by_key:
                raise PolicyError(f"onnx: model input `{x.name}` is not an observation key (they are {sorted(by_key)})")
            i, leaf = by_key[key]
            dtype = _INPUT_TYPES.get(x.type)
            if dtype is None:
                raise PolicyError(f"onnx: model input `{x.name}` is {x.type}, not float, double, uint8 or int64")
            if dtype == np.uint8 and leaf.np != np.uint8:
                raise PolicyError(f"onnx: model input `{x.name}` is uint8, the observation `{key}` is {leaf.dtype}")
            want = list(x.shape)
            if len(want) != 1 + len(leaf.shape) or any(
                isinstance(w, int) and w != s for w, s in zip(want[1:], leaf.shape)
            ):
                raise PolicyError(
                    f"onnx: model input `{x.name}` is {_shape_str(want)}, the observation `{key}` is [K, {', '.join(map(str, leaf.shape))}]"
                )
            self._feeds.append((x.name, i, None if dtype == leaf.np else dtype))
        if self.groups is not None:
            fed = {by_key[key][1].group for key in keys}
            for hd in self._heads:
                if hd.group not in fed:
                    raise PolicyError(f"onnx: the model has no input `{hd.group}.observation` for group `{hd.group}` "
                                      f"(its inputs are {[x.name for x in ins]})")

    def _bind_state_inputs(self, inputs):
        """Checks a recurrent model's ``is_init`` (bool ``[K, 1]``) and state inputs (f32
        ``[K, *shape]``), PolicyError naming the first missing or misshapen one; returns the
        other inputs (the observation's)."""
        by_name = {x.name: x for x in inputs}
        for name, shape, kind in [(IS_INIT, (1,), "tensor(bool)")] + [(n, s, "tensor(float)") for n, s in self.model_state]:
            x = by_name.get(name)
            want = f"{'bool' if kind == 'tensor(bool)' else 'float'} {_shape_str(['K', *shape])}"
            if x is None:
                raise PolicyError(f"onnx: the recurrent model needs an input `{name}` ({want}); its inputs are {list(by_name)}")
            if x.type != kind or not _fits(x.shape, shape):
                raise PolicyError(f"onnx: model input `{name}` is {_type_str(x.type)} {_shape_str(x.shape)}, the state needs {want}")
        taken = {IS_INIT, *(n for n, _ in self.model_state)}
        return [x for x in inputs if x.name not in taken]

    def _bind_outputs(self):
        """The outputs the head reads, by name, for each group, and a recurrent model's
        ``next.<name>`` (PolicyError naming what is missing or misshapen)."""
        outs = [o.name for o in self._session.session.get_outputs()]
        if self.model_state:
            outs = self._bind_state_outputs()
        h = self.head
        one_group = len(self._heads) == 1
        for hd in self._heads:
            pre = "" if hd.group is None else hd.group + "."

            def one(name, pre=pre):
                if pre + name in outs:
                    return pre + name
                if one_group and name in outs:
                    return name
                if one_group and len(outs) == 1:
                    return outs[0]
                raise PolicyError(f"onnx: the {h} head needs an output `{pre}{name}`; the model's are {outs}")

            if h == "categorical":
                hd.out = [one("logits")]
            elif h == "deterministic":
                hd.out = [one("action")]
            elif h == "qvalue":
                hd.out = [one(ACTION_VALUE)]
                self._check_float_output(hd.out[0], hd)
            else:
                # A one-group model may use the plain names; the group's come first.
                found = [p for p in dict.fromkeys([pre, "" if one_group else pre]) if p + "loc" in outs]
                if not found:
                    raise PolicyError(f"onnx: the {h} head needs an output `{pre}loc`; the model's are {outs}")
                p = found[0]
                spread = [p + n for n in ("scale", "log_std") if p + n in outs]
                if len(spread) != 1:
                    raise PolicyError(f"onnx: the {h} head needs one output `{pre}scale` or `{pre}log_std`; the model's are {outs}")
                hd.out = [p + "loc", spread[0]]
            a = hd.action
            if not a.discrete:
                low, high = a.low.astype(np.float64), a.high.astype(np.float64)
                finite = np.isfinite(low) & np.isfinite(high)
                hd.c = np.where(finite, (high + low) / 2, 0.0)
                hd.h = np.where(finite, (high - low) / 2, 1.0)
                # The tanh-normal's constant part of log |d action / d u|, summed once here.
                hd.log_h = float(np.log(hd.h).sum())
        self._out = self._heads[0].out
        #: What each run fetches: the heads' outputs, then the state's.
        self._fetch = [n for hd in self._heads for n in hd.out] + [NEXT + n for n, _ in self.model_state]

    def _check_float_output(self, name, hd):
        """Refuses an output the model declares of another element type than float (the
        ``qvalue`` head's action values are f32, PROTOCOL.md §8): when the node is built,
        not at its first step."""
        o = next(o for o in self._session.session.get_outputs() if o.name == name)
        if o.type != "tensor(float)":
            raise PolicyError(f"onnx: model output `{name}` is {_type_str(o.type)}, the {self.head} head needs float [K, {hd.action.n}]")

    def _bind_state_outputs(self):
        """Checks a recurrent model's ``next.<name>`` outputs (f32 ``[K, *shape]``, PolicyError
        naming the first missing or misshapen one); returns the names of the others."""
        outputs = self._session.session.get_outputs()
        by_name = {o.name: o for o in outputs}
        for name, shape in self.model_state:
            o = by_name.get(NEXT + name)
            want = f"float {_shape_str(['K', *shape])}"
            if o is None:
                raise PolicyError(f"onnx: the recurrent model needs an output `{NEXT}{name}` ({want}); its outputs are {list(by_name)}")
            if o.type != "tensor(float)" or not _fits(o.shape, shape):
                raise PolicyError(f"onnx: model output `{NEXT}{name}` is {_type_str(o.type)} {_shape_str(o.shape)}, the state needs {want}")
        taken = {NEXT + n for n, _ in self.model_state}
        return [o.name for o in outputs if o.name not in taken]

    # -- weights -------------------------------------------------------------------------
    def check_weights(self, tensors):
        """Refuses weights whose names, dtypes or shapes are not the model's f32 initializers
        (``Weights::check_layout``: names the first)."""
        for name, shape in self.layout.items():
            if name not in tensors:
                raise PolicyError(f"bad weights: missing tensor `{name}`")
            t = tensors[name]
            if t.dtype != np.float32 or tuple(t.shape) != shape:
                got = _WIRE.get(t.dtype.name, t.dtype.name)
                raise PolicyError(f"bad weights: `{name}` must be f32 {list(shape)}, got {got} {list(t.shape)}")
        for name in tensors:
            if name not in self.layout:
                raise PolicyError(f"bad weights: unexpected tensor `{name}` (not a float initializer of the model)")

    def set_weights(self, version, tensors):
        """Uses these weights from now on (checked first: nothing changes on error)."""
        self.check_weights(tensors)
        # np.asarray, not np.ascontiguousarray: a scalar weight keeps its shape [].
        weights = {k: np.asarray(tensors[k], np.float32, order="C") for k in self.layout}
        eps = self._eps_of(weights)
        try:
            session = _Session(self._ort, self._onnx, self.model, weights)
        except Exception as e:
            raise PolicyError(f"onnx: the model does not load with these weights: {_first_line(e)}") from None
        self._session, self.weights, self.version, self.eps = session, weights, version, eps

    def _eps_of(self, weights):
        """The exploration module's ``eps`` in ``weights`` (None without a module)."""
        if self.explorer is None:
            return None
        try:
            return explore.eps_of(self.explorer, weights)
        except explore.ExplorationError as e:
            raise PolicyError(str(e)) from None

    def reseed(self, seed):
        """Restarts the sampling stream."""
        self.rng = np.random.default_rng(seed)

    # -- acting --------------------------------------------------------------------------
    def recorded_layout(self):
        """What this policy records beside its actions (PROTOCOL.md §3), ``{key: [dtype,
        shape]}``: categorical ``action_log_prob`` and ``logits`` ``[n]``; normal and
        tanh-normal ``action_log_prob``, ``loc`` and ``scale`` ``[d]``; qvalue ``action_value``
        ``[n]`` and ``chosen_action_value`` ``[1]``; deterministic nothing. A multi-agent
        env's are each group's, ``g.<key>`` ``[n, *shape]``."""
        if self.groups is not None:
            return {f"{hd.group}.{key}": [dtype, [hd.n, *shape]] for hd in self._heads
                    for key, (dtype, shape) in self._head_layout(hd.action).items()}
        return self._head_layout(self.action)

    def _head_layout(self, a):
        if self.head == "categorical":
            return {LOG_PROB: ["f32", []], LOGITS: ["f32", [a.n]]}
        if self.head == "qvalue":
            return {ACTION_VALUE: ["f32", [a.n]], CHOSEN_ACTION_VALUE: ["f32", [1]]}
        if self.head in ("normal", "tanh_normal"):
            d = a.low.size
            return {LOG_PROB: ["f32", []], LOC: ["f32", [d]], SCALE: ["f32", [d]]}
        return {}

    def _run(self, obs, state=None):
        """The model's outputs the head reads, then a recurrent model's ``next.<name>``, for
        the observation leaves ``obs`` and ``state`` (``act_recording``'s) (one run)."""
        feeds = {}
        for name, i, cast in self._feeds:
            x = obs[i]
            feeds[name] = x if cast is None else x.astype(cast)
        if self.model_state:
            if state is None:
                raise PolicyError("onnx: a recurrent model acts with the envs' state, and none was given")
            is_init, values = state
            feeds[IS_INIT] = is_init.reshape(-1, 1)
            feeds.update(zip((n for n, _ in self.model_state), values))
        try:
            return self._session.session.run(self._fetch, feeds)
        except Exception as e:
            raise PolicyError(f"onnx: the model failed on the observations: {_first_line(e)}") from None

    def act(self, obs):
        """The actions for observation leaves ``obs`` (see ``act_recording``)."""
        return self.act_recording(obs)[0]

    def act_recording(self, obs, state=None):
        """The actions for observation leaves ``obs`` (a list of ``[k, ...]`` arrays, one per
        leaf, or one array), as the env takes them, and what is recorded for each row
        (``recorded_layout``'s keys, ``[k, *shape]`` float32). A recurrent model takes
        ``state = (is_init, values)``: bool ``[k]`` and one f32 ``[k, *shape]`` array per state
        tensor, in ``self.state``'s order (the caller zeroes the rows of ``is_init``); its
        ``next.<name>`` outputs are recorded too, and an OU module's (``_exploring``); the
        epsilon-greedy module, stateless, acts inside the ``qvalue`` head (``_qvalue``)."""
        if isinstance(obs, np.ndarray):
            obs = [obs]
        k = obs[0].shape[0]
        if isinstance(self.explorer, explore.OrnsteinUhlenbeck):
            return self._exploring(obs, k, state)
        outs = self._run(obs, state)
        a = self.action
        hd = self._heads[0]
        hd.action = a  # `action` is the policy's own attribute (a caller may set it)
        action, rec = self._apply(hd, outs, k)
        if self.model_state:
            rec.update(self._next_state(outs[len(self._out):], k))
        return (action if a.discrete else action.reshape((k,) + a.shape)), rec

    def _apply(self, hd, outs, k):
        """Head ``hd`` on its outputs ``outs`` (the first of the list) for ``k`` rows."""
        if self.head == "categorical":
            return self._categorical(hd, outs[0], k)
        if self.head == "qvalue":
            return self._qvalue(hd, outs[0], k)
        if self.head == "deterministic":
            return self._deterministic(hd, outs[0], k), {}
        return self._normal(hd, outs[0], outs[1], k)

    def act_groups(self, obs, k):
        """A multi-agent env's actions for observation leaves ``obs`` (``[k, n, ...]`` each, the
        leaves of every group): ``({g: [k, n, *action shape]}, {"g.<key>": [k, n, ...]})``. One
        run; then each group's K·n rows (env then agent) through the head, groups in name
        order, each drawing from the generator in turn."""
        outs = self._run(obs)
        acts, rec = {}, {}
        i = 0
        for hd in self._heads:
            mine = [_agent_rows(np.asarray(x), k, hd.n) for x in outs[i:i + len(hd.out)]]
            i += len(hd.out)
            a, r = self._apply(hd, mine, k * hd.n)
            acts[hd.group] = np.asarray(a).reshape((k, hd.n) + hd.action.shape)
            for key, v in r.items():
                rec[f"{hd.group}.{key}"] = v.reshape((k, hd.n) + v.shape[1:])
        return acts, rec

    def _exploring(self, obs, k, state):
        """``act_recording`` with an Ornstein-Uhlenbeck module: the model's action clipped to the
        box (and its own state, if any), then the module's noise per row from its state in
        ``state``, whose ``next.<name>`` are recorded. Deterministic exploration adds no noise and holds the
        module's state, as torchrl's module does outside ``ExplorationType.RANDOM``."""
        if state is None:
            raise PolicyError("onnx: an exploration module acts with the envs' state, and none was given")
        is_init, values = state
        by_name = dict(zip((n for n, _ in self.state), values))
        model_values = [by_name[n] for n, _ in self.model_state]
        outs = self._run(obs, (is_init, model_values))
        a = self.action
        raw = self._shaped(self._out[0], np.asarray(outs[0]), k, a.low.size)
        if raw.dtype != np.float32:
            raise PolicyError(f"onnx: output `{self._out[0]}` is {raw.dtype}, the deterministic head needs float32 for a box action")
        noise, steps = by_name[explore.NOISE], by_name[explore.STEPS]
        head = np.minimum(np.maximum(raw, a.low), a.high)  # the deterministic head's action
        if self.exploration == "deterministic":
            act, next_noise, next_steps = head, noise.copy(), steps.copy()
        else:
            z = self.rng.standard_normal((k, a.low.size))
            act, next_noise, next_steps = self.explorer.step(head, noise, steps, self.eps, z)
        act = np.minimum(np.maximum(act, a.low), a.high).astype(np.float32)
        rec = self._next_state(outs[len(self._out):], k) if self.model_state else {}
        rec[NEXT + explore.NOISE] = next_noise.astype(np.float32)
        rec[NEXT + explore.STEPS] = next_steps.astype(np.float32)
        return act.reshape((k,) + a.shape), rec

    def _next_state(self, outs, k):
        """``{next.<name>: [k, *shape] f32}`` of a run's state outputs (PolicyError naming one
        of another dtype or shape)."""
        rec = {}
        for (name, shape), x in zip(self.model_state, outs):
            x = np.asarray(x)
            if x.dtype != np.float32 or x.shape != (k, *shape):
                raise PolicyError(
                    f"onnx: output `{NEXT}{name}` is {_WIRE.get(x.dtype.name, x.dtype.name)} {list(x.shape)}, "
                    f"the state needs f32 {[k, *shape]}"
                )
            rec[NEXT + name] = x
        return rec

    def _shaped(self, name, x, k, d):
        x = np.asarray(x)
        if x.shape != (k, d):
            raise PolicyError(f"onnx: output `{name}` is {list(x.shape)}, the {self.head} head needs [{k}, {d}]")
        return x

    def _categorical(self, hd, logits, k):
        a = hd.action
        z = self._shaped(hd.out[0], logits, k, a.n).astype(np.float64)
        m = z.max(axis=1, keepdims=True)
        lse = m[:, 0] + np.log(np.exp(z - m).sum(axis=1))
        if self.exploration == "deterministic":
            idx = np.argmax(z, axis=1)
        else:
            p = np.exp(z - lse[:, None])
            u = self.rng.random(k)
            idx = np.minimum((np.cumsum(p, axis=1) <= u[:, None]).sum(axis=1), a.n - 1)
        lp = z[np.arange(k), idx] - lse
        rec = {LOG_PROB: lp.astype(np.float32), LOGITS: np.array(logits, np.float32)}
        return a.value(idx.astype(np.int64)), rec

    def _qvalue(self, hd, values, k):
        """The ``qvalue`` head on the ``[k, n]`` action values: the first argmax, kept in
        deterministic exploration or without a module, else the epsilon-greedy module's choice
        from the node's generator. Records the values and the greedy action's value (torchrl's
        ``QValueModule`` writes ``chosen_action_value`` before ``EGreedyModule`` acts)."""
        a = hd.action
        q = self._shaped(hd.out[0], values, k, a.n)
        if q.dtype != np.float32:
            raise PolicyError(f"onnx: output `{hd.out[0]}` is {q.dtype}, the qvalue head needs float32 [{k}, {a.n}]")
        greedy = np.argmax(q, axis=1).astype(np.int64)
        idx = greedy
        if hd.explorer is not None and self.exploration == "random":
            idx = hd.explorer.step(greedy, self.eps, self.rng)
        chosen = q[np.arange(k), greedy][:, None]
        rec = {ACTION_VALUE: np.array(q, np.float32), CHOSEN_ACTION_VALUE: np.array(chosen, np.float32)}
        return a.value(idx), rec

    def _spread(self, hd, x, k, d):
        """The scale output ([k, d], [1, d] or [d]) broadcast to [k, d], float64."""
        name = hd.out[1]
        x = np.asarray(x)
        if x.shape not in ((k, d), (1, d), (d,)):
            raise PolicyError(f"onnx: output `{name}` is {list(x.shape)}, the {self.head} head needs [{k}, {d}], [1, {d}] or [{d}]")
        s = x.astype(np.float64)
        if name == "log_std":
            s = np.exp(s)
        # A per-row scale is [k, d] already (`broadcast_to` alone costs ~10 µs a call).
        return s if s.shape == (k, d) else np.broadcast_to(s, (k, d))

    def _normal(self, hd, loc, spread, k):
        a = hd.action
        d = a.low.size
        mu = self._shaped(hd.out[0], loc, k, d).astype(np.float64)
        s = self._spread(hd, spread, k, d)
        z = None if self.exploration == "deterministic" else self.rng.standard_normal((k, d))
        u = mu if z is None else mu + s * z
        # Few NumPy calls on these small arrays (each costs ~1 µs whatever its size): the
        # constants are summed over the d dims once, not added per element.
        if self.head == "normal":
            act = np.minimum(np.maximum(u.astype(np.float32), a.low), a.high)
            # The density of the action as clipped and rounded, not of the draw.
            x = (act.astype(np.float64) - mu) / s
            lp = (-0.5 * x * x - np.log(s)).sum(axis=1) - d * _LN_SQRT_2PI
        else:
            act = np.minimum(np.maximum((hd.c + hd.h * np.tanh(u)).astype(np.float32), a.low), a.high)
            # log N(u; mu, s) - log |d action / d u|, with (u - mu) / s = z and
            # log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)).
            e = -np.log(s) + 2.0 * (u + np.logaddexp(0.0, -2.0 * u))
            if z is not None:
                e -= 0.5 * z * z
            lp = e.sum(axis=1) - (d * (_LN_SQRT_2PI + 2.0 * _LN2) + hd.log_h)
        rec = {LOG_PROB: lp.astype(np.float32), LOC: mu.astype(np.float32), SCALE: s.astype(np.float32)}
        return act, rec

    def _deterministic(self, hd, out, k):
        a = hd.action
        x = np.asarray(out)
        name = hd.out[0]
        if a.discrete:
            if x.shape not in ((k,), (k, 1)) or x.dtype not in (np.int64, np.int32):
                raise PolicyError(f"onnx: output `{name}` is {x.dtype} {list(x.shape)}, the deterministic head needs int64 or int32 [{k}] for a discrete action")
            idx = x.reshape(k).astype(np.int64)
            bad = (idx < 0) | (idx >= a.n)
            if bad.any():
                raise PolicyError(f"onnx: output `{name}` has action {int(idx[bad][0])}, not in 0..{a.n}")
            return a.value(idx)
        d = a.low.size
        x = self._shaped(name, x, k, d)
        if x.dtype != np.float32:
            raise PolicyError(f"onnx: output `{name}` is {x.dtype}, the deterministic head needs float32 for a box action")
        return np.minimum(np.maximum(x, a.low), a.high).astype(np.float32)


def _check_head_action(head, action, group=None):
    """Refuses an action space the ``head`` cannot give (PolicyError naming the head), before
    the model is read or an exploration module checked, so that the head's refusal comes
    first: a discrete or box action; discrete for ``categorical`` and ``qvalue``, a box for
    ``normal`` and ``tanh_normal``."""
    of = "the env's" if group is None else f"group `{group}`'s"
    if action.kind not in ("discrete", "box"):
        raise PolicyError(f"onnx: a {action.kind} action cannot be taken by a model (discrete or box actions)"
                          + ("" if group is None else f": group `{group}`"))
    if head in ("categorical", "qvalue") and not action.discrete:
        raise PolicyError(f"onnx: the {head} head needs a discrete action space, {of} is {action.kind}")
    if head in ("normal", "tanh_normal") and action.discrete:
        raise PolicyError(f"onnx: the {head} head needs a box action space, {of} is {action.kind}")


class _Head:
    """One group's part of the head (a single-agent env has one, ``group`` None): its action
    space, its agents ``n``, the outputs it reads and a box's centre ``c`` and half-range ``h``
    (``log_h``: the sum of ``log h``)."""

    def __init__(self, group, action, n):
        self.group, self.action, self.n = group, action, n
        self.out, self.c, self.h, self.log_h = None, None, None, 0.0
        #: The epsilon-greedy module of this group's action (None: none).
        self.explorer = None


def _leaf_key(leaf):
    """The batch key of an observation leaf: a group's (``g.observation...``) or ``observation...``."""
    return getattr(leaf, "key", None) or "observation" + leaf.suffix


def _agent_rows(x, k, n):
    """A model output ``[k, n, ...]`` as ``[k * n, ...]`` rows (env then agent); any other
    shape (a state-independent ``[d]`` scale) as it is."""
    if x.ndim >= 2 and x.shape[:2] == (k, n):
        return x.reshape((k * n,) + x.shape[2:])
    return x


def _first_line(e):
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
