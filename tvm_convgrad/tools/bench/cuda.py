"""``tvm-convgrad bench --target cuda``: the tensor-core kernels against PyTorch's CUDA kernels (cuDNN).

For every case of the benchmark shape set and each gradient, on this machine's GPU:

* ours: the DSL kernel built for the GPU's arch (float16 inputs in TBE layouts, float32
  accumulation, the result in the TBE result layout), first checked against the float64
  reference (:func:`~tvm_convgrad.tools.verify.check_kernel`: a kernel that computes the wrong thing is
  not timed, it is named in the report and the command exits with status 1);
* PyTorch: ``torch.nn.grad.conv2d_weight`` / ``conv2d_input`` on float16 NCHW CUDA tensors —
  cuDNN, with ``torch.backends.cudnn.benchmark`` on so that it first picks its fastest algorithm
  for the shape;

both timed alike (:func:`sample_cuda`): one call to warm up, then CUDA events around as many
back-to-back calls as fill a sample of >= 0.15 s, on the default stream both runtimes launch on;
interleaved, medians of ``rounds`` samples, and the ratio torch / ours (> 1: ours is faster). The goal on the ResNet-50 cases is a geomean >= 1.0 per gradient and batch.
A GPU is needed: on a machine without one the command says so (the kernels' structure is checked
without a GPU by the test suite: ptxas, GPU verification, the CPU emulation).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import tvm

from ...compile import build, resolve_target
from . import cuda_remote
from .cases import OPS, BenchCase, load_cases, tbe_result
from .measure import SAMPLE_SECONDS, torch_call
from .results import BenchFailure, BenchResult, CheckFailed, checked, geomean, summarize

__all__ = ["CUDA_GOAL", "cuda_available", "gpu_name", "launch", "main", "run_cuda_bench", "sample_cuda"]

CUDA_GOAL = 1.0
"""Geomean torch / ours the ResNet-50 cases aim at, per gradient and batch."""


def cuda_available() -> str | None:
    """None when both TVM and PyTorch can run on a CUDA GPU here, else why not."""
    import torch

    if not (tvm.runtime.enabled("cuda") and tvm.cuda(0).exist):
        return "TVM finds no CUDA GPU on this machine (tvm.cuda(0) does not exist)"
    if not torch.cuda.is_available():
        return f"PyTorch {torch.__version__} cannot use the GPU (a CPU-only build, or no driver)"
    return None


def gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name()


def sample_cuda(call: Callable[[], object]) -> float:
    """Seconds per call of ``call`` on the GPU: CUDA events around as many back-to-back calls as
    fill SAMPLE_SECONDS (after one call to warm up); the runner's :func:`.cuda_remote.sample`, which
    must stay importable without the package, is the one copy."""
    return cuda_remote.sample(call, "cuda", SAMPLE_SECONDS)


def run_cuda_bench(cases: Sequence[BenchCase], ops: Sequence[str], rounds: int = 5, progress: bool = True
                   ) -> tuple[list[BenchResult], list[BenchFailure]]:  # fmt: skip
    """Build, check and time every (case, op) on this GPU, ours and cuDNN interleaved, both with
    CUDA events (:func:`sample_cuda`); a kernel that does not match the reference is not timed."""
    import torch
    from tqdm import tqdm

    try:
        torch.backends.cudnn.benchmark = True  # cuDNN's fastest algorithm per shape, as a PyTorch user runs it
    except RuntimeError:  # the flags are frozen (torch.testing._internal was imported): the caller's setting stays
        pass
    target = resolve_target("cuda")  # this GPU's arch
    rng = np.random.default_rng(0)
    impl = f"cuDNN {torch.backends.cudnn.version()}"
    results, failures = [], []
    bar = tqdm([(c, op) for c in cases for op in ops], disable=not progress, unit="kernel", dynamic_ncols=True)
    for case, op in bar:
        bar.set_description(f"{OPS[op]} {case.name}")
        start = time.perf_counter()
        kernel = build(tbe_result(case, op), target=target, schedules=None)
        compile_s = time.perf_counter() - start
        check = checked(kernel, case.name, OPS[op], failures)
        if check is None:
            continue
        ours = launch(kernel, rng)
        call = torch_call(case, op, rng, device="cuda", dtype=torch.float16)
        ours_t, torch_t = [], []
        for _ in range(rounds):
            ours_t.append(sample_cuda(ours))
            torch_t.append(sample_cuda(call))
        results.append(BenchResult(
            case.name, case.kind, case.N, OPS[op], case.flops, f"{case.KH}x{case.KW}/s{case.stride[0]}", compile_s,
            statistics.median(ours_t) * 1e3, statistics.median(torch_t) * 1e3, [t * 1e3 for t in ours_t],
            [t * 1e3 for t in torch_t], f"{impl}, {kernel.units}", max_rel_err=check.relative_error, bound_ratio=check.worst_ratio,
        ))  # fmt: skip
        bar.set_postfix(ratio=f"{results[-1].ratio:.2f}")
    return results, failures


def launch(kernel, rng: np.random.Generator) -> Callable[[], None]:
    """One launch of ``kernel`` on random device arrays (no copies, no synchronisation: the caller
    times it as it times PyTorch's calls)."""
    dev = kernel.device
    args = [tvm.runtime.tensor(rng.uniform(-1, 1, a.shape).astype(a.dtype), dev) for a in kernel.inputs]
    args.append(tvm.runtime.empty(kernel.output.shape, kernel.output.dtype, dev))
    function = kernel.function
    return lambda: function(*args)


def format_table(results: Sequence[BenchResult], summary: dict, gpu: str) -> str:
    lines = [
        f"GPU: {gpu}   ours: tensor-core / SIMT kernels (f16 inputs, f32 accumulation)   PyTorch: cuDNN, f16 NCHW",
        f"{'case':42s} {'op':5s} {'ours ms':>9s} {'torch ms':>9s} {'torch/ours':>10s} {'ours TF/s':>9s} {'torch TF/s':>10s} {'units':>24s}",
    ]
    for r in results:
        lines.append(
            f"{r.case:42s} {r.op:5s} {r.ours_ms:9.4f} {r.torch_ms:9.4f} {r.ratio:10.2f} {r.ours_gflops / 1e3:9.2f} "
            f"{r.torch_gflops / 1e3:10.2f} {r.torch_impl:>24s}"
        )
    for key, s in summary.items():
        goal = f"  (goal {CUDA_GOAL})" if key.startswith("resnet50") else ""
        lines.append(f"{key:24s} geomean torch/ours {s['geomean_ratio']:5.2f}  min {s['min_ratio']:5.2f} ({s['min_case']}){goal}")
    return "\n".join(lines)


def main(suite: str, batches: Sequence[int], ops: Sequence[str], pattern: str | None, rounds: int, out_dir: Path, progress: bool = True) -> dict:
    """Run on this GPU, print the table, write ``bench.json`` under ``out_dir``; returns the summary.
    Raises ValueError when the selection is empty or there is no GPU to run on."""
    cases = load_cases(suite, batches, pattern)
    if not cases:
        raise ValueError(f"no benchmark case matches suite={suite!r}, batches={list(batches)}, filter={pattern!r}")
    if any(c.rank != 2 for c in cases):
        raise ValueError("--target cuda: the TBE DSL is 2-D; the conv3d suite runs on the CPU (--api onednn)")
    missing = cuda_available()
    if missing:
        raise ValueError(f"--target cuda needs a CUDA GPU: {missing}. Without one, the test suite checks the CUDA kernels' "
                         "structure (ptxas, GPU verification, CPU emulation); their speed is unmeasured")  # fmt: skip
    import torch

    results, failures = run_cuda_bench(cases, ops, rounds, progress)
    summary = summarize(results)
    gpu = gpu_name()
    print(format_table(results, summary, gpu))
    out_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "environment": {"gpu": gpu, "arch": str(resolve_target("cuda").attrs["arch"]), "tvm": tvm.__version__, "torch": torch.__version__,
                        "cudnn": torch.backends.cudnn.version()},
        "settings": {"suite": suite, "batches": list(batches), "ops": list(ops), "filter": pattern, "rounds": rounds},
        "summary": summary,
        "geomean_ratio": geomean([r.ratio for r in results]),
        "results": [asdict(r) | {"ratio": r.ratio, "ours_gflops": r.ours_gflops, "torch_gflops": r.torch_gflops} for r in results],
        "failed": [asdict(f) for f in failures],
    }  # fmt: skip
    (out_dir / "bench.json").write_text(json.dumps(record, indent=1))
    print(f"wrote {out_dir / 'bench.json'}")
    if failures:
        raise CheckFailed(failures)
    return summary
