#!/usr/bin/env python3
"""Decodes rollout's wire frames or `--output` records with the standard `msgpack` package.

This is an independent reader (no rmp-serde, no numpy): it proves the format is plain
MessagePack as PROTOCOL.md describes it, and prints what it read as JSON on stdout.

Usage:
    msgpack_check.py frames FILE   # concatenated frames: u32 big-endian body length + body
    msgpack_check.py output FILE   # a `rollout collect --output FILE` file: concatenated maps

Output: one JSON array, one element per frame / record. Every value is converted as is,
except that
  * a tensor (a map with exactly the keys dtype, shape, data) becomes
    {"dtype": ..., "shape": [...], "values": [flat C-order values]};
  * any other binary value becomes {"hex": "..."};
  * non-finite floats become the strings "nan", "inf", "-inf".
Exits 1 with a message on stderr if anything does not follow the format.
"""

import json
import math
import struct
import sys

import msgpack

# dtype -> (struct format character, bytes per element)
DTYPES = {"f32": ("f", 4), "f64": ("d", 8), "i64": ("q", 8), "u8": ("B", 1), "bool": ("B", 1)}
TENSOR_KEYS = {"dtype", "shape", "data"}


class FormatError(Exception):
    pass


def decode_tensor(t):
    dtype, shape, data = t["dtype"], t["shape"], t["data"]
    if dtype not in DTYPES:
        raise FormatError(f"unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise FormatError(f"bad shape {shape!r}")
    if not isinstance(data, bytes):
        raise FormatError(f"tensor data must be bin, got {type(data).__name__}")
    fmt, size = DTYPES[dtype]
    n = math.prod(shape)
    if len(data) != n * size:
        raise FormatError(f"{dtype} tensor of shape {shape} needs {n * size} bytes, got {len(data)}")
    values = list(struct.unpack(f"<{n}{fmt}", data))
    if dtype == "bool":
        if any(v not in (0, 1) for v in values):
            raise FormatError("bool bytes must be 0 or 1")
        values = [v == 1 for v in values]
    return {"dtype": dtype, "shape": shape, "values": [plain(v) for v in values]}


def plain(v):
    """A JSON-friendly copy of a decoded MessagePack value."""
    if isinstance(v, dict):
        if set(v.keys()) == TENSOR_KEYS and isinstance(v.get("data"), bytes):
            return decode_tensor(v)
        for k in v:
            if not isinstance(k, str):
                raise FormatError(f"map key {k!r} is not a string")
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, bytes):
        return {"hex": v.hex()}
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, msgpack.ExtType):
        raise FormatError("extension types are not part of the protocol")
    return v


def unpack_one(body):
    """Exactly one MessagePack value filling `body`."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=max(len(body), 1))
    unpacker.feed(body)
    try:
        value = unpacker.unpack()
    except msgpack.OutOfData:
        raise FormatError("truncated body")
    if unpacker.tell() != len(body):
        raise FormatError(f"{len(body) - unpacker.tell()} bytes after the value in the body")
    return value


def read_frames(data):
    out, pos = [], 0
    while pos < len(data):
        if len(data) - pos < 4:
            raise FormatError(f"{len(data) - pos} stray bytes at offset {pos}")
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        if n == 0:
            raise FormatError(f"empty frame at offset {pos}")
        body = data[pos + 4 : pos + 4 + n]
        if len(body) != n:
            raise FormatError(f"frame at offset {pos} announces {n} bytes, {len(body)} remain")
        value = unpack_one(body)
        if not isinstance(value, dict) or not isinstance(value.get("type"), str):
            raise FormatError(f"frame at offset {pos} is not a map with a string `type`")
        out.append(plain(value))
        pos += 4 + n
    return out


def read_output(data):
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=max(len(data), 1))
    unpacker.feed(data)
    out = []
    for rec in unpacker:
        keys = {"batch", "node", "weights_version", "weights_versions", "policy_lag", "data"}
        if not isinstance(rec, dict) or set(rec.keys()) != keys:
            raise FormatError(f"record {len(out)} is not a map of {', '.join(sorted(keys))}")
        out.append(plain(rec))
    if unpacker.tell() != len(data):
        raise FormatError(f"{len(data) - unpacker.tell()} trailing bytes")
    return out


def main(argv):
    if len(argv) != 3 or argv[1] not in ("frames", "output"):
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[2], "rb") as f:
        data = f.read()
    try:
        out = read_frames(data) if argv[1] == "frames" else read_output(data)
    except (FormatError, ValueError, msgpack.UnpackException) as e:
        print(f"msgpack_check: {argv[2]}: {e}", file=sys.stderr)
        return 1
    json.dump(out, sys.stdout, allow_nan=False)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
