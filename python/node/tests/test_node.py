"""The Python node against a scripted trainer: a whole session, bad input of every kind,
a trainer that vanishes or goes silent, supervision of an env that raises."""

import os
import queue
import signal
import threading
import time

import gymnasium as gym
import numpy as np
import pytest

from conftest import DEADLINE, Trainer, linear_weights, node_spec, packb, prefix, tensors
from rollout_node import wire
from rollout_node.collect import restart_seed


def test_a_session_collects_exact_batches_and_ends_on_shutdown(trainer):
    trainer.start_node()
    w = linear_weights(2, 4, version=3)
    ready = trainer.join(node_spec(max_frames_per_traj=9), weights=w)
    assert ready["type"] == "ready" and ready["node"] == 0
    assert ready["layout"]["observation"] == ["f32", [4]]
    assert ready["layout"]["action"] == ["i64", []]
    trainer.send({"type": "continue", "seq": 1, "frames": 40})
    b = trainer.recv()
    assert (b["type"], b["seq"], b["weights_version"]) == ("batch", 1, 3)
    assert b["data"]["batch_size"] == [2, 20]
    t = tensors(b)
    assert t["observation"].shape == (2, 20, 4) and t["action"].shape == (2, 20)
    # Deterministic linear: argmax(W x + b) of every recorded observation.
    W = wire.from_tensor(w["tensors"]["weight"]).astype(np.float64)
    bias = wire.from_tensor(w["tensors"]["bias"]).astype(np.float64)
    expected = np.argmax(t["observation"].astype(np.float64) @ W.T + bias, axis=-1)
    assert (t["action"] == expected).all()
    # Lanes: worker w's ids are w, w + lanes, ...; step counts start at 0; cut at 9 frames.
    ids = t["collector.traj_ids"]
    assert set(ids[0]) <= {0, 2, 4, 6, 8} and set(ids[1]) <= {1, 3, 5, 7, 9}
    assert t["step_count"][0, 0, 0] == 0 and t["step_count"].max() <= 8
    assert t["next.truncated"][t["step_count"] == 8].all()
    trainer.send({"type": "seed", "seed": 100})
    assert trainer.recv() == {"type": "seeded", "node": 0, "next_seed": 102}
    trainer.send({"type": "shutdown"})
    assert trainer.recv() == {"type": "down", "node": 0}
    assert trainer.finish()[0] == 0


def test_unknown_fields_are_ignored(trainer):
    trainer.start_node()
    trainer.join(node_spec(), weights=linear_weights(2, 4), extra={"future_field": [1, 2]})
    trainer.send({"type": "continue", "seq": 4, "frames": 2, "priority": "high"})
    assert trainer.recv()["seq"] == 4
    trainer.send({"type": "shutdown", "why": "done"})
    assert trainer.recv()["type"] == "down"
    assert trainer.finish()[0] == 0


def test_a_malformed_frame_closes_the_node_with_a_protocol_error(trainer):
    trainer.start_node()
    trainer.join(node_spec(), weights=linear_weights(2, 4))
    body = b"\xc1\xc1\xc1"  # 0xc1 is never valid MessagePack
    trainer.send_raw(prefix(len(body)) + body)
    code, err = trainer.finish()
    assert code == 1 and "error: protocol error: a frame that is not MessagePack" in err, err


def test_a_frame_of_a_mistyped_field_is_a_protocol_error(trainer):
    trainer.start_node()
    trainer.join(node_spec(), weights=linear_weights(2, 4))
    trainer.send({"type": "continue", "seq": "seven", "frames": 2})
    code, err = trainer.finish()
    assert code == 1 and "field `seq` is missing or mistyped" in err, err


def test_an_oversized_prefix_is_refused_before_its_body(trainer):
    trainer.start_node()
    trainer.join(node_spec(), weights=linear_weights(2, 4), max_frame=1000)
    trainer.send_raw(prefix(1001))  # no body follows: the node must not wait for it
    code, err = trainer.finish()
    assert code == 1 and "a frame of 1001 bytes (the limit is 1000" in err, err


def test_an_oversized_frame_before_welcome_is_refused(trainer):
    trainer.start_node()
    trainer.accept()
    assert trainer.recv()["type"] == "hello"
    trainer.send_raw(prefix((256 << 20) + 1))  # over the default max_frame, no body follows
    code, err = trainer.finish()
    assert code == 1 and "protocol error: a frame of 268435457 bytes" in err, err


def test_weights_of_the_wrong_shape_fail_the_node_with_the_reason(trainer):
    trainer.start_node()
    trainer.join(node_spec(), weights=linear_weights(2, 4))
    trainer.send({"type": "update_weights", "weights": linear_weights(3, 4, version=1)})
    f = trainer.recv()
    assert f["type"] == "failed" and "`weight` must be f32 [2, 4], got f32 [3, 4]" in f["reason"], f
    code, err = trainer.finish()
    assert code == 1 and "bad weights" in err


def test_a_welcome_without_weights_is_ready_and_a_continue_before_any_weights_fails_it(trainer):
    trainer.start_node()
    ready = trainer.join(node_spec(), weights=None)  # the trainer learns the specs from `ready`
    assert ready["type"] == "ready" and ready["specs"]["action"] == {"kind": "discrete", "n": 2}, ready
    trainer.send({"type": "continue", "seq": 1, "frames": 2})
    f = trainer.recv()
    assert f["type"] == "failed" and "no weights for the `linear` policy before the first `continue`" in f["reason"], f
    assert "never invents weights" in f["reason"]
    assert trainer.finish()[0] == 1


def test_a_welcome_without_weights_waits_for_version_0_in_an_update(trainer):
    trainer.start_node()
    assert trainer.join(node_spec(), weights=None)["type"] == "ready"
    trainer.send({"type": "update_weights", "weights": linear_weights(2, 4, version=0)})
    assert trainer.recv() == {"type": "weights_updated", "node": 0, "version": 0}
    trainer.send({"type": "continue", "seq": 1, "frames": 4})
    b = trainer.recv()
    assert (b["type"], b["seq"], b["weights_version"]) == ("batch", 1, 0), b
    trainer.send({"type": "shutdown"})
    assert trainer.recv()["type"] == "down"
    assert trainer.finish()[0] == 0


def test_welcome_weights_of_the_wrong_shape_fail_the_node_at_once(trainer):
    trainer.start_node()
    f = trainer.join(node_spec(), weights=linear_weights(2, 5))
    assert f["type"] == "failed" and "`weight` must be f32 [2, 4], got f32 [2, 5]" in f["reason"], f
    assert trainer.finish()[0] == 1


def test_a_trainer_that_vanishes_ends_the_node_with_exit_1(trainer):
    trainer.start_node()
    trainer.join(node_spec(), weights=linear_weights(2, 4))
    # The file made of the socket holds it open: close both, or the node only hears the
    # silence (after the heartbeat timeout), not the close.
    trainer.rfile.close()
    trainer.sock.close()
    code, err = trainer.finish()
    assert code == 1 and "error: lost the trainer" in err, err


def test_a_trainer_that_goes_silent_is_given_up_after_the_timeout(trainer):
    trainer.start_node()
    trainer.join(node_spec(), weights=linear_weights(2, 4), heartbeat_ms=50, timeout_ms=500)
    # The trainer sends nothing more (no heartbeats) but keeps the connection open.
    code, err = trainer.finish()
    assert code == 1 and "silent for more than 500 ms" in err, err


def test_heartbeats_keep_coming_while_a_large_batch_is_collected(trainer):
    trainer.start_node()
    trainer.join(node_spec(policy={"config": {"kind": "random"}}), heartbeat_ms=20)
    trainer.send({"type": "continue", "seq": 1, "frames": 100_000})  # seconds of stepping
    beats = 0
    while True:
        f = trainer.recv(skip_heartbeats=False)
        if f["type"] == "heartbeat":
            beats += 1
        else:
            break
    assert f["type"] == "batch" and f["data"]["batch_size"] == [2, 50_000]
    assert beats >= 3, f"only {beats} heartbeats while 100000 frames were collected"
    trainer.send({"type": "shutdown"})
    assert trainer.recv()["type"] == "down"


def _collect_frames(trainer):
    """A thread reading every frame the node sends into a queue of ``(arrival time, frame)``,
    then ``(time, None)`` once the connection is closed."""
    frames = queue.Queue()

    def read():
        while True:
            try:
                f = trainer.recv(skip_heartbeats=False)
            except (EOFError, OSError, ValueError):
                frames.put((time.monotonic(), None))
                return
            frames.put((time.monotonic(), f))

    threading.Thread(target=read, daemon=True).start()
    return frames


def _next_frame(frames, deadline):
    try:
        at, f = frames.get(timeout=max(deadline - time.monotonic(), 0.001))
    except queue.Empty:
        pytest.fail("no frame from the node before the deadline")
    assert f is not None, "the node closed the connection"
    return at, f


def test_the_node_answers_the_trainers_heartbeats_and_beats_alone_when_they_stop(trainer):
    h = 0.4  # heartbeat_ms 400
    trainer.start_node()
    trainer.join(node_spec(), weights=linear_weights(2, 4), heartbeat_ms=int(h * 1000))
    frames = _collect_frames(trainer)
    # The node's first own beat sets its phase; the trainer beats 0.3 intervals after it, so
    # a node on a timer of its own phase beats 0.7 intervals after each trainer beat.
    at, f = _next_frame(frames, time.monotonic() + DEADLINE)
    assert f["type"] == "heartbeat", f
    beats = [at]
    sent = []
    for k in range(8):
        pause = at + 0.3 * h + k * h - time.monotonic()
        if pause > 0:
            time.sleep(pause)  # pacing the trainer's beats
        sent.append(time.monotonic())
        trainer.send({"type": "heartbeat"})
    # The trainer stops beating: the node beats alone, 1.25 intervals apart.
    deadline = time.monotonic() + DEADLINE
    while sum(t > sent[-1] + h / 2 for t in beats) < 4:
        t, f = _next_frame(frames, deadline)
        assert f["type"] == "heartbeat", f
        beats.append(t)
    # After the first two trainer beats, each is answered within half an interval, once.
    answered = [t for t in beats if sent[2] <= t < sent[-1] + h / 2]
    for t in answered:
        assert any(s <= t < s + h / 2 for s in sent[2:]), (
            f"a node heartbeat {t - sent[2]:.3f} s after the third trainer beat is no answer to one "
            f"(trainer beats at {[round(s - sent[2], 3) for s in sent[2:]]})"
        )
    counts = [sum(s <= t < s + h / 2 for t in answered) for s in sent[2:]]
    assert counts == [1] * len(sent[2:]), f"node heartbeats per trainer beat: {counts}"
    alone = [answered[-1]] + [t for t in beats if t >= sent[-1] + h / 2]
    gaps = [round((b - a) / h, 2) for a, b in zip(alone, alone[1:])]
    assert len(gaps) >= 4 and all(1.0 <= g <= 2.0 for g in gaps), f"gaps between the node's own beats, in intervals: {gaps}"
    trainer.send({"type": "shutdown"})
    deadline = time.monotonic() + DEADLINE
    while (f := _next_frame(frames, deadline)[1])["type"] == "heartbeat":
        pass
    assert f["type"] == "down", f
    assert trainer.finish()[0] == 0


def _frames_until_closed(trainer):
    """Every frame the node sends (heartbeats too) until it closes the connection."""
    frames = []
    while True:
        try:
            frames.append(trainer.recv(skip_heartbeats=False))
        except (EOFError, ConnectionError):
            return frames


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_mid_batch_sends_leave_as_the_last_frame_and_exits_0(trainer, sig, tmp_path):
    marker = tmp_path / "collecting"
    trainer.start_node("--import", "marker_env")
    # Each env's 1,000th step creates the marker: well into the second batch.
    spec = node_spec(policy={"config": {"kind": "random"}}, env="MarkerCartPole-v0",
                         config={"marker": str(marker), "at": 1000})
    trainer.join(spec, heartbeat_ms=20)
    trainer.send({"type": "continue", "seq": 1, "frames": 2})
    assert trainer.recv()["type"] == "batch"
    assert not marker.exists()
    trainer.send({"type": "continue", "seq": 2, "frames": 2_000_000})  # many seconds of stepping
    # The event: an env of the node stepped its 1,000th step, inside the second batch.
    deadline = time.monotonic() + DEADLINE
    while not marker.exists():
        assert time.monotonic() < deadline, "the node never reached its 1,000th step"
        time.sleep(0.01)
    trainer.proc.send_signal(sig)
    frames = _frames_until_closed(trainer)
    assert frames and frames[-1] == {"type": "leave", "node": 0}, frames[-3:]
    assert all(f["type"] == "heartbeat" for f in frames[:-1]), "the half-collected batch is not sent"
    code, err = trainer.finish()
    assert code == 0 and f"leaving the run ({sig.name})" in err, (code, err)


def _cpu_seconds(pid):
    """CPU time process ``pid`` used so far (user + system), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_shutdown_mid_batch_ends_the_batch_between_steps_and_the_node_exits_promptly(trainer):
    trainer.start_node()
    trainer.join(node_spec(policy={"config": {"kind": "random"}}), heartbeat_ms=50)
    trainer.send({"type": "continue", "seq": 1, "frames": 2})
    assert trainer.recv()["type"] == "batch"
    # Over a minute of stepping here (a node that finishes its batch first fails the test).
    trainer.send({"type": "continue", "seq": 2, "frames": 4_000_000})
    # The node is collecting once it burns CPU: waiting for frames uses next to none.
    start = _cpu_seconds(trainer.proc.pid)
    deadline = time.monotonic() + DEADLINE
    while _cpu_seconds(trainer.proc.pid) - start < 1.0:
        assert time.monotonic() < deadline, "the node never started collecting"
        assert trainer.proc.poll() is None, trainer.finish()
        time.sleep(0.05)
    sent = time.monotonic()
    trainer.send({"type": "shutdown"})
    frames = _frames_until_closed(trainer)
    closed = time.monotonic() - sent
    assert frames and frames[-1] == {"type": "down", "node": 0}, frames[-3:]
    assert all(f["type"] == "heartbeat" for f in frames[:-1]), "the half-collected batch is not sent"
    code, err = trainer.finish()
    exited = time.monotonic() - sent
    assert code == 0, (code, err)
    # Without the stop between steps, `down` waited for the whole batch (tens of seconds).
    assert closed < 3.0 and exited < 5.0, f"down after {closed:.1f} s, exit after {exited:.1f} s"


def test_a_signal_while_waiting_for_work_sends_leave_and_exits_0(trainer):
    trainer.start_node()
    trainer.join(node_spec(), weights=linear_weights(2, 4))
    trainer.send({"type": "seed", "seed": 7})
    assert trainer.recv()["type"] == "seeded"  # served: the node waits for the next frame
    trainer.proc.send_signal(signal.SIGTERM)
    frames = [f for f in _frames_until_closed(trainer) if f["type"] != "heartbeat"]
    assert frames == [{"type": "leave", "node": 0}], frames
    assert trainer.finish()[0] == 0


def test_an_env_that_raises_is_rebuilt_and_its_share_collected_again(trainer):
    trainer.start_node("--import", "flaky_env")
    spec = node_spec(env="FlakyCartPole-v0", config={"fail_at": 5})
    trainer.join(spec, weights=linear_weights(2, 4))
    trainer.send({"type": "continue", "seq": 1, "frames": 40})
    b = trainer.recv()
    assert b["type"] == "batch" and b["data"]["batch_size"] == [2, 20]
    t = tensors(b)
    # Row 0's env died at its 5th step: its whole row is the rebuilt env's, first reset with
    # the documented restart seed; row 1 kept its own first episode (seed 7 + 1).
    first = lambda seed: gym.make("CartPole-v1").reset(seed=seed)[0]
    assert np.array_equal(t["observation"][0, 0], first(restart_seed(7, 1)))
    assert np.array_equal(t["observation"][1, 0], first(8))
    assert t["step_count"][0, 0, 0] == 0 and t["step_count"][1, 0, 0] == 0
    trainer.send({"type": "shutdown"})
    assert trainer.recv()["type"] == "down"
    assert trainer.finish()[0] == 0


def test_a_snapshot_restored_on_a_new_node_collects_the_same_next_batch(trainer, tmp_path):
    spec = node_spec(
        policy={"config": {"kind": "linear"}, "exploration": "random", "init_seed": 0},
        max_frames_per_traj=13,
    )
    w = linear_weights(2, 4, version=2)
    trainer.start_node()
    trainer.join(spec, weights=w)
    trainer.send({"type": "seed", "seed": 40})
    assert trainer.recv()["type"] == "seeded"
    trainer.send({"type": "continue", "seq": 1, "frames": 50})
    assert trainer.recv()["type"] == "batch"
    trainer.send({"type": "snapshot", "id": 3})
    snap = trainer.recv()
    assert (snap["type"], snap["id"]) == ("snapshot", 3), snap
    trainer.send({"type": "continue", "seq": 2, "frames": 50})
    expected = tensors(trainer.recv())
    trainer.send({"type": "shutdown"})
    assert trainer.recv()["type"] == "down"

    other_dir = tmp_path / "other"
    other_dir.mkdir()
    other = Trainer(other_dir)
    try:
        other.start_node()
        other.join(spec, weights=linear_weights(2, 4, version=0, seed=9))  # the state's weights win
        other.send({"type": "restore", **snap["state"]})
        assert other.recv() == {"type": "restored", "node": 0}
        other.send({"type": "continue", "seq": 1, "frames": 50})
        b = other.recv()
        assert b.get("weights_version") == 2, b
        got = tensors(b)
        for k in expected:
            assert np.array_equal(got[k], expected[k]), k
        other.send({"type": "shutdown"})
        assert other.recv()["type"] == "down"
    finally:
        other.close()


def test_an_env_without_a_state_refuses_snapshots_with_a_reason_and_serves_on(trainer):
    trainer.start_node()
    # FrozenLake: a discrete observation, which only the random policy takes.
    spec = node_spec(env="FrozenLake-v1", policy={"config": {"kind": "random"}})
    trainer.join(spec)
    trainer.send({"type": "snapshot", "id": 5})
    f = trainer.recv()
    assert f["type"] == "checkpoint_failed" and f["id"] == 5 and "keeps no `state` array" in f["reason"], f
    trainer.send({"type": "continue", "seq": 2, "frames": 4})
    assert trainer.recv()["type"] == "batch"
    trainer.send({"type": "restore", "node": 0, "base_seed": 0, "weights": None, "workers": []})
    f = trainer.recv()
    assert f["type"] == "checkpoint_failed" and f["id"] == 0 and "workers" in f["reason"], f
    trainer.send({"type": "shutdown"})
    assert trainer.recv()["type"] == "down"


def test_no_token_is_a_usage_error(trainer, tmp_path):
    (tmp_path / "token").write_bytes(b"\n")
    p = trainer.start_node()
    code, err = trainer.finish()
    assert code == 2 and "error: invalid `token`: no token" in err, err


def test_a_short_token_is_a_usage_error(trainer, tmp_path):
    (tmp_path / "token").write_bytes(b"fifteen-bytes..\n")
    trainer.start_node()
    code, err = trainer.finish()
    assert code == 2 and "at least 16" in err, err


def test_a_token_file_readable_by_others_is_a_usage_error(trainer, tmp_path):
    (tmp_path / "token").chmod(0o644)
    trainer.start_node()
    code, err = trainer.finish()
    assert code == 2 and "readable by others" in err and "--allow-insecure-token-file" in err, err


def test_a_rejected_node_exits_1_with_the_reason(trainer):
    trainer.start_node()
    trainer.accept()
    trainer.recv()
    trainer.send({"type": "reject", "reason": "every slot is taken"})
    code, err = trainer.finish()
    assert code == 1 and "error: rejected by the trainer: every slot is taken" in err, err


def test_the_proof_matches_the_documented_vector():
    p = wire.proof(b"secret", bytes(range(32)), "node-0")
    assert p.hex() == "80c3993cb8c48285d68f527efd0db4117095266e2a31ccc8a16541acba52e274"


def test_a_frame_in_parts_is_the_same_bytes_as_in_one_piece():
    big = np.arange(3000, dtype=np.float64).reshape(1000, 3)
    small = np.arange(6, dtype=np.uint8)
    frame = {"type": "batch", "node": 1, "seq": 9, "data": {"batch_size": [1000], "tensors": {
        "a": wire.tensor_view(big, "f64"), "b": wire.tensor_view(small, "u8"), "c": wire.tensor_view(big, "f32")}}}
    length, parts = wire.encode_parts(frame)
    assert sum(isinstance(p, memoryview) for p in parts) == 2, "each large tensor is a buffer of its own"
    assert all(len(bytes(p)) for p in parts), "no empty buffer (the frame ends with a tensor's data)"
    whole = {"type": "batch", "node": 1, "seq": 9, "data": {"batch_size": [1000], "tensors": {
        "a": wire.to_tensor(big, "f64"), "b": wire.to_tensor(small, "u8"), "c": wire.to_tensor(big, "f32")}}}
    assert b"".join(bytes(p) for p in parts) == wire.encode(whole)
    assert length == len(wire.encode(whole)) - 4
