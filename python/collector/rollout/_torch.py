"""A torch actor as rollout's ``onnx`` policy (imported only when one is given).

:func:`export_policy` takes an ``nn.Module`` (observation to action), a tensordict
``TensorDictModule`` (or ``TensorDictSequential``) writing ``"action"``, or a
probabilistic actor (torchrl's ``ProbabilisticActor``, tensordict's
``ProbabilisticTensorDictSequential``) and exports the part before the
distribution with ``torch.onnx.export`` (``dynamo=False``,
``do_constant_folding=False``, a dynamic batch axis). The distribution class
picks the head: ``Categorical``/``OneHotCategorical`` -> ``categorical``,
``Normal``/``IndependentNormal`` -> ``normal``, ``TanhNormal`` -> ``tanh_normal``,
``Delta``/``TanhDelta`` or no distribution -> ``deterministic``.

A torchrl ``LSTMModule`` or ``GRUModule`` in the actor is exported one step at a
time, as torchrl's collectors run it (its non-recurrent mode): the model takes
``is_init`` and the state tensors as inputs and gives the next state as
``next.<name>`` outputs (PROTOCOL.md §8, Recurrent), computed by the module's own
``nn.LSTM``/``nn.GRU``; the nodes keep the state per env.

The exported module keeps the actor's own parameter names, so the model's
initializers are named as the actor's ``state_dict`` is (``module.0.module.0.weight``
for a ``ProbabilisticActor``); :class:`ExportedPolicy` keeps the map from
initializer names to the actor's names and turns a module, a ``state_dict`` or
``TensorDict.from_module`` into the weights to push, checked name by name.
"""

from __future__ import annotations

import io
import math
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from . import _exploration
from ._collector import _config_error as config_error

try:
    import onnx  # noqa: F401 - needed by every export; said now if missing
    import tensordict  # noqa: F401
    import torch
    from torch import nn
except ImportError as _e:  # pragma: no cover - the message is the point
    raise ImportError(
        f"rollout: a torch policy needs torch, tensordict and onnx ({_e}): pip install 'rollout[torch]'"
    ) from _e

# Heads by distribution class name (torch's and torchrl's classes alike).
_CATEGORICAL = {"Categorical": "index", "OneHotCategorical": "one_hot"}
_NORMAL = {"Normal", "IndependentNormal"}
_TANH_NORMAL = {"TanhNormal"}
_DELTA = {"Delta", "TanhDelta"}
# The input torchrl's recurrent modules read the episode's start from (InitTracker's).
_IS_INIT = "is_init"

# The newest opset tract is tested against (torch's own default is newer).
_OPSET = 18

Key = Any  # a tensordict key: a string or a tuple of strings


def is_torch_policy(policy: Any) -> bool:
    """Whether ``policy`` is a torch module this module exports."""
    return isinstance(policy, nn.Module)


def _key_name(key: Key) -> str:
    return ".".join(key) if isinstance(key, tuple) else str(key)


def _input_name(key: Key, group: Optional[str] = None) -> str:
    """The ONNX input name of an in_key: ``observation`` or ``observation.<name>``; of a
    multi-agent actor, ``<group>.observation`` (PROTOCOL.md §8, Multi-agent)."""
    parts = key if isinstance(key, tuple) else tuple(key.split("."))
    if group is not None:
        if parts[:2] != (group, "observation"):
            raise config_error(
                "policy",
                f"in_key {key!r} is not an observation key of group {group!r}: a multi-agent actor reads "
                f"({group!r}, \"observation\")",
            )
        return ".".join(parts)
    if parts[0] != "observation":
        raise config_error(
            "policy",
            f"in_key {key!r} is not an observation key of the env: rollout's policies read "
            "`observation` (or `(\"observation\", name)` for a dict observation)",
        )
    return ".".join(parts)


def _parts(key: Key) -> Tuple[str, ...]:
    return key if isinstance(key, tuple) else tuple(str(key).split("."))


class _Recurrent:
    """A torchrl ``LSTMModule`` or ``GRUModule`` as rollout's nodes run it: one step
    per call on a batch of envs (torchrl's non-recurrent mode, whatever the module's
    ``recurrent_mode``: the nodes act one frame at a time; the mode is the learner's).

    The step calls the module's own ``nn.LSTM``/``nn.GRU``, so the exported model's
    initializers keep the actor's parameter names; it zeroes the state rows where
    ``is_init`` is set, as the module does. ``state`` lists ``(in_key, next key,
    shape)`` per state tensor, ``shape`` being ``[num_layers, hidden]``."""

    def __init__(self, path: str, module: nn.Module, lstm: bool) -> None:
        kind = type(module).__name__
        where = f"`{path}` ({kind})" if path else kind
        self.lstm = lstm
        self.rnn = module.lstm if lstm else module.gru
        if self.rnn.bidirectional:
            raise config_error(
                "policy",
                f"{where} is bidirectional: it reads the sequence backwards from its end, and a policy acting "
                "one frame at a time has no future frames to read",
            )
        if getattr(self.rnn, "proj_size", 0):
            raise config_error("policy", f"{where} has proj_size={self.rnn.proj_size}: torch.onnx.export cannot export an LSTM with projections")
        in_keys = [k for k in module.in_keys if k != _IS_INIT]
        self.value_key, self.out_key = in_keys[0], module.out_keys[0]
        shape = (int(self.rnn.num_layers), int(self.rnn.hidden_size))
        self.state: List[Tuple[Key, Key, Tuple[int, int]]] = []
        for key, nxt in zip(in_keys[1:], module.out_keys[1:]):
            if _parts(nxt) != ("next",) + _parts(key):
                raise config_error(
                    "policy",
                    f"{where} reads its state from {key!r} and writes it to {nxt!r}: the next state must be "
                    f"(\"next\", {key!r}), as torchrl's make_tensordict_primer requires, for the state to carry on",
                )
            self.state.append((key, nxt, shape))

    def step(self, td: Any) -> Any:
        """One frame for each of ``td``'s rows (``[B, features]``, the state ``[B,
        layers, hidden]``, ``is_init`` ``[B, 1]``): writes the output and the next state."""
        x = td.get(self.value_key)
        keep = (~td.get(_IS_INIT)).to(x.dtype).unsqueeze(-1)  # [B, 1, 1]
        # [B, layers, hidden] -> the [layers, B, hidden] nn.LSTM/GRU take.
        state = [(td.get(key) * keep).transpose(0, 1).contiguous() for key, _, _ in self.state]
        if self.lstm:
            y, (h, c) = self.rnn(x.unsqueeze(1), (state[0], state[1]))
            nxt = (h, c)
        else:
            y, h = self.rnn(x.unsqueeze(1), state[0])
            nxt = (h,)
        td.set(self.out_key, y.squeeze(1))
        for (_, key, _), v in zip(self.state, nxt):
            td.set(key, v.transpose(0, 1))
        return td


def _recurrent_classes() -> Tuple[type, ...]:
    """torchrl's ``(LSTMModule, GRUModule)``, or ``()`` without torchrl."""
    try:
        from torchrl.modules import GRUModule, LSTMModule
    except ImportError:  # pragma: no cover - without torchrl no actor has them
        return ()
    return (LSTMModule, GRUModule)


def _recurrent(policy: nn.Module, parts: Sequence[nn.Module]) -> Dict[int, _Recurrent]:
    """The torchrl recurrent modules of ``policy`` by ``id``, each reachable from
    ``parts`` through ``TensorDictSequential`` s (where the export runs them one step
    at a time); any other recurrent layer is refused by its path."""
    from tensordict.nn import TensorDictSequential

    classes = _recurrent_classes()
    found: Dict[int, _Recurrent] = {}
    inner = set()
    for path, sub in policy.named_modules():
        if classes and isinstance(sub, classes):
            found[id(sub)] = _Recurrent(path, sub, isinstance(sub, classes[0]))
            inner.update(id(m) for m in sub.modules())
    for path, sub in policy.named_modules():
        if id(sub) not in inner and isinstance(sub, (nn.RNNBase, nn.RNNCellBase)):
            where = f"`{path}`" if path else "the policy"
            raise config_error(
                "policy",
                f"{where} is a recurrent layer ({type(sub).__name__}) whose state rollout cannot tell: wrap it in "
                "torchrl's LSTMModule or GRUModule (the nodes keep their state per env)",
            )
    reached = set()

    def walk(m: nn.Module) -> None:
        if id(m) in found:
            reached.add(id(m))
        elif isinstance(m, TensorDictSequential):
            for sub in m.module:
                walk(sub)

    for m in parts:
        walk(m)
    for path, sub in policy.named_modules():
        if id(sub) in found and id(sub) not in reached:
            raise config_error(
                "policy",
                f"`{path}` ({type(sub).__name__}) is inside a module rollout cannot open: put it in the actor's "
                "TensorDictSequential (or ProbabilisticActor) itself",
            )
    keys = set()
    for r in found.values():
        for key, _, _ in r.state:
            if _parts(key) in keys:
                raise config_error("policy", f"two recurrent modules keep their state under {key!r}: give each its own in_keys")
            keys.add(_parts(key))
    return found


class _Export(nn.Module):
    """The exported function: in_keys as positional inputs, the head's outputs as a
    tuple. It registers the owner's children, parameters and buffers under their own
    names, so the model's initializers are named as the owner's ``state_dict``."""

    def __init__(self, owner: nn.Module, run: Any) -> None:
        super().__init__()
        for n, c in owner.named_children():
            self.add_module(n, c)
        for n, p in owner.named_parameters(recurse=False):
            self.register_parameter(n, p)
        for n, b in owner.named_buffers(recurse=False):
            self.register_buffer(n, b)
        object.__setattr__(self, "_run", run)

    def forward(self, *xs: "torch.Tensor") -> Tuple["torch.Tensor", ...]:
        return self._run(*xs)


def _tensordict_run(
    parts: Sequence[nn.Module], in_keys: List[Key], out: List[Tuple[Key, Any]], recurrent: Mapping[int, _Recurrent]
):
    """Runs tensordict modules over a TensorDict of the inputs; ``out`` lists
    ``(key, transform)`` pairs, the transform applied to the entry (or ``None``).
    The ``recurrent`` modules take one step (``_Recurrent.step``), and the
    ``TensorDictSequential`` s holding them are run module by module."""
    from tensordict import TensorDict
    from tensordict.nn import TensorDictSequential

    def call(m: nn.Module, td: Any) -> Any:
        r = recurrent.get(id(m))
        if r is not None:
            return r.step(td)
        if isinstance(m, TensorDictSequential) and any(id(sub) in recurrent for sub in m.modules()):
            for sub in m.module:
                td = call(sub, td)
            return td
        return m(td)

    def run(*xs):
        td = TensorDict({k: x for k, x in zip(in_keys, xs)}, batch_size=[])
        for p in parts:
            td = call(p, td)
        res = []
        for key, f in out:
            v = td.get(key)
            res.append(v if f is None else f(v))
        return tuple(res)

    return run


def _bound_array(v: Any, d: int) -> np.ndarray:
    if isinstance(v, torch.Tensor):
        v = v.detach().cpu().double().numpy()
    return np.broadcast_to(np.asarray(v, dtype=np.float64), (d,)).copy()


def _box_bounds(space: Mapping[str, Any]) -> Tuple[np.ndarray, np.ndarray]:
    shape = space.get("shape") or []
    d = int(np.prod(shape)) if shape else 1
    def side(b: Any, default: float) -> np.ndarray:
        if b is None:
            return np.full(d, default)
        if isinstance(b, (list, tuple)):  # JSON writes an infinite bound as null
            b = [default if v is None else v for v in b]
        return np.broadcast_to(np.asarray(b, dtype=np.float64), (d,)).copy()
    return side(space.get("low"), -math.inf), side(space.get("high"), math.inf)


class ExportedPolicy:
    """A torch actor exported as ONNX: the policy config, the head, the action's
    encoding (``index`` or ``one_hot`` for a discrete action) and the name map."""

    def __init__(self, module: nn.Module, model: bytes, head: str, encoding: Optional[str], input_names: List[str]) -> None:
        import onnx
        from onnx import numpy_helper

        self.module = module
        self.model = model
        self.head = head
        # Where the actor writes its log-probability, and whether it does (torchrl's
        # `log_prob_key` and `return_log_prob`; a module without a distribution has none).
        self.log_prob_key: Any = None
        # Recorded entries torchrl's batch of this actor does not have.
        self.drop_keys: Tuple[str, ...] = ()
        self.action_encoding = encoding
        self.input_names = input_names
        # Actions of a categorical head (the logits' size), for one-hot batches.
        self.n_actions: Optional[int] = None
        # The state tensors the nodes keep per env: a recurrent actor's (name, [layers,
        # hidden]) each, then an exploration module's.
        self.state: List[Tuple[str, Tuple[int, ...]]] = []
        # The config's `exploration` (an OrnsteinUhlenbeckProcessModule's), or None.
        self.exploration: Optional[Dict[str, Any]] = None
        names = dict(module.state_dict(keep_vars=True))
        self._module_names = set(names)
        proto = onnx.load_from_string(model)
        # Initializer name -> the module's name; initializers with no module name
        # (constants the exporter lifted) are pushed as they are in the file.
        self.name_map: Dict[str, str] = {}
        self.fixed: Dict[str, np.ndarray] = {}
        self.layout: Dict[str, Tuple[Tuple[int, ...], str]] = {}
        for init in proto.graph.initializer:
            if init.data_type != onnx.TensorProto.FLOAT:
                continue  # non-float initializers stay constants of the model
            if init.name in names:
                self.name_map[init.name] = init.name
                self.layout[init.name] = (tuple(init.dims), "float32")
            else:
                self.fixed[init.name] = numpy_helper.to_array(init)

    def config(self) -> Dict[str, Any]:
        """The ``onnx`` policy config (PolicySpec.config)."""
        config = {"kind": "onnx", "model": self.model, "head": self.head}
        if self.state:
            config["state"] = [{"name": n, "shape": list(s)} for n, s in self.state]
        if self.exploration is not None:
            config["exploration"] = dict(self.exploration)
        return config

    # ---- weights
    def weights(self, source: Any = None) -> Dict[str, np.ndarray]:
        """The initializers to push, by ONNX name, from ``source``: ``None`` (the
        module's current parameters), a module, a ``state_dict`` or a TensorDict.
        CPU float32 contiguous tensors are viewed as NumPy arrays (no copy); any
        name, shape, dtype or layout that does not fit is a ``ConfigError`` on
        ``weights`` naming the tensor, before anything is stored."""
        tensors = self._tensors(self.module if source is None else source)
        extra = sorted(n for n in tensors if n not in self._module_names)
        if extra:
            raise config_error("weights", f"unexpected tensor `{extra[0]}`: the policy has no parameter of that name")
        out: Dict[str, np.ndarray] = {}
        for onnx_name, name in self.name_map.items():
            if name not in tensors:
                raise config_error("weights", f"missing tensor `{name}`")
            out[onnx_name] = self._array(name, tensors[name], self.layout[onnx_name])
        out.update(self.fixed)
        return out

    @staticmethod
    def _tensors(source: Any) -> Dict[str, Any]:
        if isinstance(source, nn.Module):
            return dict(source.state_dict(keep_vars=True))
        try:
            from tensordict import TensorDictBase
        except ImportError:  # pragma: no cover
            TensorDictBase = ()
        if TensorDictBase and isinstance(source, TensorDictBase):
            return {_key_name(k): v for k, v in source.items(include_nested=True, leaves_only=True)}
        if isinstance(source, Mapping):
            return {str(k): v for k, v in source.items()}
        raise config_error(
            "weights",
            f"expected the policy module, its state_dict or TensorDict.from_module(policy), got {type(source).__name__}",
        )

    @staticmethod
    def _array(name: str, value: Any, layout: Tuple[Tuple[int, ...], str]) -> np.ndarray:
        shape, dtype = layout
        if isinstance(value, torch.Tensor):
            t = value.detach()
            got = str(t.dtype).replace("torch.", "")
            if t.dtype != torch.float32:
                raise config_error("weights", f"`{name}` must be float32 {list(shape)}, got {got} {list(t.shape)}")
            if tuple(t.shape) != shape:
                raise config_error("weights", f"`{name}` must be float32 {list(shape)}, got float32 {list(t.shape)}")
            if not t.is_contiguous():
                raise config_error("weights", f"`{name}` is not contiguous (call .contiguous() on it)")
            if t.device.type != "cpu":
                t = t.cpu()  # the one copy
            return t.numpy()
        a = value
        if not isinstance(a, np.ndarray):
            raise config_error("weights", f"`{name}`: expected a tensor or a NumPy array, got {type(value).__name__}")
        if a.dtype != np.float32:
            raise config_error("weights", f"`{name}` must be float32 {list(shape)}, got {a.dtype} {list(a.shape)}")
        if tuple(a.shape) != shape:
            raise config_error("weights", f"`{name}` must be float32 {list(shape)}, got float32 {list(a.shape)}")
        if not a.flags.c_contiguous:
            raise config_error("weights", f"`{name}` is not contiguous (np.ascontiguousarray(...) it)")
        return a


# ---- export
def _example(
    space: Optional[Mapping[str, Any]],
    key: Key,
    module: nn.Module,
    lead: Tuple[int, ...] = (),
    batch: int = 2,
    gen: Optional["torch.Generator"] = None,
) -> "torch.Tensor":
    """An example input of the observation's shape, batch of ``batch`` (then the ``lead``
    dimensions: a multi-agent group's agent axis, whose key is given without its group),
    drawn from ``gen`` (torch's global generator when None)."""
    parts = key if isinstance(key, tuple) else tuple(str(key).split("."))
    sub = space
    for p in parts[1:]:
        if sub is None:
            break
        if sub.get("kind") != "dict" or p not in sub.get("spaces", {}):
            raise config_error("policy", f"in_key {key!r}: the env's observation has no entry {p!r}")
        sub = sub["spaces"][p]
    if sub is not None:
        if sub.get("kind") == "dict":
            raise config_error(
                "policy",
                f"in_key {key!r} is a dict observation: read its leaves, (\"observation\", name), one in_key each",
            )
        if sub.get("kind") != "box":
            raise config_error("policy", f"in_key {key!r}: a {sub.get('kind')} observation cannot be an ONNX input")
        shape = tuple(int(s) for s in sub.get("shape", []))
        dtype = {"u8": torch.uint8, "uint8": torch.uint8}.get(str(sub.get("dtype", "f32")), torch.float32)
        if dtype == torch.uint8:
            return torch.randint(0, 255, (batch, *lead, *shape), dtype=torch.uint8, generator=gen)
        return torch.randn(batch, *lead, *shape, generator=gen)
    # No spec: the first Linear's (or recurrent layer's) input size, for a flat observation.
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.RNNBase)):
            return torch.randn(batch, m.in_features if isinstance(m, nn.Linear) else m.input_size, generator=gen)
    raise config_error(
        "policy",
        "cannot tell the observation's shape to export the policy: give env_spec "
        "(the env is not a built-in one and gymnasium could not make it)",
    )


def _inputs(
    in_keys: List[Key],
    state: List[Tuple[Key, Key, Tuple[int, int]]],
    obs: Optional[Mapping[str, Any]],
    policy: nn.Module,
    group: Optional[Tuple[str, int]] = None,
    batch: int = 2,
    gen: Optional["torch.Generator"] = None,
) -> Tuple[List[str], List["torch.Tensor"]]:
    """The ONNX input names of the actor's in_keys and an example of each, batch of
    ``batch`` (drawn from ``gen``): the observations, and with a recurrent module
    ``is_init`` (bool ``[batch, 1]``) and the state tensors (``[batch, layers, hidden]``,
    named as their keys, dotted)."""
    shapes = {_parts(key): shape for key, _, shape in state}
    if state:
        have = {_parts(k) for k in in_keys}
        for key in [_IS_INIT] + [key for key, _, _ in state]:
            if _parts(key) not in have:
                raise config_error(
                    "policy",
                    f"the actor's in_keys {in_keys} lack {key!r}, which its recurrent module reads: another module of "
                    "the actor writes it, and rollout's nodes give it as an input",
                )
    names: List[str] = []
    examples: List["torch.Tensor"] = []
    for key in in_keys:
        if state and _parts(key) == (_IS_INIT,):
            names.append(_IS_INIT)
            examples.append(torch.tensor([[i % 2 == 0] for i in range(batch)]))
        elif _parts(key) in shapes:
            names.append(_key_name(key))
            examples.append(torch.randn(batch, *shapes[_parts(key)], generator=gen))
        elif group is not None:
            names.append(_input_name(key, group[0]))
            examples.append(_example(obs, _parts(key)[1:], policy, lead=(group[1],), batch=batch, gen=gen))
        else:
            names.append(_input_name(key))
            examples.append(_example(obs, key, policy, batch=batch, gen=gen))
    return names, examples


def _group(specs: Optional[Mapping[str, Any]], in_keys: List[Key]) -> Optional[Tuple[str, int]]:
    """The group a multi-agent actor acts for and its agents (``None`` for an env of one
    agent): the group its in_keys read, which must be the env's only group (an env of
    several is :func:`_group_actors`')."""
    agents = (specs or {}).get("agents")
    if not agents:
        return None
    groups = sorted(agents)
    read = {_parts(k)[0] for k in in_keys if len(_parts(k)) > 1}
    g = groups[0]  # several groups: _group_actors
    if read != {g}:
        raise config_error("policy", f"the actor reads {sorted(in_keys, key=str)}; the env's agents are group {g!r}: read ({g!r}, \"observation\")")
    return g, len(agents[g])


def _sample(export: nn.Module, examples: List["torch.Tensor"], guessed: bool = False) -> Tuple["torch.Tensor", ...]:
    """The exported function's outputs on the example inputs; a policy that fails on them is
    a ``ConfigError`` saying why. ``guessed``: the env's spaces were unknown, so the example
    observation is :func:`_example`'s guess; the error says so and has ``guessed`` set."""
    with torch.no_grad():
        try:
            return export(*examples)
        except Exception as e:
            if not guessed:
                raise config_error("policy", f"the policy fails on an observation of the env's shape: {type(e).__name__}: {e}") from e
            shapes = ", ".join(str(list(x.shape)) for x in examples)
            err = config_error(
                "policy",
                f"the policy fails on an example observation of shape {shapes}, guessed from the actor's first "
                f"layer because the env's spaces are unknown in this process: {type(e).__name__}: {e}",
            )
            err.guessed = True
            raise err from e


def _onnx_bytes(export: nn.Module, examples: List["torch.Tensor"], input_names: List[str], output_names: List[str]) -> bytes:
    """The ONNX model of ``export``: every float parameter and buffer its own initializer,
    named as in ``export.state_dict()``.

    torch's exporter merges initializers of equal values in eval mode (two groups' actors
    built from one seed, two LayerNorms at their initial ones and zeros, a noise module's
    ``sigma`` equal to its ``std``): the merged tensor's other names would never be pushed,
    and the nodes would act with the first one's values for the whole run. It merges
    nothing when the initializers are also graph inputs (``keep_initializers_as_inputs``),
    so the model is exported so and the initializers then taken out of the inputs again:
    the model's only inputs are the observations (and a recurrent actor's state)."""
    axes = {n: {0: "batch"} for n in input_names + output_names}
    f = io.BytesIO()
    # The exporter puts the exported module back in the mode of its own flag (the wrapper's:
    # training), which would leave a policy in eval mode (BatchNorm, dropout) in training
    # mode: every module's own mode is put back instead.
    modes = [(m, m.training) for m in export.modules()]
    with warnings.catch_warnings(), _projection_without_branch():
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(
                export,
                tuple(examples),
                f,
                input_names=input_names,
                output_names=output_names,
                dynamic_axes=axes,
                dynamo=False,
                do_constant_folding=False,
                keep_initializers_as_inputs=True,
                opset_version=_OPSET,
            )
        except Exception as e:
            raise config_error("policy", f"torch.onnx.export failed: {type(e).__name__}: {e}") from e
        finally:
            for m, training in modes:
                m.training = training
    return _initializers_not_inputs(f.getvalue())


class _projection_without_branch:
    """While exporting, torchrl's ``safe=True`` projection onto a box (``spec.project`` of a
    ``Bounded``, continuous or discrete: clamp only if a value is out of bounds) clamps
    always, which gives the same values without an ``if`` on the data; a categorical or
    one-hot spec's value is left as it is (the actor's argmax or draw is in the spec by
    construction, and torchrl's projection of one that is not is a random draw no model can
    reproduce). Without torchrl, nothing to do. Not for two exports on two threads at
    once (the patch is the class's)."""

    def __enter__(self) -> "_projection_without_branch":
        try:
            from torchrl.data.tensor_specs import Bounded, TensorSpec
        except ImportError:
            self._spec = None
            return self
        self._spec, self._project = TensorSpec, TensorSpec.project

        def project(spec, val):
            return spec._project(val) if isinstance(spec, Bounded) else val

        TensorSpec.project = project
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._spec is not None:
            self._spec.project = self._project


#: The batch the model is checked at: other than the export's example (2), so that a batch
#: size fixed while tracing shows.
_CHECK_BATCH = 3


def _check_against_module(
    model: bytes, export: nn.Module, inputs: List["torch.Tensor"], input_names: List[str], output_names: List[str]
) -> None:
    """A ``ConfigError`` unless the exported ``model``, in onnxruntime, computes what the
    module computes (in eval mode, as exported; in full float32) on ``inputs``: fresh random
    observations at another batch size than the export's example. A trace keeps one path
    through the module's Python: an ``if`` on a tensor's value, ``len(x)`` or a split along
    the batch (the batch size fixed), a count of values through a boolean mask, would
    otherwise act on the nodes other than the module does, with no error. (A weight read as
    a Python number agrees at export; ``_warn_unexported`` names it.) Skipped, with nothing
    to hold the model to: without onnxruntime in the learner's environment, for a module
    that draws random numbers in its forward pass, and (with a warning) for a model
    onnxruntime cannot load, which the trainer's own trial pass still judges."""
    try:
        import onnxruntime as ort
    except ImportError:
        return
    modes = [(m, m.training) for m in export.modules()]
    tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        export.eval()
        # The nodes compute in float32; a GPU's TF32 would differ by ~1e-3 a layer.
        torch.backends.cuda.matmul.allow_tf32 = False
        with torch.backends.cudnn.flags(enabled=torch.backends.cudnn.enabled, allow_tf32=False):
            want = _sample(export, inputs)
            again = _sample(export, inputs)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        for m, training in modes:
            m.training = training

    def same(a: "torch.Tensor", b: "torch.Tensor") -> bool:
        if torch.is_floating_point(a):
            return bool(torch.allclose(a, b, rtol=0.0, atol=0.0, equal_nan=True))
        return bool(torch.equal(a, b))

    if not all(same(a, b) for a, b in zip(want, again)):
        # A module that draws in its forward pass (torch.randn_like) gives no values to
        # hold the model to; the trainer's trial pass still judges whether it runs.
        return
    first = lambda e: (str(e).strip().splitlines() or [type(e).__name__])[0][:300]  # noqa: E731
    try:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        session = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    except Exception as e:
        warnings.warn(f"rollout: onnxruntime cannot load the exported policy ({first(e)}): it is not checked against the module", stacklevel=5)
        return
    # The model's own inputs: the exporter drops an input the graph does not use.
    takes = {i.name for i in session.get_inputs()}
    try:
        got = session.run(output_names, {n: x.detach().cpu().numpy() for n, x in zip(input_names, inputs) if n in takes})
    except Exception as e:
        raise config_error(
            "policy",
            f"the exported model fails on {_CHECK_BATCH} random observations where the module does not ({first(e)}): "
            "the trace fixed a size the module computes from its input (the batch size: len(x), x.split(1); or a "
            "count of values: an assignment through a boolean mask, as NormalParamExtractor's scale_mapping=\"expln\" "
            "makes): write it with tensor operations (reshape(-1, ...), torch.where)",
        ) from e
    for name, g, w in zip(output_names, got, want):
        w = w.detach().cpu().numpy()
        scale = float(np.nanmax(np.abs(w), initial=0.0, where=np.isfinite(w))) if w.size else 0.0
        if g.shape != w.shape or not np.allclose(g, w, rtol=1e-3, atol=1e-4 * max(1.0, scale), equal_nan=True):
            how = (
                f"{list(g.shape)} where the module gives {list(w.shape)}"
                if g.shape != w.shape
                else f"differs from the module's by up to {float(np.nanmax(np.abs(g.astype(np.float64) - w))):.3g}"
            )
            raise config_error(
                "policy",
                f"the exported model's `{name}` on {_CHECK_BATCH} random observations {how}: the module takes a "
                "path the trace cannot follow (an `if` on a tensor's value, a mask whose count depends on the data), "
                "which the exported model fixes at the example's; write it with tensor operations (torch.where, "
                "torch.clamp)",
            )


def _warn_unexported(exported: "ExportedPolicy", policy: nn.Module) -> None:
    """Warns, naming them, of the policy's float parameters the model does not hold: unused
    ones are harmless, but one read as a Python number (``float(p)``, ``p.item()``,
    ``math.exp(p)``) was baked into the model at its value now, and training it never
    reaches the nodes."""
    pushed = set(exported.name_map.values()) | set(exported.fixed)
    absent = [n for n, p in policy.named_parameters() if p.requires_grad and torch.is_floating_point(p) and n not in pushed]
    if absent:
        shown = ", ".join(f"`{n}`" for n in absent[:5]) + (f" and {len(absent) - 5} more" if len(absent) > 5 else "")
        warnings.warn(
            f"rollout: the exported policy does not hold the parameters {shown}: if the policy reads them as a Python "
            "number (float(p), p.item(), math.exp(p)) their value now is fixed in the model and training them never "
            "reaches the nodes (compute with the tensor instead); if it does not use them, ignore this",
            stacklevel=4,
        )


def _initializers_not_inputs(model: bytes) -> bytes:
    """``model`` without its initializers among the graph's inputs."""
    import onnx

    proto = onnx.load_from_string(model)
    inits = {i.name for i in proto.graph.initializer}
    inputs = [i for i in proto.graph.input if i.name not in inits]
    del proto.graph.input[:]
    proto.graph.input.extend(inputs)
    return proto.SerializeToString()


def _actor_parts(policy: nn.Module):
    """(body modules, probabilistic module or None, in_keys) of a tensordict actor."""
    from tensordict.nn import ProbabilisticTensorDictModule, TensorDictModuleBase, TensorDictSequential

    if isinstance(policy, ProbabilisticTensorDictModule):
        raise config_error("policy", "a distribution alone: give the actor whose modules compute its parameters")
    if isinstance(policy, TensorDictSequential):
        mods = list(policy.module)
        prob = mods[-1] if mods and isinstance(mods[-1], ProbabilisticTensorDictModule) else None
        body = mods[:-1] if prob is not None else mods
        for m in body:
            if isinstance(m, ProbabilisticTensorDictModule):
                raise config_error("policy", "a distribution before the last module: only the last one may sample")
        return body, prob, list(policy.in_keys)
    if isinstance(policy, TensorDictModuleBase):
        return [policy], None, list(policy.in_keys)
    return None


def _action_spec_of(policy: nn.Module) -> Any:
    spec = getattr(policy, "spec", None)
    if spec is None:
        return None
    try:
        if "action" in spec.keys():
            return spec["action"]
    except Exception:  # a bare spec, not a Composite
        return spec
    return None


def _check_action_spec(spec: Any, encoding: Optional[str], action: Optional[Mapping[str, Any]]) -> Optional[str]:
    """The encoding the actor's action spec says (``one_hot``/``index``), checked
    against the distribution's and the env's action."""
    if spec is None:
        return encoding
    kind = type(spec).__name__
    says = "one_hot" if "OneHot" in kind else ("index" if kind in ("Categorical", "DiscreteTensorSpec") else None)
    if says is not None and encoding is not None and says != encoding:
        raise config_error(
            "policy",
            f"the actor's action spec ({kind}) says {says.replace('_', '-')} actions, its distribution {encoding.replace('_', '-')}",
        )
    if action is not None:
        shape = tuple(spec.shape)
        if action.get("kind") == "discrete":
            n = int(action["n"])
            if says == "one_hot" and shape[-1:] != (n,):
                raise config_error("policy", f"the actor's action spec {kind}{list(shape)} does not fit the env's {n} actions")
            space_n = getattr(getattr(spec, "space", None), "n", None)
            if says == "index" and space_n is not None and int(space_n) != n:
                raise config_error("policy", f"the actor's action spec has {space_n} actions, the env {n}")
            if says is None:
                raise config_error("policy", f"the actor's action spec ({kind}) is not discrete, the env's action is")
        elif action.get("kind") == "box":
            want = tuple(int(s) for s in action.get("shape", []))
            if says is not None:
                raise config_error("policy", f"the actor's action spec ({kind}) is discrete, the env's action is a box")
            if want and shape[-len(want):] != want:
                raise config_error("policy", f"the actor's action spec shape {list(shape)} does not fit the env's {list(want)}")
    return says or encoding


def _reads(module: nn.Module) -> set:
    """The groups whose entries a tensordict module reads (``(g, ...)`` in_keys)."""
    return {_parts(k)[0] for k in (getattr(module, "in_keys", None) or []) if len(_parts(k)) > 1}


def _group_actors(policy: nn.Module, specs: Optional[Mapping[str, Any]]) -> Optional[List[Tuple[str, int, nn.Module]]]:
    """``[(group, agents, actor)]`` in group order for an env of several groups, or ``None``
    for an env of one group or one agent. A torchrl user's policy for such an env is one
    actor per group in a ``TensorDictSequential`` (torchrl's multi-agent examples), each
    reading its group's ``(g, "observation")``; rollout's nodes run them as one model
    (PROTOCOL.md §8, Multi-agent)."""
    from tensordict.nn import TensorDictSequential

    agents = (specs or {}).get("agents")
    groups = sorted(agents or {})
    if len(groups) < 2:
        return None
    hint = (
        f"the env has groups {groups}: give one actor per group, TensorDictSequential(actor of "
        f"{groups[0]!r}, actor of {groups[1]!r}, ...), each reading (group, \"observation\") as torchrl's "
        "multi-agent examples build their policy"
    )
    if not isinstance(policy, TensorDictSequential) or len(_reads(policy)) < 2:
        raise config_error("policy", f"{hint}; this one reads {sorted(_reads(policy)) or 'no group'}")
    per: Dict[str, nn.Module] = {}
    for m in policy.module:
        read = _reads(m)
        if len(read) != 1:
            raise config_error("policy", f"{hint}; a {type(m).__name__} of it reads {sorted(read) or 'no group'}")
        g = read.pop()
        if g not in agents:
            raise config_error("policy", f"{hint}; a {type(m).__name__} of it reads group {g!r}, which the env does not have")
        if g in per:
            raise config_error("policy", f"{hint}; two of its modules read group {g!r}")
        per[g] = m
    missing = [g for g in groups if g not in per]
    if missing:
        raise config_error("policy", f"{hint}; no actor reads {missing}")
    return [(g, len(agents[g]), per[g]) for g in groups]


def _export_groups(policy: nn.Module, specs: Mapping[str, Any], actors: List[Tuple[str, int, nn.Module]]) -> ExportedPolicy:
    """One model of every group's actor (PROTOCOL.md §8, Multi-agent): inputs
    ``g.observation`` ``[K, n_g, ...]`` and outputs ``g.<head output>`` group by group, one
    head for all. An actor may sample (``ProbabilisticActor``), act deterministically, or be
    a Q-value actor or a deterministic one under ``AdditiveGaussianModule`` (TD3); a
    recurrent actor, or one with an exploration module the nodes run (``EGreedyModule``,
    ``OrnsteinUhlenbeckProcessModule``), is not served for several agents yet."""
    try:
        from torchrl.modules import EGreedyModule, OrnsteinUhlenbeckProcessModule

        node_run: Tuple[type, ...] = (EGreedyModule, OrnsteinUhlenbeckProcessModule)
    except ImportError:  # pragma: no cover - without torchrl no actor has these
        node_run = ()

    heads, encodings, runs, counts = [], [], [], []
    input_names: List[str] = []
    examples: List["torch.Tensor"] = []
    fresh: List["torch.Tensor"] = []
    gen = torch.Generator().manual_seed(1)
    out_names: List[str] = []
    per_group_names: List[Tuple[str, List[str], Mapping[str, Any]]] = []
    log_prob_keys: List[Tuple[str, Any]] = []
    drop: List[Tuple[str, str]] = []
    for g, n, actor in actors:
        obs, action = specs["observation"]["spaces"][g], specs["action"]["spaces"][g]
        if node_run and any(isinstance(m, node_run) for m in _flat(actor)):
            raise config_error("policy", f"group {g!r}: an exploration module the nodes run is not served in an actor per group yet (one group's Q-value actor under an EGreedyModule is; PROTOCOL.md §8, Multi-agent)")
        off = _off_policy(actor, action)
        prob = None
        encoding: Optional[str] = None
        if off is not None:
            body, head, out, encoding, in_keys = off
            if head == "normal":
                drop += [(g, "loc"), (g, "scale")]
        else:
            parts = _actor_parts(actor)
            if parts is None:
                raise config_error("policy", f"group {g!r}: a plain nn.Module cannot say which group it reads: wrap it in a TensorDictModule")
            body, prob, in_keys = parts
            if prob is None:
                acts = [k for k in actor.out_keys if _parts(k)[-1] == "action"]
                if not acts:
                    raise config_error("policy", f"group {g!r}: a module without a distribution must write ({g!r}, \"action\"); it writes {actor.out_keys}")
                head, out = "deterministic", [(acts[0], None)]
            else:
                head, out, encoding = _head(prob, action)
                encoding = _check_action_spec(_action_spec_of(actor), encoding, action)
        if _recurrent(actor, body):
            raise config_error("policy", f"group {g!r}: a recurrent multi-agent actor is not served yet (PROTOCOL.md §8, Multi-agent)")
        if encoding == "one_hot":
            raise config_error("policy", f"group {g!r}: one-hot actions of several agents are not served: use Categorical (PettingZooWrapper's categorical_actions=True)")
        _check_head_kind(head, action)
        names_g, ex_g = _inputs(in_keys, [], obs, actor, (g, n))
        input_names += names_g
        examples += ex_g
        fresh += _inputs(in_keys, [], obs, actor, (g, n), batch=_CHECK_BATCH, gen=gen)[1]
        counts.append(len(names_g))
        runs.append(_tensordict_run(body, in_keys, out, {}))
        outs_g = [f"{g}.{name}" for name, _ in _outputs(head, out)]
        out_names += outs_g
        per_group_names.append((g, outs_g, action))
        heads.append(head)
        encodings.append(encoding)
        log_prob_keys.append((g, _log_prob_key(prob) if prob is not None else None))
    if len(set(heads)) != 1:
        said = ", ".join(f"{g}: {h}" for (g, _, _), h in zip(actors, heads))
        raise config_error("policy", f"the groups' actors have different heads ({said}): rollout's nodes run one head for every group")

    def run(*xs):
        res: List[Any] = []
        i = 0
        for r, c in zip(runs, counts):
            res.extend(r(*xs[i : i + c]))
            i += c
        return tuple(res)

    device = next((p.device for p in policy.parameters()), torch.device("cpu"))
    examples = [x.to(device) for x in examples]
    export = _Export(policy, run)
    sample = _sample(export, examples)
    i = 0
    for g, names_g, action in per_group_names:
        _check_outputs(heads[0], names_g, sample[i : i + len(names_g)], action)
        i += len(names_g)
    model = _onnx_bytes(export, examples, input_names, out_names)
    _check_against_module(model, export, [x.to(device) for x in fresh], input_names, out_names)
    exported = ExportedPolicy(policy, model, heads[0], next((e for e in encodings if e is not None), None), input_names)
    exported.log_prob_key = log_prob_keys
    exported.drop_keys = tuple(drop)
    return exported


def export_policy(
    policy: nn.Module, specs: Optional[Mapping[str, Any]], exploration_type: Optional[str] = None
) -> ExportedPolicy:
    """Exports ``policy`` for the env whose ``specs`` (PROTOCOL.md §3's
    ``{"observation", "action"}``, or ``None`` when unknown) are given, as it acts under
    the run's ``exploration_type`` (``"random"`` when None, as torchrl's collectors): a
    module that reads it while computing (torchrl's ``NoisyLinear``: its noise only in
    ``RANDOM``) is exported as the collector runs it."""
    with _exploration_of_the_run(exploration_type):
        exported = _export(policy, specs)
    _warn_unexported(exported, policy)
    return exported


class _exploration_of_the_run:
    """torchrl's ``set_exploration_type`` of the run's ``exploration_type`` (a name; None:
    random) while exporting; nothing without torchrl."""

    def __init__(self, name: Optional[str]) -> None:
        self._name = (name or "random").upper()
        self._ctx: Any = None

    def __enter__(self) -> "_exploration_of_the_run":
        try:
            from torchrl.envs.utils import ExplorationType, set_exploration_type
        except ImportError:
            return self
        member = getattr(ExplorationType, self._name, ExplorationType.RANDOM)
        self._ctx = set_exploration_type(member)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._ctx is not None:
            self._ctx.__exit__(*exc)


def _export(policy: nn.Module, specs: Optional[Mapping[str, Any]]) -> ExportedPolicy:
    """``export_policy`` under the run's exploration type."""
    obs = specs.get("observation") if specs else None
    action = specs.get("action") if specs else None
    actors = _group_actors(policy, specs)
    for n, p in policy.state_dict().items():
        if torch.is_floating_point(p) and p.dtype != torch.float32:
            raise config_error("policy", f"`{n}` is {p.dtype}: rollout's ONNX policy runs float32 parameters")
    if actors is not None:
        return _export_groups(policy, specs, actors)
    group = _group(specs, list(getattr(policy, "in_keys", []) or []))
    if group is not None:
        # One agent's spaces of the actor's group (PROTOCOL.md §3, Multi-agent envs).
        obs, action = obs["spaces"][group[0]], action["spaces"][group[0]]

    off = _off_policy(policy, action)
    parts = None if off is not None else _actor_parts(policy)
    recurrent = _recurrent(policy, off[0] if off is not None else parts[0] if parts is not None else [])
    # The next state, after the head's outputs: `next.<name>` per state tensor.
    state = [(key, nxt, shape) for r in recurrent.values() for key, nxt, shape in r.state]
    state_out = [(nxt, None) for _, nxt, _ in state]
    state_names = ["next." + _key_name(key) for key, _, _ in state]
    encoding: Optional[str] = None
    if off is not None:
        body, head, out, encoding, in_keys = off
        out_names = [n for n, _ in _outputs(head, out)]
        run = _tensordict_run(body, in_keys, out + state_out, recurrent)
    elif parts is None:
        # A plain module: observation -> action.
        in_keys = ["observation"]
        head = "deterministic"
        out_names = ["action"]
        module = policy

        def run(x):
            return (module(x),)

    else:
        body, prob, in_keys = parts
        if prob is None:
            if "action" not in [_key_name(k) for k in policy.out_keys]:
                raise config_error("policy", f"a module without a distribution must write `action`; it writes {policy.out_keys}")
            head, out = "deterministic", [("action", None)]
        else:
            head, out, encoding = _head(prob, action)
            encoding = _check_action_spec(_action_spec_of(policy), encoding, action)
        out_names = [n for n, _ in _outputs(head, out)]
        run = _tensordict_run(body, in_keys, out + state_out, recurrent)

    _check_head_kind(head, action)
    if group is not None:
        if state or off is not None and (_exploration.ou_module(_flat(policy)) is not None):
            raise config_error("policy", "a recurrent or exploring multi-agent actor is not served yet (PROTOCOL.md §8, Multi-agent)")
        out_names = [f"{group[0]}.{n}" for n in out_names]
    device = next((p.device for p in policy.parameters()), torch.device("cpu"))
    input_names, examples = _inputs(in_keys, state, obs, policy, group)
    examples = [x.to(device) for x in examples]
    _, fresh = _inputs(in_keys, state, obs, policy, group, batch=_CHECK_BATCH, gen=torch.Generator().manual_seed(1))
    export = _Export(policy, run)
    sample = _sample(export, examples, guessed=obs is None)
    _check_outputs(head, out_names, sample, action)
    model = _onnx_bytes(export, examples, input_names, out_names + state_names)
    _check_against_module(model, export, [x.to(device) for x in fresh], input_names, out_names + state_names)
    ou = _exploration.ou_module(_flat(policy)) if off is not None else None
    greedy = _exploration.egreedy_module(_flat(policy)) if off is not None and head == "qvalue" else None
    explorer = ou if ou is not None else greedy
    if explorer is not None:
        eps_name = _exploration.eps_buffer_name(policy, explorer)
        out = _exploration.EPS_OUTPUT if ou is not None else _exploration.EGREEDY_EPS_OUTPUT
        model = _exploration.with_eps_output(model, eps_name, float(explorer.eps), out)
    exported = ExportedPolicy(policy, model, head, encoding, input_names)
    exported.state = [(_key_name(key), shape) for key, _, shape in state]
    if parts is not None and parts[1] is not None:
        exported.log_prob_key = _log_prob_key(parts[1])
    if off is not None:
        # torchrl's batch has what the actor writes: a Q-value actor's `action_value` and
        # `chosen_action_value` (the qvalue head records them); a TD3 actor's noise
        # parameters are rollout's own.
        exported.drop_keys = {"qvalue": (), "normal": ("loc", "scale"), "deterministic": ()}[head]
    if greedy is not None:
        exported.exploration = {"kind": "epsilon_greedy", "eps": eps_name}
    if ou is not None:
        d = int(sample[0].shape[-1])
        exported.exploration = _exploration.ou_config(ou, eps_name, d)
        exported.state += _exploration.ou_state(d)
        # torchrl's collectors leave private keys (`_ou_prev_noise`, `_ou_steps`) out of
        # their batches; rollout's Batch keeps them.
        exported.drop_keys = _exploration.PRIVATE_KEYS
    if head in ("categorical", "qvalue"):
        exported.n_actions = int(sample[0].shape[-1])
    return exported


def _flat(module: nn.Module) -> List[nn.Module]:
    """The leaf modules of nested ``TensorDictSequential`` s, in order."""
    from tensordict.nn import TensorDictSequential

    if isinstance(module, TensorDictSequential):
        return [leaf for m in module.module for leaf in _flat(m)]
    return [module]


def _off_policy(policy: nn.Module, action: Optional[Mapping[str, Any]] = None):
    """``(body, head, out, encoding, in_keys)`` of an off-policy actor, the way the
    nodes run it, or ``None`` for any other policy:

    - a ``QValueModule`` (DQN's ``QValueActor``): the ``qvalue`` head over its action
      values (the nodes take the argmax and record ``action_value`` and
      ``chosen_action_value`` as the module writes them); followed by an
      ``EGreedyModule``, which the nodes run themselves (``epsilon_greedy``, its ``eps``
      a weight; ``ExplorationType.DETERMINISTIC`` turns it off, as in torchrl);
    - an ``AdditiveGaussianModule`` after a deterministic actor (TD3): the ``normal``
      head with ``loc`` the action plus ``mean * sigma`` and ``scale`` ``std * sigma``,
      clipped to the action's bounds;
    - an ``OrnsteinUhlenbeckProcessModule`` after a deterministic actor (DDPG): the
      ``deterministic`` head of the actor without it; the nodes run the module itself,
      with its noise per env (``_exploration``: the config and ``eps`` as a weight).

    ``eps`` and ``sigma`` are the modules' buffers, so they are initializers of the model
    pushed by ``update_policy_weights_()``: the annealing done by the module's ``step()``
    in the learner reaches the nodes with the weights, as it does in torchrl."""
    try:
        from torchrl.modules import AdditiveGaussianModule, EGreedyModule, OrnsteinUhlenbeckProcessModule, QValueModule
    except ImportError:  # pragma: no cover - without torchrl no actor has these
        return None
    from tensordict.nn import TensorDictSequential

    if not isinstance(policy, TensorDictSequential):
        return None
    mods = _flat(policy)
    explorers = (EGreedyModule, AdditiveGaussianModule, OrnsteinUhlenbeckProcessModule)
    for i, m in enumerate(mods):
        if isinstance(m, explorers) and i != len(mods) - 1:
            raise config_error("policy", f"{type(m).__name__} must be the actor's last module (it acts on the action)")
    explore = mods[-1] if isinstance(mods[-1], explorers) else None
    rest = mods[:-1] if explore is not None else mods
    q = rest[-1] if rest and isinstance(rest[-1], QValueModule) else None
    if q is None and explore is None:
        return None
    in_keys = list(policy.in_keys)
    if isinstance(explore, OrnsteinUhlenbeckProcessModule):
        _exploration.check_ou(explore, q is not None, action)
        return rest, "deterministic", [(explore.ou.key, None)], None, in_keys
    if q is not None:
        if getattr(q, "action_mask_key", None) is not None or getattr(explore, "action_mask_key", None) is not None:
            raise config_error("policy", "an action mask: rollout's nodes draw from every action")
        if isinstance(explore, AdditiveGaussianModule):
            raise config_error("policy", "AdditiveGaussianModule on a Q-value actor: use EGreedyModule for discrete actions")
        space = str(getattr(q, "action_space", "one_hot")).replace("-", "_")
        encoding = "one_hot" if space == "one_hot" else "index"
        return rest[:-1], "qvalue", [(q.action_value_key, None)], encoding, in_keys
    if isinstance(explore, EGreedyModule):
        raise config_error("policy", "EGreedyModule after an actor without a QValueModule: rollout's nodes run it on Q-value actors")
    noise = explore
    key = noise.action_key
    try:
        spec = noise.spec[key]
    except (KeyError, TypeError, AttributeError, RuntimeError):
        spec = None
    box = getattr(spec, "space", None)
    if box is not None and getattr(box, "low", None) is not None:
        # torchrl projects the noisy action onto the module's spec; the nodes clip it to the
        # env's bounds.
        _check_clip_bounds("AdditiveGaussianModule's spec", box.low, box.high, action)
    return (
        rest,
        "normal",
        [(key, lambda a: a + noise.mean * noise.sigma), (key, lambda a: torch.ones_like(a) * (noise.std * noise.sigma).clamp_min(1e-12))],
        None,
        in_keys,
    )


def _log_prob_key(prob: nn.Module) -> Any:
    """The key the probabilistic module writes its sample's log-probability under, or
    ``None`` when it writes none (``return_log_prob=False``)."""
    if not getattr(prob, "return_log_prob", False):
        return None
    keys = getattr(prob, "log_prob_keys", None)
    key = keys[0] if keys else getattr(prob, "log_prob_key", None)
    return key if key is not None else "action_log_prob"


def _outputs(head: str, out: List[Tuple[Key, Any]]) -> List[Tuple[str, Any]]:
    names = {
        "categorical": ["logits"],
        "qvalue": ["action_value"],
        "normal": ["loc", "scale"],
        "tanh_normal": ["loc", "scale"],
        "deterministic": ["action"],
    }[head]
    return list(zip(names, out))


def _head(prob: nn.Module, action: Optional[Mapping[str, Any]]):
    """(head, [(td key, transform)], encoding) for a probabilistic module."""
    cls = prob.distribution_class
    name = getattr(cls, "__name__", str(cls))
    kwargs = dict(getattr(prob, "distribution_kwargs", {}) or {})
    params = {}
    for dist_key, td_key in zip(prob.dist_keys, prob.in_keys):
        params[dist_key[-1] if isinstance(dist_key, tuple) else dist_key] = td_key
    if name in _CATEGORICAL:
        if "logits" in params:
            return "categorical", [(params["logits"], None)], _CATEGORICAL[name]
        if "probs" in params:
            return "categorical", [(params["probs"], torch.log)], _CATEGORICAL[name]
        raise config_error("policy", f"{name} without `logits` or `probs` parameters ({list(params)})")
    if name in _NORMAL or name in _TANH_NORMAL:
        if set(params) != {"loc", "scale"}:
            raise config_error("policy", f"{name} must take `loc` and `scale`, it takes {list(params)}")
        loc_f = None
        if name in _TANH_NORMAL:
            _check_tanh_bounds(name, kwargs, action)
            if kwargs.get("tanh_loc", False):
                up = float(kwargs.get("upscale", 5.0))
                loc_f = lambda v: up * torch.tanh(v / up)  # noqa: E731 - TanhNormal's own tanh_loc
        head = "tanh_normal" if name in _TANH_NORMAL else "normal"
        safe = _safe_box(prob)
        if safe is not None:
            # torchrl clamps the drawn action to the spec; the nodes clip it to the env's box.
            _check_clip_bounds("the actor is safe=True with an action spec whose", safe[0], safe[1], action)
        return head, [(params["loc"], loc_f), (params["scale"], None)], None
    if name in _DELTA:
        key = params.get("param")
        if key is None:
            raise config_error("policy", f"{name} must take `param`")
        f = None
        if name == "TanhDelta":
            low, high = _tanh_bounds(kwargs)
            c, h = (high + low) / 2, (high - low) / 2
            # torchrl's TanhDelta shifts its parameter by the box's centre before the tanh
            # (`update`: param + (high - low) / 2 + low), then maps tanh's [-1, 1] onto the box.
            f = lambda v: c.to(v.device) + h.to(v.device) * torch.tanh(v + c.to(v.device))  # noqa: E731
        safe = _safe_box(prob)
        if safe is not None:
            # safe=True: torchrl projects the action onto the spec (a clamp; the same numbers
            # as its clamp of only the values out of bounds).
            inner, (s_low, s_high) = f, safe
            f = lambda v: torch.clamp(v if inner is None else inner(v), s_low.to(v.device), s_high.to(v.device))  # noqa: E731
        return "deterministic", [(key, f)], None
    raise config_error(
        "policy",
        f"distribution {name} has no ONNX head: rollout runs Categorical, OneHotCategorical, Normal, "
        "IndependentNormal, TanhNormal, Delta and TanhDelta",
    )


def _check_clip_bounds(what: str, low: "torch.Tensor", high: "torch.Tensor", action: Optional[Mapping[str, Any]]) -> None:
    """A ``ConfigError`` unless ``low``/``high`` (a spec torchrl clamps a drawn action to) are
    the env's action bounds, which the nodes clip it to."""
    if action is None or action.get("kind") != "box":
        return
    env_low, env_high = _box_bounds(action)
    d = env_low.size
    lo, hi = (b.detach().cpu().double().numpy().reshape(-1) for b in (low, high))
    # A spec of one value, of one agent's action, or of every agent's ([n, d]) rows.
    same = lo.size == hi.size and (lo.size == 1 or lo.size % d == 0)
    if same:
        rows = lambda b: b.reshape(-1, 1) if b.size == 1 else b.reshape(-1, d)  # noqa: E731
        same = np.allclose(rows(lo), env_low, atol=1e-6) and np.allclose(rows(hi), env_high, atol=1e-6)
    if not same:
        raise config_error(
            "policy",
            f"{what} bounds low={lo.tolist()} high={hi.tolist()} are not the env's low={env_low.tolist()} "
            f"high={env_high.tolist()}: rollout's nodes clip a drawn action to the env's bounds; give it the env's action spec",
        )


def _safe_box(prob: nn.Module) -> Optional[Tuple["torch.Tensor", "torch.Tensor"]]:
    """The bounds a ``safe=True`` probabilistic module (torchrl's ``SafeProbabilisticModule``,
    a ``ProbabilisticActor(spec=..., safe=True)``) projects its action onto, when its spec
    for the action is a continuous box; None otherwise (a discrete action is in its spec by
    construction)."""
    if not getattr(prob, "safe", False):
        return None
    try:
        from torchrl.data.tensor_specs import BoundedContinuous

        spec = prob.spec[prob.out_keys[0]]
    except (ImportError, KeyError, IndexError, TypeError, AttributeError):
        return None
    if not isinstance(spec, BoundedContinuous):
        return None
    return spec.space.low.detach().float(), spec.space.high.detach().float()


def _tanh_bounds(kwargs: Mapping[str, Any]):
    low = kwargs.get("low", kwargs.get("min", -1.0))
    high = kwargs.get("high", kwargs.get("max", 1.0))
    to_t = lambda v: v.detach().float() if isinstance(v, torch.Tensor) else torch.tensor(float(v))  # noqa: E731
    return to_t(low), to_t(high)


def _check_tanh_bounds(name: str, kwargs: Mapping[str, Any], action: Optional[Mapping[str, Any]]) -> None:
    """TanhNormal's low/high must be the env's action bounds (the nodes squash to those)."""
    if action is None:
        return
    if action.get("kind") != "box":
        raise config_error("policy", f"{name} draws continuous actions, the env's action is {action.get('kind')}")
    env_low, env_high = _box_bounds(action)
    d = len(env_low)
    low = _bound_array(kwargs.get("low", kwargs.get("min", -1.0)), d)
    high = _bound_array(kwargs.get("high", kwargs.get("max", 1.0)), d)
    # Where a bound is infinite the nodes use c = 0, h = 1: TanhNormal's own default.
    want_low = np.where(np.isfinite(env_low) & np.isfinite(env_high), env_low, -1.0)
    want_high = np.where(np.isfinite(env_low) & np.isfinite(env_high), env_high, 1.0)
    if not (np.allclose(low, want_low, atol=1e-6) and np.allclose(high, want_high, atol=1e-6)):
        raise config_error(
            "policy",
            f"{name}'s bounds low={low.tolist()} high={high.tolist()} are not the env's action bounds "
            f"low={want_low.tolist()} high={want_high.tolist()} (distribution_kwargs low/high)",
        )


def _check_head_kind(head: str, action: Optional[Mapping[str, Any]]) -> None:
    """The head draws the kind of action the env takes (when it is known)."""
    kind = action.get("kind") if action else None
    if kind is None:
        return
    if head in ("categorical", "qvalue") and kind != "discrete":
        what = "a categorical actor" if head == "categorical" else "a Q-value actor"
        raise config_error("policy", f"{what} for an env whose action is a {kind}")
    if head in ("normal", "tanh_normal") and kind != "box":
        raise config_error("policy", f"a {head} actor for an env whose action is {kind}")


def _check_outputs(head: str, names: List[str], sample: Tuple["torch.Tensor", ...], action: Optional[Mapping[str, Any]]) -> None:
    """The outputs fit the env's action in size and type (the head's kind of action
    was checked before the module ran)."""
    for n, v in zip(names, sample):
        if not isinstance(v, torch.Tensor):
            raise config_error("policy", f"output `{n}` is {type(v).__name__}, not a tensor")
    if action is None:
        return
    kind = action.get("kind")
    first = sample[0]
    if head in ("categorical", "qvalue"):
        if first.shape[-1] != int(action["n"]):
            name = "logits" if head == "categorical" else "action_value"
            raise config_error("policy", f"output `{name}` has {first.shape[-1]} entries, the env {action['n']} actions")
    elif head in ("normal", "tanh_normal"):
        d = int(np.prod(action.get("shape") or [1]))
        if first.shape[-1] != d:
            raise config_error("policy", f"output `loc` has {first.shape[-1]} entries, the env's action {d}")
    else:
        if kind == "discrete" and torch.is_floating_point(first):
            raise config_error("policy", "output `action` is float, the env's action discrete: return integer indices")
        if kind == "box" and not torch.is_floating_point(first):
            raise config_error("policy", "output `action` is integer, the env's action a box")
