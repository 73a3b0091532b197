"""The ``onnx`` policy end to end on Python nodes driven by the real trainer: ``rollout
collect --launcher process --node-command '<python> -m rollout_node' --policy onnx
--policy-file F --onnx-head H`` writes every batch (``--output``), and every frame's action
and ``action_log_prob`` are what the torch module and torch.distributions say of its
observation; through ``import rollout``, a weight update pushed from the module's state_dict
mid-run changes the actions from the batch that says the new version."""

import os
import pathlib
import subprocess
import sys

import msgpack
import numpy as np
import pytest
import torch

import onnx_models as om
from rollout_node.policy import ActionSpace
from test_onnx_policy import CASES, case, check_against_torch

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
DEADLINE = 300


def rollout_bin():
    """The release binary scripts/test.sh builds (or ``$ROLLOUT_BIN``); skips without one."""
    path = os.environ.get("ROLLOUT_BIN") or str(ROOT / "target" / "release" / "rollout")
    if not os.path.exists(path):
        pytest.skip(f"no rollout binary at {path} (scripts/test.sh builds it)")
    return path


def onnx_trainer():
    """The binary, when its ``collect`` takes ``--policy onnx --policy-file F --onnx-head H``."""
    exe = rollout_bin()
    help_ = subprocess.run([exe, "collect", "--help"], capture_output=True, timeout=60).stdout.decode()
    if "--onnx-head" not in help_:
        pytest.skip(f"{exe} has no `--onnx-head` (a trainer without the onnx policy)")
    return exe


def records(path):
    """The ``--output`` records as ``(weights_version, {key: array})`` (docs/cli.md)."""
    out = []
    with open(path, "rb") as f:
        for r in msgpack.Unpacker(f, raw=False):
            data = {}
            for k, t in r["data"].items():
                dt = {"f32": np.float32, "f64": np.float64, "i64": np.int64, "u8": np.uint8, "bool": np.bool_}[t["dtype"]]
                data[k] = np.frombuffer(t["data"], dt).reshape(t["shape"])
            out.append((r["weights_version"], data))
    return out


def frames(data, key, batch_dims):
    a = data[key]
    return a.reshape((-1,) + a.shape[batch_dims:])


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_trainer_collects_the_modules_actions_and_log_probs_on_python_nodes(tmp_path, name):
    exe = onnx_trainer()
    m, model, head, env = case(name)
    f = tmp_path / "actor.onnx"
    f.write_bytes(model)
    out = tmp_path / "out.msgpack"
    node = f"{sys.executable} -m rollout_node --import image_env"
    cmd = [exe, "collect", "--launcher", "process", "--env", env, "--quiet", "--seed", "5",
           "--node-command", node, "--output", str(out), "--sync", "--nodes", "2", "--envs-per-node", "2",
           "--policy", "onnx", "--policy-file", str(f), "--onnx-head", head,
           "--exploration-type", "deterministic", "--record", "true", "--frames-per-batch", "200", "--total-frames", "1000"]
    env_vars = dict(os.environ, PYTHONPATH=str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run(cmd, capture_output=True, timeout=DEADLINE, env=env_vars)
    assert r.returncode == 0, r.stderr.decode()
    import gymnasium as gym

    action = ActionSpace.of(gym.make(env).action_space)
    probe = _probe(model, head, env, action)
    recs = records(out)
    assert sum(frames(d, "action", 3).shape[0] for _, d in recs) == 1000
    for _, d in recs:  # sync: [nodes, envs, T]
        obs, act = frames(d, "observation", 3), frames(d, "action", 3)
        rec = {k: frames(d, k, 3) for k in probe.recorded_layout()}
        check_against_torch(m, head, probe, obs, act, rec)


def _probe(model, head, env, action):
    """An OnnxPolicy of the same model, for its recorded keys and exploration."""
    import gymnasium as gym

    from rollout_node import spaces
    from rollout_node.onnx_policy import OnnxPolicy

    e = gym.make(env)
    leaves = spaces.leaves(spaces.specs(e.observation_space, e.action_space)["observation"])
    return OnnxPolicy({"config": {"kind": "onnx", "model": model, "head": head}, "exploration": "deterministic"}, leaves, action, 0)


def test_a_weight_update_from_the_state_dict_changes_the_actions_from_its_version(tmp_path):
    onnx_trainer()
    rollout = pytest.importorskip("rollout", reason="the rollout module (python/collector; scripts/test.sh builds it)")
    import copy

    import gymnasium as gym

    m, model, head, env = case("categorical")
    probe = _probe(model, head, env, ActionSpace.of(gym.make(env).action_space))
    f = tmp_path / "actor.onnx"
    f.write_bytes(model)
    learned = copy.deepcopy(m)
    om.perturb(learned, 11)
    modules = {0: m, 1: learned}
    seen, changed = [], False
    with rollout.DistributedCollector(
        env, "onnx", policy_file=str(f), onnx_head=head,
        frames_per_batch=100, total_frames=4000, nodes=1, envs_per_node=2, launcher="process",
        node_command=[sys.executable, "-m", "rollout_node"], exploration_type="deterministic", record=True, seed=3,
    ) as collector:
        for i, batch in enumerate(collector):
            v = batch.weights_version
            seen.append(v)
            obs = batch["observation"].reshape(-1, 4)
            act = batch["action"].reshape(-1)
            rec = {k: batch[k].reshape((obs.shape[0],) + batch[k].shape[2:]) for k in probe.recorded_layout()}
            # Every frame of a batch is the module of the version it says.
            check_against_torch(modules[v], head, probe, obs, act, rec)
            if i == 1:
                sd = {k: t.detach().numpy().copy() for k, t in learned.state_dict().items()}
                assert collector.update_policy_weights_(sd) == 1
            if v == 1:
                with torch.no_grad():
                    before = m(torch.from_numpy(obs)).argmax(-1).numpy()
                changed = changed or bool((before != act).any())
                if len(seen) > 6:
                    break
    assert seen[:2] == [0, 0] and 1 in seen and seen == sorted(seen), seen
    assert changed, "the new weights' actions never differed from the old ones'"
