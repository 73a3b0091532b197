"""A scripted trainer speaking PROTOCOL.md, and the node under test as a real process
(``python -m rollout_node``), so exit codes and error lines are the command's own."""

import os
import socket
import struct
import subprocess
import sys
import time

import msgpack
import numpy as np
import pytest

from rollout_node import wire

HERE = os.path.dirname(os.path.abspath(__file__))
TOKEN = b"test-token-of-16+bytes"
DEADLINE = 60.0  # generous: a loaded 2-core machine


def node_spec(env="CartPole-v1", envs=2, config=None, policy=None, first_lane=0, lanes=None, **rollout):
    """A NodeSpec as the Rust trainer sends it (PROTOCOL.md §3): node 0 of ``envs`` envs of
    ``env`` (built with ``config``), acting with ``policy`` (default: linear, deterministic),
    its lanes ``first_lane..first_lane + envs`` of ``lanes`` (default: just its own); the
    keyword arguments left set the collection loop's settings (default: 20 frames per batch,
    seed 7). The one place the tests spell a spec out, so a new field is added here."""
    r = {"frames_per_batch": 20, "max_frames_per_traj": None, "reset_at_each_iter": False,
         "init_random_frames": 0, "seed": 7, "nan_is_failure": False}
    r.update(rollout)
    return {
        "index": 0,
        "env": {"name": env, "config": config},
        # A fresh dict each time: tests edit the spec they are given.
        "policy": policy or {"config": {"kind": "linear"}, "exploration": "deterministic", "init_seed": 0},
        "envs_per_node": envs, "first_lane": first_lane, "lanes": first_lane + envs if lanes is None else lanes,
        "rollout": r, "max_restarts": 5, "restart_window_ms": 5000, "worker_nice": 10,
    }


def linear_weights(n_out, n_in, version=0, seed=0):
    rng = np.random.default_rng(seed)
    return wire.weights_to_wire(version, {
        "weight": rng.uniform(-0.5, 0.5, (n_out, n_in)).astype(np.float32),
        "bias": rng.uniform(-0.5, 0.5, (n_out,)).astype(np.float32),
    })


class Trainer:
    """One scripted trainer connection: accepts the node, checks its proof, welcomes it."""

    def __init__(self, tmp_path):
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1)
        self.listener.settimeout(DEADLINE)
        self.port = self.listener.getsockname()[1]
        self.token_file = tmp_path / "token"
        self.token_file.write_bytes(TOKEN + b"\n")  # the trailing newline is not part of it
        self.token_file.chmod(0o600)
        self.proc = None
        self.sock = None

    def start_node(self, *extra):
        env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rollout_node", "--join", f"127.0.0.1:{self.port}",
             "--token-file", str(self.token_file), "--name", "py-test", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        )
        return self.proc

    def accept(self):
        self.sock, _ = self.listener.accept()
        self.sock.settimeout(DEADLINE)
        self.rfile = self.sock.makefile("rb")

    def send(self, frame):
        self.sock.sendall(wire.encode(frame))

    def send_raw(self, data):
        self.sock.sendall(data)

    def recv(self, skip_heartbeats=True, expand=True):
        """The next frame; a batch with its `ends` written back into `data` (as the Rust
        trainer does) unless `expand` is false."""
        while True:
            f = wire.read_frame(self.rfile, wire.DEFAULT_MAX_FRAME)
            if not (skip_heartbeats and f["type"] == "heartbeat"):
                return wire.expand_batch(f) if expand and f["type"] == "batch" else f

    def join(self, spec, weights=None, heartbeat_ms=200, timeout_ms=20000, max_frame=wire.DEFAULT_MAX_FRAME, extra=None):
        """Handshake up to `ready`; returns the ready frame."""
        self.accept()
        hello = self.recv()
        assert hello["type"] == "hello" and hello["protocol_version"] == wire.PROTOCOL_VERSION == 13, hello
        nonce = bytes(range(32))
        self.send({"type": "challenge", "nonce": nonce})
        auth = self.recv()
        assert auth["proof"] == wire.proof(TOKEN, nonce, hello["node_name"])
        welcome = {"type": "welcome", "node_index": 0, "spec": spec, "weights": weights,
                   "heartbeat_ms": heartbeat_ms, "heartbeat_timeout_ms": timeout_ms, "max_frame": max_frame}
        welcome.update(extra or {})
        self.send(welcome)
        ready = self.recv()
        return ready

    def finish(self):
        """The node's exit status and stderr (waits with a deadline). As the Rust trainer
        does, the connection is read until the node shuts its side, then closed: a node
        waits (at most 1 s) for that close after its last frame (PROTOCOL.md §5)."""
        if self.sock is not None:
            try:
                while self.sock.recv(65536):
                    pass
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # closed already (by the test, or reset by the node)
        try:
            _, err = self.proc.communicate(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
            pytest.fail(f"the node did not exit within {DEADLINE} s; stderr: {err.decode()}")
        return self.proc.returncode, err.decode()

    def close(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for s in (self.sock, self.listener):
            if s:
                s.close()


@pytest.fixture
def trainer(tmp_path):
    t = Trainer(tmp_path)
    yield t
    t.close()


def tensors(batch):
    """``{key: array}`` of a batch frame."""
    return {k: wire.from_tensor(t, k) for k, t in batch["data"]["tensors"].items()}


def prefix(n):
    return struct.pack(">I", n)


def packb(v):
    return msgpack.packb(v, use_bin_type=True)
