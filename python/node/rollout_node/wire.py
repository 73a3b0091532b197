"""Frames on the wire (PROTOCOL.md §§1-4): the length prefix, MessagePack maps with a
``type`` key, tensors as ``{dtype, shape, data}``, the join proof and the token file.

Nothing here touches a socket except :func:`read_frame`, which reads one frame from a
file-like object; everything else is bytes in, values out, so the tests use it alone.
"""

import hashlib
import hmac
import os
import stat
import struct

import msgpack
import numpy as np

PROTOCOL_VERSION = 13
DEFAULT_MAX_FRAME = 256 << 20
PROOF_CONTEXT = b"rollout-join-v1"

#: The wire's dtype names and their little-endian numpy dtypes.
DTYPES = {
    "f32": np.dtype("<f4"),
    "f64": np.dtype("<f8"),
    "i64": np.dtype("<i8"),
    "bool": np.dtype("u1"),
    "u8": np.dtype("u1"),
}


class ProtocolError(Exception):
    """The peer sent something the protocol does not allow."""


class FrameTooLarge(ProtocolError):
    """A length prefix over the limit (or zero): refused before reading the body."""


def encode(frame):
    """One frame's bytes (prefix and body). ``frame`` is a dict with ``type`` first."""
    body = msgpack.packb(frame, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


def decode(body):
    """The frame (a dict with a str ``type``) in ``body``; a ProtocolError otherwise."""
    try:
        value = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises several types, all mean "not one value"
        raise ProtocolError(f"a frame that is not MessagePack: {e}") from None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise ProtocolError("a frame that is not a map with a string `type`")
    return value


#: Tensor data of at least this many bytes is not copied into the frame's bytes: it is sent
#: from the array's own memory (``encode_parts``).
OUT_OF_BAND_BYTES = 4096


def _bin_header(n):
    if n < 1 << 8:
        return b"\xc4" + struct.pack(">B", n)
    if n < 1 << 16:
        return b"\xc5" + struct.pack(">H", n)
    return b"\xc6" + struct.pack(">I", n)


def encode_parts(frame):
    """One frame as ``(body length, [buffers])``, the length prefix first: the same bytes as
    :func:`encode`, but a large ``memoryview`` in it (a tensor's data, :func:`tensor_view`)
    is a buffer of its own, never copied. Only maps are walked into."""
    packer = msgpack.Packer(use_bin_type=True, autoreset=True)
    parts, chunk = [], bytearray()

    def put(v):
        if isinstance(v, dict):
            chunk.extend(packer.pack_map_header(len(v)))
            for k, x in v.items():
                chunk.extend(packer.pack(k))
                put(x)
        elif isinstance(v, memoryview) and v.nbytes >= OUT_OF_BAND_BYTES:
            chunk.extend(_bin_header(v.nbytes))
            parts.append(bytes(chunk))
            chunk.clear()
            parts.append(v)
        else:
            chunk.extend(packer.pack(v.tobytes() if isinstance(v, memoryview) else v))

    put(frame)
    if chunk:
        parts.append(bytes(chunk))
    length = sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts)
    return length, [struct.pack(">I", length)] + parts


def read_exact(stream, n):
    """Exactly ``n`` bytes from ``stream``; EOFError when the peer closed first."""
    chunks = []
    while n > 0:
        chunk = stream.read(n)
        if not chunk:
            raise EOFError("the trainer closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(stream, max_frame):
    """The next frame of ``stream``; the prefix is checked before any body byte is read."""
    (length,) = struct.unpack(">I", read_exact(stream, 4))
    if length == 0 or length > max_frame:
        raise FrameTooLarge(f"a frame of {length} bytes (the limit is {max_frame}, and 0 is refused)")
    return decode(read_exact(stream, length))


def field(frame, name, kind, optional=False):
    """``frame[name]`` checked against ``kind`` (a type or tuple); names the frame and field."""
    value = frame.get(name)
    if value is None and optional:
        return None
    if kind is int and isinstance(value, bool):
        value = None  # a bool is not an integer on the wire
    if not isinstance(value, kind):
        raise ProtocolError(f"`{frame.get('type')}` frame: field `{name}` is missing or mistyped")
    if kind is int and value < 0:
        raise ProtocolError(f"`{frame.get('type')}` frame: field `{name}` is negative")
    return value


def to_tensor(array, dtype):
    """The wire form of ``array`` as ``dtype`` (C order, little-endian; a scalar keeps its
    shape ``[]``, which ``np.ascontiguousarray`` would make ``[1]``)."""
    a = np.asarray(array, dtype=DTYPES[dtype], order="C")
    return {"dtype": dtype, "shape": list(a.shape), "data": a.tobytes()}


def tensor_view(array, dtype):
    """The wire form of ``array`` as ``dtype`` whose ``data`` is a view of the array's bytes
    (no copy when it is C-ordered in that dtype), for :func:`encode_parts`."""
    a = np.asarray(array, dtype=DTYPES[dtype], order="C")
    return {"dtype": dtype, "shape": list(a.shape), "data": memoryview(a.reshape(-1).view(np.uint8))}


def from_tensor(t, what="tensor"):
    """The numpy array of a wire tensor (checked: dtype, shape, data length, bool bytes)."""
    if not isinstance(t, dict):
        raise ProtocolError(f"{what} is not a map")
    dtype, shape, data = t.get("dtype"), t.get("shape"), t.get("data")
    if dtype not in DTYPES:
        raise ProtocolError(f"{what}: unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ProtocolError(f"{what}: `shape` is not an array of uint")
    if not isinstance(data, bytes):
        raise ProtocolError(f"{what}: `data` is not bin")
    dt = DTYPES[dtype]
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if len(data) != n * dt.itemsize:
        raise ProtocolError(f"{what}: {len(data)} data bytes for shape {shape} of {dtype}")
    a = np.frombuffer(data, dtype=dt).reshape(shape)
    if dtype == "bool":
        if a.size and a.max() > 1:
            raise ProtocolError(f"{what}: a bool byte other than 0 or 1")
        a = a.astype(bool)
    return a


def _is_observation(key, data):
    """Whether batch key ``key`` is an observation entry: ``observation...``, or a group's
    ``g.observation...`` in a multi-agent batch (one with ``g.mask``; version 10)."""
    if key == "observation" or key.startswith("observation."):
        return True
    group, _, rest = key.partition(".")
    return (rest == "observation" or rest.startswith("observation.")) and f"{group}.mask" in data


#: The fewest bytes sending each observation once must save for a batch to be sent so
#: (the Rust node's ``ends::MIN_SAVED``): below it the trainer's rebuild costs more than the bytes.
MIN_SAVED = 16 << 10


def batch_ends(data, lanes, steps, min_saved=MIN_SAVED):
    """What a batch sends of its observations' ``next.`` entries (PROTOCOL.md §3, Ends;
    version 9; a multi-agent batch's ``next.g.observation...`` too, version 10): ``(rows,
    {"next.K": array})``, the flat frame indices where ``next.K`` is
    not ``K`` one step later (compared as bytes, for every observation entry at once) plus
    each env's last frame, and those rows of each; ``None`` when ``data`` (arrays of shape
    ``[lanes, steps, ...]``) has no observation entry with its ``next.`` twin, or sending
    them once would save fewer than ``min_saved`` bytes."""
    pairs = []
    for k, a in data.items():
        n = data.get("next." + k)
        if _is_observation(k, data) and n is not None and n.dtype == a.dtype and n.shape == a.shape:
            pairs.append((k, a, n))
    if not pairs or lanes * steps == 0:
        return None
    differs = np.zeros((lanes, steps), dtype=bool)
    differs[:, -1] = True
    for _, a, n in pairs:
        row = int(np.prod(a.shape[2:], dtype=np.int64)) * a.dtype.itemsize
        av = np.ascontiguousarray(a).view(np.uint8).reshape(lanes, steps, row)
        nv = np.ascontiguousarray(n).view(np.uint8).reshape(lanes, steps, row)
        differs[:, :-1] |= (nv[:, :-1] != av[:, 1:]).any(axis=2)
    rows = np.flatnonzero(differs)
    saved = sum(int(np.prod(a.shape[2:], dtype=np.int64)) * a.dtype.itemsize for _, a, _ in pairs) * (lanes * steps - len(rows))
    if saved < min_saved:
        return None
    tensors = {"next." + k: n.reshape((lanes * steps,) + n.shape[2:])[rows] for k, _, n in pairs}
    return [int(r) for r in rows], tensors


def expand_batch(frame):
    """A ``batch`` frame with its ``ends`` (if any) written back into ``data.tensors`` as
    the ``next.K`` entries a trainer rebuilds (PROTOCOL.md §3, Ends): what a trainer written
    in Python (the tests' scripted one) reads. The same checks as the Rust trainer's; a
    ProtocolError when they fail. Returns ``frame``, changed in place."""
    ends = frame.pop("ends", None)
    if ends is None:
        return frame
    data = frame["data"]
    tensors = data["tensors"]
    lanes, steps = data["batch_size"]
    rows = ends.get("rows") if isinstance(ends, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, int) and r >= 0 for r in rows):
        raise ProtocolError("`ends.rows` is not an array of uint")
    if any(b <= a for a, b in zip(rows, rows[1:])):
        raise ProtocolError("`ends.rows` not strictly increasing")
    if rows and rows[-1] >= lanes * steps:
        raise ProtocolError(f"`ends.rows` holds {rows[-1]}, past the batch's {lanes * steps} frames")
    if lanes * steps and sum(1 for r in rows if (r + 1) % steps == 0) != lanes:
        raise ProtocolError("`ends.rows` lacks an env's last frame")
    listed = np.zeros(lanes * steps, dtype=bool)
    listed[rows] = True
    for key, t in ends.get("tensors", {}).items():
        obs_key = key[len("next."):] if key.startswith("next.") else ""
        if not obs_key or key in tensors or obs_key not in tensors:
            raise ProtocolError(f"`ends`: `{key}` is not the `next.` key of an entry of `data`")
        obs = from_tensor(tensors[obs_key], obs_key)
        at = from_tensor(t, key)
        if at.dtype != obs.dtype or at.shape != (len(rows),) + obs.shape[2:]:
            raise ProtocolError(f"`ends`: `{key}` is {at.dtype} {list(at.shape)}, not as `{obs_key}` at the rows")
        flat = obs.reshape((lanes * steps,) + obs.shape[2:])
        nxt = np.empty_like(flat)
        follows = ~listed
        nxt[follows] = flat[1:][follows[:-1]] if lanes * steps else flat[follows]
        nxt[listed] = at
        tensors[key] = to_tensor(nxt.reshape(obs.shape), tensors[obs_key]["dtype"])
    return frame


def weights_from_wire(w):
    """``(version, {name: float32 array})`` of a wire ``Weights``."""
    if not isinstance(w, dict) or not isinstance(w.get("tensors"), dict):
        raise ProtocolError("weights: not a map with `tensors`")
    version = w.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise ProtocolError("weights: `version` is not a uint")
    tensors = {}
    for name, t in w["tensors"].items():
        if not isinstance(name, str):
            raise ProtocolError("weights: a tensor name that is not a string")
        a = from_tensor(t, f"weight `{name}`")
        if t["dtype"] != "f32":
            raise ProtocolError(f"weight `{name}` must be f32, got {t['dtype']}")
        tensors[name] = a
    return version, tensors


def weights_to_wire(version, tensors):
    """The wire ``Weights`` of ``version`` and ``{name: array}``."""
    return {"version": version, "tensors": {k: to_tensor(v, "f32") for k, v in sorted(tensors.items())}}


def proof(token, nonce, node_name):
    """HMAC-SHA256(token, "rollout-join-v1" || nonce || node_name) (PROTOCOL.md §4)."""
    return hmac.new(token, PROOF_CONTEXT + nonce + node_name.encode("utf-8"), hashlib.sha256).digest()


class TokenError(Exception):
    """No usable token."""


MIN_TOKEN_LEN = 16
"""Shortest token accepted, as the Rust trainer and node require (`wire::MIN_TOKEN_LEN`)."""

MAX_TOKEN_FILE = 64 << 10
"""Most bytes of a token file, as the Rust node's `bounded_file::TOKEN_FILE` (64 KiB)."""


def _not_regular(st_mode):
    """What a file that is not a regular one is, or None for a regular file."""
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(st_mode):
            return kind
    return None if stat.S_ISREG(st_mode) else "not a file"


def _read_token_file(token_file):
    """The bytes of a regular token file of at most MAX_TOKEN_FILE bytes: a FIFO, a directory or a
    device is refused from its metadata, unread (and a FIFO put in its place is not waited on:
    the file is opened non-blocking and checked again)."""

    def check(st):
        kind = _not_regular(st.st_mode)
        if kind is not None:
            raise TokenError(f"the token file {token_file} is {kind}, not a regular file")
        if st.st_size > MAX_TOKEN_FILE:
            raise TokenError(f"the token file {token_file} holds {st.st_size} bytes, over the limit of {MAX_TOKEN_FILE}")

    check(os.stat(token_file))
    fd = os.open(token_file, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        check(os.fstat(f.fileno()))
        raw = f.read(MAX_TOKEN_FILE + 1)
    if len(raw) > MAX_TOKEN_FILE:
        raise TokenError(f"the token file {token_file} holds more than {MAX_TOKEN_FILE} bytes, the limit")
    return raw


def read_token(token_file, insecure_file_ok=False):
    """The token as ``rollout node`` reads it: the file without trailing ASCII whitespace,
    else ``ROLLOUT_TOKEN`` as it is; empty, shorter than 16 bytes, or a file readable by
    group or others (unless ``insecure_file_ok``) is refused, as ssh refuses such a key; so is
    a file that is not a regular one (a FIFO, a directory, a device) or over 64 KiB, unread."""
    if token_file is not None:
        try:
            mode = os.stat(token_file).st_mode & 0o777
            if mode & 0o077 and not insecure_file_ok:
                raise TokenError(
                    f"the token file {token_file} is readable by others (mode {mode:03o}): "
                    f"chmod 600 it, or pass --allow-insecure-token-file"
                )
            raw = _read_token_file(token_file)
        except OSError as e:
            raise TokenError(f"cannot read the token file {token_file}: {e.strerror or e}") from None
        token = raw.rstrip(b" \t\n\r\x0c")  # Rust is_ascii_whitespace
    else:
        token = os.environ.get("ROLLOUT_TOKEN", "").encode("utf-8")
    if not token:
        raise TokenError("no token: pass --token-file PATH or set ROLLOUT_TOKEN")
    if len(token) < MIN_TOKEN_LEN:
        raise TokenError(f"the token is {len(token)} bytes; at least {MIN_TOKEN_LEN} are needed")
    return token
