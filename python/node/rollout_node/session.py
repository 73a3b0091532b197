"""One connection to a trainer (PROTOCOL.md §§4-6): the handshake, then a reader thread
(trainer frames into a queue, its silence timed), a writer thread (frames out, so a large
batch never delays the reader), a heartbeat thread, and the main thread serving frames in
order. Heartbeats answer the trainer's as the Rust node's do (PROTOCOL.md §5, Liveness): the
reader answers a trainer heartbeat unless this node beat less than half an interval before,
and the heartbeat thread beats on its own only 1.25 intervals after the node's last beat.

Over TLS (PROTOCOL.md §1; ``tls`` a client ``ssl.SSLContext``) the socket is wrapped before
the first byte, the trainer's certificate checked for the host dialled or ``server_name``;
every frame then travels inside it. The reader and the writer threads share the one
``SSLSocket`` (reads and writes on separate threads, as CPython's ``ssl`` allows).
"""

import queue
import signal
import socket
import ssl
import sys
import threading
import time

from . import wire
from . import collect as checkpoint
from .collect import BuildError, CheckpointError, NodeFailed, Stopped
from .envpool_backend import make_workers
from .policy import PolicyError
from .spaces import SpaceError

#: Batches of fewer bytes are copied into one frame's bytes (cheaper than sending in parts).
_INLINE_BATCH_BYTES = 1 << 16
#: The wire dtype of each numpy dtype a batch holds.
_DTYPES = {"float32": "f32", "float64": "f64", "int64": "i64", "bool": "bool", "uint8": "u8"}

#: The largest trainer frame read before `welcome` (whose weights may be large), as the
#: Rust node: the default `max_frame`.
PRE_WELCOME_MAX_FRAME = wire.DEFAULT_MAX_FRAME


class JoinError(Exception):
    """Why the node could not join or stopped serving; ``str`` is ``rollout node``'s error line."""


class _Leave(BaseException):
    """Raised in the main thread by the SIGTERM/SIGINT handler once the node is in: it
    stops what the node does (a batch half collected is not sent) and sends ``leave``. A
    BaseException, so that no ``except Exception`` of env or policy code swallows it."""


def _leave_on_signal(signum, _frame):
    raise _Leave(signal.Signals(signum).name)


class _Sent:
    """A frame for the writer, in parts, and what to do once it is sent."""

    def __init__(self, parts, then):
        self.parts, self.then = parts, then


def _send_parts(sock, parts):
    """Sends every buffer of ``parts`` in order, a few system calls for the lot (over TLS,
    which has no vectored send, one ``sendall`` each)."""
    views = [v for v in (memoryview(p).cast("B") for p in parts) if v.nbytes]
    if isinstance(sock, ssl.SSLSocket):
        for v in views:
            sock.sendall(v)
        return
    while views:
        sent = sock.sendmsg(views[:64])
        while sent:
            if sent >= views[0].nbytes:
                sent -= views[0].nbytes
                views.pop(0)
            else:
                views[0] = views[0][sent:]
                sent = 0


def tls_context(ca, cert=None, key=None):
    """A client TLS context: the trainer checked against the CAs of the PEM file ``ca``;
    with ``cert`` and ``key``, this node's certificate for mutual TLS. ``ValueError`` names
    the flag and the file that cannot be used."""
    if (cert is None) != (key is None):
        raise ValueError("tls_cert: --tls-cert and --tls-key go together")
    try:
        ctx = ssl.create_default_context(cafile=ca)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"tls_ca: cannot use {ca} as CA certificates: {e}") from None
    if cert is not None:
        try:
            ctx.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as e:
            raise ValueError(f"tls_cert: cannot use {cert} with the key {key}: {e}") from None
    return ctx


def _connect(addr, timeout):
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise JoinError(f"cannot connect to {addr}: expected HOST:PORT")
    deadline = time.monotonic() + timeout
    while True:
        try:
            s = socket.create_connection((host.strip("[]"), int(port)), timeout=max(deadline - time.monotonic(), 0.1))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return s
        except ConnectionRefusedError:
            if time.monotonic() >= deadline:
                raise JoinError(f"cannot connect to {addr}: connection refused for {timeout:g} s") from None
            time.sleep(0.1)
        except OSError as e:
            raise JoinError(f"cannot connect to {addr}: {e}") from None


class Session:
    """A joined node: serves the trainer until `shutdown` (returns) or fails (JoinError)."""

    def __init__(
        self, addr, token, name, index=None, connect_timeout=30.0, leave_on_signals=False, double_to_float=False,
        allow_pickled_env=False, tls=None, server_name=None,
    ):
        self.addr, self.token, self.name, self.index = addr, token, name, index
        #: TLS to the trainer (a client ``ssl.SSLContext``; ``None``: plain TCP), checking its
        #: certificate for ``server_name`` (default: the host of ``addr``).
        self.tls, self.server_name = tls, server_name
        #: A torchrl env the trainer sends as a pickle is loaded (it runs the trainer's code).
        self.allow_pickled_env = allow_pickled_env
        #: f64 boxes are reported and collected as f32 (torchrl's DoubleToFloat).
        self.double_to_float = double_to_float
        self.connect_timeout = connect_timeout
        #: From `welcome` on, SIGTERM or SIGINT leaves the run (main thread only).
        self.leave_on_signals = leave_on_signals and threading.current_thread() is threading.main_thread()
        self.inbox = queue.Queue()
        self.outbox = queue.Queue()
        self.stop = threading.Event()
        #: Set by the reader on `shutdown`, and by any thread that finds the trainer gone: a
        #: batch being collected ends between steps (PROTOCOL.md §5, Shutdown).
        self.stopping = threading.Event()
        self.last_heard = time.monotonic()
        #: When this node last queued a heartbeat (an answer or its own), or the session began.
        self.beat_sent = time.monotonic()
        self._beat_lock = threading.Lock()
        self._beat = wire.encode({"type": "heartbeat"})

    # -- handshake ---------------------------------------------------------------------
    def handshake(self):
        """Connects and joins; returns the ``welcome`` frame."""
        s = _connect(self.addr, self.connect_timeout)
        s.settimeout(self.connect_timeout)
        if self.tls is not None:
            host = self.server_name or self.addr.rpartition(":")[0].strip("[]")
            try:
                s = self.tls.wrap_socket(s, server_hostname=host)
            except (ssl.SSLError, ssl.CertificateError, OSError) as e:
                s.close()
                raise JoinError(f"cannot connect to {self.addr}: TLS handshake failed: {e}") from None
        self.sock = s
        self.rfile = s.makefile("rb", buffering=1 << 16)
        try:
            s.sendall(wire.encode({"type": "hello", "protocol_version": wire.PROTOCOL_VERSION, "node_name": self.name, "node_index": self.index}))
            f = self._read(PRE_WELCOME_MAX_FRAME)
            if f["type"] == "reject":
                raise JoinError(f"rejected by the trainer: {f.get('reason')}")
            if f["type"] != "challenge":
                raise JoinError(f"protocol error: expected `challenge`, got `{f['type']}`")
            nonce = wire.field(f, "nonce", bytes)
            s.sendall(wire.encode({"type": "auth", "proof": wire.proof(self.token, nonce, self.name)}))
            f = self._read(PRE_WELCOME_MAX_FRAME)
        except (socket.timeout, TimeoutError):
            raise JoinError(f"cannot connect to {self.addr}: the handshake took longer than {self.connect_timeout:g} s") from None
        if f["type"] == "reject":
            raise JoinError(f"rejected by the trainer: {f.get('reason')}")
        if f["type"] != "welcome":
            raise JoinError(f"protocol error: expected `welcome`, got `{f['type']}`")
        for k in ("node_index", "heartbeat_ms", "heartbeat_timeout_ms", "max_frame"):
            wire.field(f, k, int)
        if not isinstance(f.get("spec"), dict):
            raise JoinError("protocol error: `welcome` frame: field `spec` is missing or mistyped")
        s.settimeout(None)
        return f

    def _read(self, max_frame):
        try:
            return wire.read_frame(self.rfile, max_frame)
        except wire.ProtocolError as e:
            raise JoinError(f"protocol error: {e}") from None
        except (EOFError, ConnectionError) as e:
            raise JoinError(f"lost the trainer: {e}") from None

    # -- threads -----------------------------------------------------------------------
    def _reader(self):
        # Reads until the trainer closes (or the socket fails), also after the node's last
        # frame: closing with unread bytes would reset the connection (see `run`).
        while True:
            try:
                f = wire.read_frame(self.rfile, self.max_frame)
            except wire.ProtocolError as e:
                self._end(f"protocol error: {e}")
                return
            except (EOFError, OSError, ValueError) as e:
                self._end(f"lost the trainer: {e}")
                return
            self.last_heard = time.monotonic()
            if f["type"] == "shutdown":
                self.stopping.set()  # before it is queued: the main thread may be collecting
            if f["type"] == "heartbeat":
                # Answered at once, unless this node beat half an interval ago or less (its
                # own timer came first, or the trainer's beats come closer than its interval).
                self._beat_if_quiet_for(self.heartbeat_s / 2)
            else:
                self.inbox.put(("frame", f))

    def _writer(self):
        while True:
            data = self.outbox.get()
            if data is None:
                return
            # ``("last", frame)``: the connection's last frame (``leave``); nothing after it,
            # not even a heartbeat queued meanwhile.
            last = isinstance(data, tuple)
            if last:
                data = data[1]
            try:
                if isinstance(data, _Sent):
                    _send_parts(self.sock, data.parts)
                    data.then()
                else:
                    self.sock.sendall(data)
            except OSError as e:
                self._end(f"lost the trainer: {e}")
                return
            if last:
                return

    def _end(self, reason):
        """The session cannot go on (``reason``): a batch being collected stops between steps,
        and the main thread raises ``reason`` at its next frame."""
        self.stopping.set()
        self.inbox.put(("error", reason))

    def _beat_if_quiet_for(self, quiet):
        """Queues a heartbeat if this node queued none for ``quiet`` seconds."""
        with self._beat_lock:
            now = time.monotonic()
            if now - self.beat_sent >= quiet:
                self.beat_sent = now
                self.outbox.put(self._beat)

    def _heartbeat(self):
        """The node's own beat, only when the trainer's is late: 1.25 intervals after the
        node's last heartbeat (an answer or its own). The trainer's silence is checked at
        least every interval."""
        own = self.heartbeat_s * 1.25
        while True:
            wait = min(self.beat_sent + own - time.monotonic(), self.heartbeat_s)
            if self.stop.wait(max(wait, 0.0)):
                return
            self._beat_if_quiet_for(own)
            if time.monotonic() - self.last_heard > self.timeout_s:
                self._end(f"lost the trainer: silent for more than {self.timeout_s * 1000:.0f} ms")
                return

    def send(self, frame, then=None):
        """Queues ``frame`` for the writer; a frame over ``max_frame`` becomes ``failed``.
        With ``then``, large tensors (:func:`wire.tensor_view`) are sent from their arrays,
        not copied, and ``then`` is called (on the writer's thread) once they are sent."""
        if then is None:
            data = wire.encode(frame)
            length = len(data) - 4
        else:
            length, parts = wire.encode_parts(frame)
            data = _Sent(parts, then)
        if length > self.max_frame:
            raise NodeFailed(f"a `{frame['type']}` of {length} bytes is over the trainer's max_frame {self.max_frame}")
        self.outbox.put(data)

    # -- serving -----------------------------------------------------------------------
    def run(self):
        """Joins and serves until `shutdown`; with `leave_on_signals`, until SIGTERM or
        SIGINT after `welcome` too: then ``leave`` is the last frame (PROTOCOL.md §5,
        Leave) and `run` returns. Before `welcome` the signals do what they did."""
        welcome = self.handshake()
        self.node = welcome["node_index"]
        self.max_frame = welcome["max_frame"]
        self.heartbeat_s = max(welcome["heartbeat_ms"], 1) / 1000.0
        self.timeout_s = max(welcome["heartbeat_timeout_ms"], 1) / 1000.0
        self.last_heard = self.beat_sent = time.monotonic()
        threads = [threading.Thread(target=t, daemon=True) for t in (self._reader, self._writer, self._heartbeat)]
        for t in threads:
            t.start()
        previous = {}
        try:
            if self.leave_on_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    previous[sig] = signal.signal(sig, _leave_on_signal)
            try:
                self.workers = make_workers(welcome["spec"], self.double_to_float, self.allow_pickled_env)
                if welcome.get("weights") is not None:
                    version, tensors = wire.weights_from_wire(welcome["weights"])
                    self.workers.policy.set_weights(version, tensors)
            except (BuildError, PolicyError, SpaceError, wire.ProtocolError) as e:
                self._fail(f"cannot build the node: {e}")
            except Exception as e:
                # Whatever else building raises still ends in the documented `failed`
                # and exit 1, not a traceback.
                self._fail(f"cannot build the node: {type(e).__name__}: {e}")
            # A policy with weights and none in `welcome` (the trainer learns the env's specs
            # from this `ready`) waits for version 0 in an `update_weights` before collecting.
            w = self.workers
            self.send({"type": "ready", "node": self.node, "layout": w.layout(), "specs": w.specs})
            self._serve()
        except _Leave as why:
            # Whatever was being collected is not sent: the trainer asks others for it.
            print(f"leaving the run ({why})", file=sys.stderr)
            self.outbox.put(("last", wire.encode({"type": "leave", "node": self.node})))
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.stop.set()
            self.outbox.put(None)
            threads[1].join(timeout=30)
            # A clean close (PROTOCOL.md §5, Shutdown): the write side shut after the last
            # frame, then what the trainer still sends is read (by the reader) until it
            # closes, at most 1 s. Closing with a heartbeat unread would reset the
            # connection, and the reset throws away what is still queued: maybe `down`.
            try:
                # The socket's own shutdown: `SSLSocket.shutdown` would drop the TLS
                # session the reader still reads through (the trainer takes the end of
                # the stream after whole frames as a close).
                socket.socket.shutdown(self.sock, socket.SHUT_WR)
            except OSError:
                pass
            threads[0].join(timeout=1.0)
            try:
                self.sock.close()
            except OSError:
                pass
            if hasattr(self, "workers"):
                self.workers.close()

    def _fail(self, reason):
        """Sends ``failed {reason}`` and stops with ``reason`` as the error."""
        try:
            self.send({"type": "failed", "node": self.node, "reason": reason})
        except NodeFailed:
            pass
        raise JoinError(reason)

    def _next(self):
        while True:
            try:
                # In short waits: a signal's handler runs in this thread only between
                # waits (an untimed queue wait lets SIGTERM wait for the next frame).
                kind, value = self.inbox.get(timeout=0.1)
                break
            except queue.Empty:
                continue
        if kind == "error":
            raise JoinError(value)
        return value

    def _serve(self):
        while True:
            f = self._next()
            t = f["type"]
            try:
                if t == "continue":
                    seq, frames = wire.field(f, "seq", int), wire.field(f, "frames", int)
                    if self._shutdown_queued():
                        continue  # the Rust node drops a `continue` in flight at `shutdown` too
                    try:
                        self._collect(seq, frames)
                    except Stopped:
                        continue  # the batch so far is dropped; `shutdown` (or the error) is next
                elif t == "update_weights":
                    version, tensors = wire.weights_from_wire(f.get("weights"))
                    try:
                        self.workers.policy.set_weights(version, tensors)
                    except PolicyError as e:
                        self._fail(str(e))
                    self.send({"type": "weights_updated", "node": self.node, "version": version})
                elif t == "seed":
                    nxt = self.workers.set_seed(wire.field(f, "seed", int))
                    self.send({"type": "seeded", "node": self.node, "next_seed": nxt})
                elif t == "snapshot":
                    sid = wire.field(f, "id", int)
                    try:
                        state = self._snapshot()
                    except CheckpointError as e:
                        self.send({"type": "checkpoint_failed", "node": self.node, "id": sid, "reason": str(e)})
                    else:
                        self.send({"type": "snapshot", "node": self.node, "id": sid, "state": state})
                elif t == "restore":
                    try:
                        self._restore(f)
                    except CheckpointError as e:
                        self.send({"type": "checkpoint_failed", "node": self.node, "id": 0, "reason": str(e)})
                    else:
                        self.send({"type": "restored", "node": self.node})
                elif t == "shutdown":
                    # The connection's last frame: a heartbeat the reader or the timer queues
                    # after it is not sent (PROTOCOL.md §5, Shutdown).
                    self.outbox.put(("last", wire.encode({"type": "down", "node": self.node})))
                    return
                elif t in ("hello", "challenge", "auth", "welcome", "reject"):
                    raise JoinError(f"protocol error: a `{t}` frame after the handshake")
                else:
                    raise JoinError(f"protocol error: unknown frame type `{t}`")
            except wire.ProtocolError as e:
                raise JoinError(f"protocol error: {e}") from None
            except NodeFailed as e:
                self._fail(str(e))

    def _shutdown_queued(self):
        with self.inbox.mutex:
            return any(k == "frame" and v.get("type") == "shutdown" for k, v in self.inbox.queue)

    def _snapshot(self):
        """This node's ``NodeState`` (PROTOCOL.md §§3, 9)."""
        w = self.workers
        p = w.policy
        weights = None if not p.layout or p.weights is None else wire.weights_to_wire(p.version, p.weights)
        return {"node": self.node, "base_seed": w.base_seed, "weights": weights, "workers": checkpoint.snapshot(w)}

    def _restore(self, f):
        """Goes on from the ``restore`` frame's state (a Python node's of the same spec)."""
        w = self.workers
        weights = None
        if f.get("weights") is not None:
            try:
                version, tensors = wire.weights_from_wire(f["weights"])
                w.policy.check_weights(tensors)
            except (wire.ProtocolError, PolicyError) as e:
                raise CheckpointError(f"the state's weights: {e}") from None
            weights = (version, tensors)
        checkpoint.restore(w, f)
        if weights is not None:
            w.policy.set_weights(*weights)

    def _collect(self, seq, frames):
        w = self.workers
        if w.policy.version is None:
            raise NodeFailed(
                f"no weights for the `{w.policy.kind}` policy before the first `continue` "
                f"(it needs {sorted(w.policy.layout)}; this node never invents weights)"
            )
        try:
            data = w.collect(frames, stop=self.stopping)
        except PolicyError as e:
            raise NodeFailed(f"policy failed: {e}") from None
        steps = frames // w.E
        # Each observation once (version 9): `next.K` only where it is not `K` one step on.
        ends = wire.batch_ends(data, w.E, steps)
        sent_once = ends[1] if ends else {}
        tensors = {}
        for key, a in data.items():
            if key not in sent_once:
                tensors[key] = wire.tensor_view(a, _DTYPES[a.dtype.name])
        frame = {
            "type": "batch",
            "node": self.node,
            "seq": seq,
            "weights_version": w.policy.version,
            "data": {"batch_size": [w.E, steps], "tensors": tensors},
        }
        if ends:
            frame["ends"] = {
                "rows": ends[0],
                "tensors": {k: wire.tensor_view(a, _DTYPES[a.dtype.name]) for k, a in sent_once.items()},
            }
        if sum(a.nbytes for a in data.values()) < _INLINE_BATCH_BYTES:
            self.send(frame)  # copied into the frame's bytes: the arrays are free at once
            w.recycle(data)
        else:
            # Sent from the batch's own arrays: they are reused only once they are on the wire.
            self.send(frame, then=lambda: w.recycle(data))
