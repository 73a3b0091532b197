"""Ctrl-C as a terminal sends it: SIGINT to the whole foreground process group, the
script and every process it started that stayed in the group. Node processes the
collector starts (``launcher="process"``: ``rollout node`` or Python nodes) are in
groups of their own, so the script's ``except KeyboardInterrupt`` runs (instead of a
``CollectorError`` because the nodes left first), and the collector stops them itself.

Each test runs a script in a new session (its own process group, as a shell's
foreground job), waits for the line it prints after its first batch, sends SIGINT to the
group, and checks what the script printed, that it exited, and that no node survives."""

import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from conftest import PYTHON_NODE, alive, require_python_node, rollout_bin

# How long starting the run may take (node processes, the first batch), and stopping it.
SETUP_S = 120.0
STOP_S = 60.0
# Node processes exit with the run's shutdown; a few heartbeats at most.
NODES_GONE_S = 10.0
# How long a script interrupted while its nodes start must keep waiting for them.
HOLD_S = 1.0


SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    import rollout

    # SIGINT as a terminal leaves it: where this test runs, it may be ignored (a background
    # job of a non-interactive shell), and the interpreter then installs no handler.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    nodes, form = sys.argv[1], sys.argv[2]
    if nodes == "rollout":
        how = dict(node_program=os.environ["ROLLOUT_BIN"])
    else:
        how = dict(node_command=[sys.executable, "-m", "rollout_node"])

    def loop(c):
        for i, batch in enumerate(c):
            if i == 0:
                print("first batch", flush=True)

    try:
        c = rollout.DistributedCollector(
            "Pendulum-v1", {"kind": "mlp", "hidden": [64, 64]}, nodes=2,
            frames_per_batch=4000, total_frames=-1, seed=0, launcher="process",
            batch_timeout=600.0, **how,
        )
        print("nodes", *c.node_pids(), flush=True)
        if form == "with":
            with c:
                loop(c)
        else:
            loop(c)  # no shutdown: the collector is left to the interpreter's exit
    except KeyboardInterrupt:
        print("KeyboardInterrupt", flush=True)
    """
)


def process_group(pid):
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    # The fields after the command name, which may hold spaces: state, ppid, pgrp.
    return int(stat[stat.rindex(")") + 2:].split()[2])


def read_lines(pipe, into, lines):
    """Each line of ``pipe`` into the list ``into`` and the queue ``lines``, until it closes."""
    for line in pipe:
        into.append(line)
        lines.put(line)
    lines.put(None)


def wait_line(lines, prefix, deadline, seen):
    """The first line from ``lines`` starting with ``prefix``, before ``deadline``
    (``time.monotonic()``); fails with what was ``seen`` otherwise."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            pytest.fail(f"no {prefix!r} line in time; stdout so far: {seen}")
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            continue
        if line is None:
            pytest.fail(f"the script ended before a {prefix!r} line; stdout: {seen}")
        if line.startswith(prefix):
            return line


def wait_gone(pids, seconds):
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            return [p for p in pids if alive(p)]
        time.sleep(0.01)
    return []


def start_script(args, env):
    """``python ARGS`` in a session of its own (a group led by the script: a foreground
    job), its output read by two threads: (proc, stdout lines, stderr lines, the queue of
    stdout lines, the reader threads)."""
    proc = subprocess.Popen(
        [sys.executable, *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    out, err, lines = [], [], queue.Queue()
    readers = [
        threading.Thread(target=read_lines, args=(proc.stdout, out, lines), daemon=True),
        threading.Thread(target=read_lines, args=(proc.stderr, err, queue.Queue()), daemon=True),
    ]
    for r in readers:
        r.start()
    return proc, out, err, lines, readers


def kill_leftovers(proc, pids):
    """What a failed test leaves running: the script's group, then its node processes."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for p in pids:
        if alive(p):
            os.kill(p, signal.SIGKILL)


def interrupt_a_script(tmp_path, nodes, form):
    """Runs the script, SIGINT to its group after its first batch; returns (exit code,
    stdout, stderr, node pids, their groups, the script's group)."""
    script = tmp_path / "loop.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, ROLLOUT_BIN=rollout_bin() if nodes == "rollout" else "")
    proc, out, err, lines, readers = start_script([str(script), nodes, form], env)
    pids = []
    try:
        deadline = time.monotonic() + SETUP_S
        pids = [int(p) for p in wait_line(lines, "nodes ", deadline, out).split()[1:]]
        groups = [process_group(p) for p in pids]
        wait_line(lines, "first batch", deadline, out)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole foreground group
        code = proc.wait(timeout=STOP_S)
        for r in readers:
            r.join(timeout=STOP_S)
        return code, "".join(out), "".join(err), pids, groups, proc.pid
    finally:
        kill_leftovers(proc, pids)


@pytest.mark.parametrize("form", ["with", "no_shutdown"])
@pytest.mark.parametrize("nodes", ["rollout", "python"])
def test_ctrl_c_raises_keyboard_interrupt_and_stops_the_node_processes(tmp_path, nodes, form):
    if nodes == "python":
        require_python_node()
    code, out, err, pids, groups, script_group = interrupt_a_script(tmp_path, nodes, form)
    assert "KeyboardInterrupt" in out.splitlines(), f"stdout:\n{out}\nstderr:\n{err}"
    assert "CollectorError" not in err and "the node left" not in err, err
    assert code == 0, f"exit {code}; stderr:\n{err}"
    assert len(pids) == 2
    assert script_group not in groups, "the node processes are out of the terminal's group"
    left = wait_gone(pids, NODES_GONE_S)
    assert not left, f"node processes outlived the script: {left}"
    if form == "no_shutdown":
        # Shut down at the interpreter's exit: the nodes were told to stop, none lost its trainer.
        assert "lost the trainer" not in err, err


STARTING_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    import rollout

    def on_sigint(signum, frame):
        print("SIGINT", flush=True)  # the test lets the nodes join once this is out
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    marks, go = sys.argv[1], sys.argv[2]
    # Each node notes its pid, waits for the file `go`, then becomes `rollout node`.
    wrapper = f'echo $$ > {marks}/$$; while [ ! -e {go} ]; do sleep 0.02; done; exec "$ROLLOUT_BIN" node "$@"'
    try:
        rollout.DistributedCollector(
            "CartPole-v1", nodes=2, frames_per_batch=100, total_frames=-1, launcher="process",
            node_command=["sh", "-c", wrapper, "node"], join_timeout=120.0,
        )
        print("built", flush=True)
    except KeyboardInterrupt:
        print("KeyboardInterrupt", flush=True)
    """
)


def test_ctrl_c_while_the_node_processes_start_stops_them_once_they_joined(tmp_path):
    marks, go = tmp_path / "marks", tmp_path / "go"
    marks.mkdir()
    script = tmp_path / "start.py"
    script.write_text(STARTING_SCRIPT)
    proc, out, err, lines, readers = start_script([str(script), str(marks), str(go)], dict(os.environ, ROLLOUT_BIN=rollout_bin()))
    pids = []
    try:
        deadline = time.monotonic() + SETUP_S
        while len(pids) < 2:
            assert time.monotonic() < deadline, f"the node processes did not start; stderr: {''.join(err)}"
            assert proc.poll() is None, f"the script ended; stderr: {''.join(err)}"
            pids = [int(p.name) for p in marks.iterdir() if p.name.isdigit()]
            time.sleep(0.01)
        # The script is in the constructor, waiting for the nodes to join.
        os.killpg(proc.pid, signal.SIGINT)
        wait_line(lines, "SIGINT", deadline, out)
        # The script waits for its starting nodes instead of ending without them (they
        # would look for their trainer until their --connect-timeout): a span held on
        # purpose, the condition under test.
        held = time.monotonic() + HOLD_S
        while time.monotonic() < held:
            assert proc.poll() is None, f"the script ended while its nodes were starting; stdout: {''.join(out)}"
            time.sleep(0.01)
        go.write_text("")
        code = proc.wait(timeout=STOP_S)
        for r in readers:
            r.join(timeout=STOP_S)
        out_text, err_text = "".join(out), "".join(err)
        assert out_text.splitlines() == ["SIGINT", "KeyboardInterrupt"], f"stdout:\n{out_text}\nstderr:\n{err_text}"
        assert code == 0, f"exit {code}; stderr:\n{err_text}"
        left = wait_gone(pids, NODES_GONE_S)
        assert not left, f"node processes outlived the script: {left}; stderr:\n{err_text}"
    finally:
        kill_leftovers(proc, pids)


def test_a_forked_child_exits_without_touching_its_parents_run():
    # The child inherits the collector object but none of its threads: shutting it down
    # at the child's exit would wait for a thread that is not there.
    import atexit

    import rollout

    c = rollout.DistributedCollector("CartPole-v1", frames_per_batch=50, seed=1)
    try:
        c.next()
        pid = os.fork()
        if pid == 0:
            try:
                atexit._run_exitfuncs()  # what the child's exit runs: rollout's among them
            finally:
                os._exit(0)
        deadline = time.monotonic() + STOP_S
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail("the forked child hung at its exit")
            time.sleep(0.01)
        assert os.waitstatus_to_exitcode(status) == 0
        assert c.next() is not None, "the parent's run goes on"
    finally:
        c.shutdown()
