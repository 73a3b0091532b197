"""``launcher="ray"``: the run's nodes as Ray actors (issue 41).

Each node is one Ray actor that runs a node program (``rollout node`` by default, or the
run's ``node_command``) as its child process, joining the trainer over TCP with the token
(TLS when the run sets it) exactly as a node started by hand with ``--join`` does: to the
trainer it is the ``external`` launcher. Ray only places and starts them; supervision stays
rollout's. A node actor that dies (``ray.kill``, its raylet stopped, its process killed)
takes its node process with it (``PR_SET_PDEATHSIG``), the trainer sees the node lost and
holds its slot, and :class:`RayNodes` starts a new actor asking for the same ``--index``:
the slot's next incarnation, with the run's frames exact (docs/failures.md). At the end
every actor is killed, and with it every node process.

The token reaches the node process in ``ROLLOUT_TOKEN``, never on its command line; it
travels to the actor as a Ray task argument, so whoever can read the Ray cluster's task
arguments can read it: secure the Ray cluster itself (Ray's token authentication, TLS).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from typing import Any, Dict, List, Mapping, Optional

_PR_SET_PDEATHSIG = 1
_log = logging.getLogger("rollout")


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """The node process gets SIGKILL when the actor that started it dies."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class _NodeActor:
    """One node: its process, started by :meth:`run`, which returns its exit status."""

    def __init__(self, argv: List[str], token: bytes) -> None:
        self.argv = argv
        self.token = token
        self.proc: Any = None

    def run(self) -> int:
        import subprocess

        env = dict(os.environ, ROLLOUT_TOKEN=self.token.decode())
        self.proc = subprocess.Popen(self.argv, env=env, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        return self.proc.wait()

    def pids(self) -> List[int]:
        """This actor's process and its node's (once started)."""
        return [os.getpid()] + ([self.proc.pid] if self.proc is not None else [])

    def host(self) -> str:
        """The Ray node (raylet) it runs on."""
        import ray

        return ray.get_runtime_context().get_node_id()


def free_address(host: str = "127.0.0.1") -> str:
    """An address on ``host`` with a port nobody listens on now, for the trainer."""
    with socket.socket() as s:
        s.bind((host, 0))
        return f"{host}:{s.getsockname()[1]}"


def check_actor_options(options: Mapping[str, Any]) -> None:
    """Raises Ray's own ``ValueError`` for options no Ray actor takes (without starting
    or connecting to Ray)."""
    import ray

    ray.remote(_NodeActor).options(**dict(options))


class RayNodes:
    """``nodes`` node actors on the Ray cluster at ``address`` (``None``: the one this
    process is connected to, else a new local one), each running ``argv`` + ``--join
    join --index i --name ray-i``, kept up until :meth:`stop`."""

    def __init__(
        self,
        argv: List[str],
        join: str,
        token: bytes,
        nodes: int,
        address: Optional[str] = None,
        actor_options: Optional[Mapping[str, Any]] = None,
        max_replacements: int = 5,
    ) -> None:
        import ray

        self._ray = ray
        self._argv, self._join, self._token = list(argv), join, token
        # Two threads: `run` waits on the node process, `pids` and `host` answer meanwhile.
        self._options: Dict[str, Any] = {
            "num_cpus": 1,
            "max_restarts": 0,
            "max_concurrency": 2,
            "scheduling_strategy": "SPREAD",
        }
        self._options.update(actor_options or {})
        self._max_replacements = max_replacements
        self._connected = False
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
            self._connected = True
        self._remote = ray.remote(_NodeActor)
        self._lock = threading.Lock()
        self._actors: Dict[int, Any] = {}
        self._runs: Dict[Any, int] = {}
        self.replaced: List[int] = [0] * nodes
        self._stopping = threading.Event()
        for i in range(nodes):
            self._start(i)
        self._watcher = threading.Thread(target=self._watch, name="rollout-ray-nodes", daemon=True)
        self._watcher.start()

    def _start(self, index: int) -> None:
        argv = self._argv + ["--join", self._join, "--index", str(index), "--name", f"ray-{index}"]
        actor = self._remote.options(**self._options).remote(argv, self._token)
        with self._lock:
            self._actors[index] = actor
            self._runs[actor.run.remote()] = index

    def _watch(self) -> None:
        """Replaces every node actor that ends while the run goes on (up to
        ``max_replacements`` a slot: past that the trainer's own wait for the slot
        decides)."""
        ray = self._ray
        while not self._stopping.is_set():
            with self._lock:
                runs = list(self._runs)
            if not runs:
                self._stopping.wait(0.2)
                continue
            done, _ = ray.wait(runs, num_returns=1, timeout=0.2)
            for ref in done:
                with self._lock:
                    index = self._runs.pop(ref)
                if self._stopping.is_set():
                    return
                if self.replaced[index] >= self._max_replacements:
                    _log.warning("node %d's Ray actor ended after %d replacements: not replaced again", index, self.replaced[index])
                    continue
                self.replaced[index] += 1
                _log.warning("node %d's Ray actor ended; starting another for its slot (replacement %d)", index, self.replaced[index])
                self._start(index)

    def actor(self, index: int) -> Any:
        """Node ``index``'s current actor."""
        with self._lock:
            return self._actors[index]

    def pids(self) -> List[int]:
        """Every process of the current actors and their nodes."""
        ray = self._ray
        with self._lock:
            actors = list(self._actors.values())
        out: List[int] = []
        for a in actors:
            try:
                out.extend(ray.get(a.pids.remote(), timeout=30))
            except Exception:  # an actor that died meanwhile has nothing to list
                pass
        return out

    def stop_replacing(self) -> None:
        """Nodes that end from now on stay ended (the run is shutting down)."""
        self._stopping.set()
        self._watcher.join(timeout=10)

    def stop(self) -> None:
        """Stops replacing nodes and kills every actor (and so every node process)."""
        self.stop_replacing()
        with self._lock:
            actors = list(self._actors.values())
            self._actors.clear()
            self._runs.clear()
        for a in actors:
            try:
                self._ray.kill(a)
            except Exception:  # already gone
                pass
        if self._connected:
            self._ray.shutdown()
