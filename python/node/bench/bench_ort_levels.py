"""onnxruntime's graph optimisation on the node's models: one session per level, the same
inputs, best of 5 rounds of 300 runs each, in one process (the ratio is what counts; the
machine is shared). The Python node builds its sessions at ``ORT_ENABLE_ALL`` with the weights
written into the model (``onnx_policy._Session``); ``ORT_DISABLE_ALL`` is what it did before,
to keep ``add_initializer`` overrides valid.

    python python/node/bench/bench_ort_levels.py [MODEL.onnx ...]
"""

import sys
import time

import numpy as np
import onnxruntime as ort

DEFAULT = ["tests/fixtures/onnx/cartpole_tanh_mlp_64.onnx", "tests/fixtures/onnx/image_u8_cnn.onnx"]
LEVELS = [("disable_all", ort.GraphOptimizationLevel.ORT_DISABLE_ALL), ("enable_all", ort.GraphOptimizationLevel.ORT_ENABLE_ALL)]


def session(path, level):
    o = ort.SessionOptions()
    o.intra_op_num_threads = 1
    o.inter_op_num_threads = 1
    o.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    o.graph_optimization_level = level
    o.log_severity_level = 3
    return ort.InferenceSession(path, sess_options=o, providers=["CPUExecutionProvider"])


def seconds_per_run(s, rows=16):
    feeds = {}
    for inp in s.get_inputs():
        shape = tuple(d if isinstance(d, int) else rows for d in inp.shape)
        u8 = "uint8" in inp.type
        feeds[inp.name] = (np.random.default_rng(0).random(shape) * (255 if u8 else 1)).astype(np.uint8 if u8 else np.float32)
    for _ in range(20):
        s.run(None, feeds)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(300):
            s.run(None, feeds)
        best = min(best, (time.perf_counter() - t) / 300)
    return best


def main(paths):
    for path in paths or DEFAULT:
        t = {name: seconds_per_run(session(path, level)) for name, level in LEVELS}
        shown = ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in t.items())
        print(f"{path}: {shown}; enable_all is {t['disable_all'] / t['enable_all']:.2f}x as fast")


if __name__ == "__main__":
    main(sys.argv[1:])
