"""A long process (``tests/test_soak.py`` runs it as a child): many distinct kernels built, run and
checked in one process, cached kernels called from two threads at once, memory watched.

    python tests/soak.py KERNELS [SEED]

Draws random valid calls of every operator in turn (``tests/random_cases.py``; each workload
once), builds each with the default kernel cache (:func:`tvm_convgrad.build`, the 256 most recent
kept), calls it :data:`CALLS` times and checks every result against the float64 reference. After
every :data:`THREADS_EVERY` kernels, :data:`SHARED` of the kernels built so far are called from
two Python threads at once, each thread on inputs of its own, and every result checked. Prints a
JSON line per :data:`SAMPLE_EVERY` kernels (``kernels``, ``rss_mb``, ``seconds``) and one
``summary`` line at the end; exits non-zero on the first wrong result or exception.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import tvm_ffi

sys.path.insert(0, str(Path(__file__).parent))

from random_cases import OPERATORS, inputs_and_expected, valid_case, valid_result  # noqa: E402
from tvm_convgrad import Workload, build, resolve_target  # noqa: E402

CALLS = 3
THREADS_EVERY = 50
SHARED = 8
SAMPLE_EVERY = 100


def _check(label: str, result: np.ndarray, expected: np.ndarray, bound: np.ndarray):
    assert result.shape == expected.shape, f"{label}: shape {result.shape} != {expected.shape}"
    ratio = float((np.abs(result.astype(np.float64) - expected) / bound).max())
    assert ratio <= 1.0, f"{label}: error {ratio:.3g} x the bound"


def _from_two_threads(kernels: list) -> None:
    """Every kernel of ``kernels`` called from two threads at once, each on inputs of its own."""
    errors: list[str] = []
    barrier = threading.Barrier(2)

    def run(thread: int):
        barrier.wait()
        for label, op, case, kernel in kernels:
            try:
                inputs, expected, bound = inputs_and_expected(op, case, kernel, seed=100 + thread)
                for _ in range(CALLS):
                    _check(f"{label} (thread {thread})", kernel(*inputs), expected, bound)
            except Exception as err:  # noqa: BLE001 - reported by the main thread
                errors.append(f"{label} (thread {thread}): {type(err).__name__}: {err}")

    threads = [threading.Thread(target=run, args=(t,)) for t in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, "\n".join(errors[:5])


def main(count: int, seed: int) -> None:
    process, target = psutil.Process(), resolve_target("llvm")
    start, seen, built, index = time.perf_counter(), set(), [], 0
    samples = [{"kernels": 0, "rss_mb": process.memory_info().rss / 2**20, "seconds": 0.0}]
    peak = samples[0]["rss_mb"]
    while len(built) < count:
        op = OPERATORS[index % len(OPERATORS)]
        case = valid_case(op, np.random.default_rng([seed, index]))
        index += 1
        result = valid_result(op, case)
        key = tvm_ffi.structural_hash(Workload.of(result).prim_func(target))
        if key in seen:
            continue
        seen.add(key)
        label = f"kernel {len(built)} ({op}, draw {index - 1})"
        kernel = build(result)
        inputs, expected, bound = inputs_and_expected(op, case, kernel, seed=len(built))
        for _ in range(CALLS):
            _check(label, kernel(*inputs), expected, bound)
        built.append((label, op, case))
        if len(built) % THREADS_EVERY == 0:  # earlier kernels, from the cache where they still are
            rng = np.random.default_rng(len(built))
            chosen = [built[int(i)] for i in rng.choice(len(built), size=min(SHARED, len(built)), replace=False)]
            _from_two_threads([(lbl, o, c, build(valid_result(o, c))) for lbl, o, c in chosen])
        rss = process.memory_info().rss / 2**20
        peak = max(peak, rss)
        if len(built) % SAMPLE_EVERY == 0:
            samples.append({"kernels": len(built), "rss_mb": rss, "seconds": time.perf_counter() - start})
            print(json.dumps(samples[-1]), flush=True)
    half = samples[len(samples) // 2]
    growth = (samples[-1]["rss_mb"] - half["rss_mb"]) / max(1, samples[-1]["kernels"] - half["kernels"]) * 1000
    print(json.dumps({"summary": True, "kernels": len(built), "draws": index, "peak_rss_mb": peak, "first_rss_mb": samples[0]["rss_mb"],
                      "rss_mb_at": {s["kernels"]: round(s["rss_mb"]) for s in samples}, "second_half_mb_per_1000_kernels": growth,
                      "seconds": time.perf_counter() - start}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 20261127)
