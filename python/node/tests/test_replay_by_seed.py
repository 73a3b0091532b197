"""``python -m rollout_node.replay FILE --env ID --seed S``: an ``--output`` file of any env,
written here from the node's own batches as the trainer records them (sync: the nodes' shares
stacked, ``[nodes, E, T, ...]``; async: one node's ``[E, T, ...]`` with its index), replays
by seed, and a frame that is not gymnasium's is named."""

import msgpack
import pytest

import spaces_env  # noqa: F401  (registers DictSpaces-v0)
from rollout_node import wire
from rollout_node.collect import Workers
from rollout_node.replay import main
from rollout_node.replay_by_seed import check_by_seed
from test_any_env import SEED, spec

_WIRE = {"float32": "f32", "float64": "f64", "int64": "i64", "bool": "bool", "uint8": "u8"}


def write(path, batches, node=None):
    """An ``--output`` file of ``batches``: async records of ``node``, else sync ones (one node)."""
    with open(path, "wb") as f:
        for i, b in enumerate(batches):
            data = {k: wire.to_tensor(v if node is not None else v[None], _WIRE[v.dtype.name]) for k, v in b.items()}
            f.write(msgpack.packb({"batch": i, "node": node, "weights_version": 0, "data": data}, use_bin_type=True))


def test_a_pong_run_of_a_nodes_own_records_replays_by_seed(tmp_path):
    pytest.importorskip("ale_py")
    config = {"max_episode_steps": 20}
    w = Workers(spec("ALE/Pong-v5", 2, config))
    write(tmp_path / "out", [w.collect(2 * 15) for _ in range(2)], node=1)
    # Node 1's rows are rows 2 and 3 of the run: seeded SEED + 0 and + 1 here, so the chain began at SEED - 2.
    assert check_by_seed(tmp_path / "out", "ALE/Pong-v5", SEED - 2, config) == ([], 60)
    problems, _ = check_by_seed(tmp_path / "out", "ALE/Pong-v5", SEED, config)
    assert len(problems) == 2 and problems[0].startswith("row 2 frame "), problems
    w.close()


def test_max_frames_per_traj_cuts_are_replayed_when_given(tmp_path):
    pytest.importorskip("mujoco")
    w = Workers(spec("HalfCheetah-v5", 2, max_frames_per_traj=7))
    write(tmp_path / "out", [w.collect(2 * 10) for _ in range(2)])
    assert check_by_seed(tmp_path / "out", "HalfCheetah-v5", SEED, None, 7) == ([], 40)
    problems, _ = check_by_seed(tmp_path / "out", "HalfCheetah-v5", SEED)
    assert problems[0] == "row 0 frame 6: terminated, truncated (False, True), gymnasium gives (False, False)", problems
    w.close()


def test_the_command_replays_a_dict_env_and_names_a_wrong_reward(tmp_path, capsys):
    config = {"action": "multi_discrete"}
    w = Workers(spec("DictSpaces-v0", 3, config))
    batches = [w.collect(3 * 20) for _ in range(2)]
    write(tmp_path / "out", batches)
    args = [str(tmp_path / "out"), "--env", "DictSpaces-v0", "--seed", str(SEED), "--env-config", '{"action": "multi_discrete"}']
    assert main(args) == 0
    assert "120 frames replay through gymnasium DictSpaces-v0 by seed" in capsys.readouterr().out
    batches[1]["next.reward"][2, 4, 0] += 0.01
    write(tmp_path / "out", batches)
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "row 2 frame 24: reward" in err and "1 rows do not replay" in err, err
    w.close()
