"""``tvm-convgrad bench``: the package's kernels against PyTorch's oneDNN kernels, one ISA, one run.

For every case of the benchmark shape set (``data/bench_shapes.json``: ResNet-50 v1.5 from
oneDNN's benchdnn, a ResNeXt grouped conv, MobileNetV2 depthwise, a dilated conv; N = 1 and 8)
and each gradient:

* ours: float16 inputs in TBE layouts (5HD / FracZ), float32 accumulation, compile excluded,
  built for the chosen vector ISA (``--isa native|avx2|avx512``: :func:`~tvm_convgrad.isa_target`);
  with ``--api onednn`` the gradients through the oneDNN Graph frontend instead
  (``ConvolutionBackwardWeights`` / ``ConvolutionBackwardData``: float32 NXC activations, XIO
  weights, PyTorch in channels-last);
* PyTorch: float32 NCHW ``torch.nn.grad.conv2d_weight`` / ``conv2d_input`` on all cores, capped
  to the same ISA before it loads (``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``; the bench
  runs in a child process when this one has already loaded torch), the oneDNN implementation
  each case ran (``jit:avx2``, ``brgconv:avx512_core``, ...) recorded from oneDNN's verbose log;

timed interleaved (each sample >= 0.15 s, a pause between the two runtimes, whose idle worker
threads would otherwise spin against each other, and a wait until a short FMA probe shows the
machine's cores free: :class:`QuietGate`), medians of ``rounds`` samples, and the ratio
torch / ours (> 1: ours is faster). The roofline is the machine's fp32 FMA peak for that ISA,
measured before and after with a register-only TVM kernel on every core (:mod:`..peak`); each
case reports its share of it. The machine is shared and noisy: only ratios from one run mean
anything.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import numpy as np
from tvm.target import Target

from ...compile import SHIPPED, build, isa_target
from ...isa import BENCH_ISAS, TORCH_ISA_CAPS, has_bf16_dot, host_can_run, isa_plan
from ...machine import usable_cores
from ..bf16_peak import measure_bf16_peak
from ..peak import FmaProbe
from .cases import OPS, SUITES, BenchCase, load_cases, onednn_result, tbe_result
from .measure import PAUSE_SECONDS, QUIET, QuietGate, onednn_implementations, sample, timed_ours, torch_call
from .report import APIS, describe_isas, environment, format_table, markdown_report, plot
from .results import BenchFailure, BenchResult, CheckFailed, checked, peak_fractions, peak_gflops, summarize

__all__ = ["BENCH_DTYPES", "main", "run_bench"]

BENCH_DTYPES = ("float32", "bfloat16")
"""The types ``--api onednn`` benches: both sides in float32, or both in bfloat16 (PyTorch's bf16
``conv2d_weight`` / ``conv2d_input``, oneDNN's ``avx512_core_bf16`` kernels where the CPU has them)."""


def run_bench(
    cases: Sequence[BenchCase], ops: Sequence[str], rounds: int = 5, progress: bool = True, target: Target | None = None,
    gate: QuietGate | None = None, api: str = "tbe", schedules: str | Path | None = None, dtype: str = "float32",
) -> tuple[list[BenchResult], list[BenchFailure]]:
    """Build (for ``target``, default this CPU), check against the float64 reference, and time
    every (case, op), ours and torch interleaved, each sample after ``gate`` says the machine is
    quiet; see the module docstring. A kernel that does not match the reference is not timed:
    it is returned as a :class:`BenchFailure`.
    ``api="onednn"``: the gradients through the oneDNN frontend, in ``dtype`` (float32 or
    bfloat16: then PyTorch's side is bf16 too).
    ``schedules`` (a database folder, or ``build.SHIPPED``): also time the kernel built from its
    records, interleaved with the default one (``BenchResult.tuned_ms``)."""
    import torch
    from tqdm import tqdm

    target = target or isa_target("native")
    quiet = gate.wait if gate else (lambda: None)
    torch.set_num_threads(usable_cores())
    rng = np.random.default_rng(0)
    results, failures = [], []
    bar = tqdm([(c, op) for c in cases for op in ops], disable=not progress, unit="kernel", dynamic_ncols=True)
    for case, op in bar:
        bar.set_description(f"{OPS[op]} {case.name}")
        start = time.perf_counter()
        result_tensor = onednn_result(case, op, dtype) if api == "onednn" else tbe_result(case, op)
        kernel = build(result_tensor, target=target, schedules=None)
        compile_s = time.perf_counter() - start
        tuned = build(result_tensor, target=target, schedules=schedules) if schedules is not None else None
        check = checked(kernel, case.name, OPS[op], failures)
        if check is None or (tuned is not None and tuned is not kernel and checked(tuned, case.name, OPS[op], failures) is None):
            continue
        tuned_t: list[float] = []
        timed_tuned = timed_ours(tuned, rng) if tuned is not None else None
        call = torch_call(case, op, rng, channels_last=api == "onednn", dtype=getattr(torch, dtype) if dtype != "float32" else None)
        impl = onednn_implementations(call)
        ours, theirs = timed_ours(kernel, rng), lambda: sample(call)
        ours_t, torch_t = [], []
        for _ in range(rounds):
            quiet()
            ours_t.append(ours())
            time.sleep(PAUSE_SECONDS)
            if timed_tuned is not None:
                quiet()
                tuned_t.append(timed_tuned())
                time.sleep(PAUSE_SECONDS)
            quiet()
            torch_t.append(theirs())
            time.sleep(PAUSE_SECONDS)
        strides = case.stride if len(set(case.stride)) > 1 else case.stride[:1]
        kernel_desc = "x".join(map(str, case.spatial[2])) + "/s" + "x".join(map(str, strides))
        result = BenchResult(
            case.name, case.kind, case.N, OPS[op], case.flops, kernel_desc, compile_s,
            statistics.median(ours_t) * 1e3, statistics.median(torch_t) * 1e3,
            [t * 1e3 for t in ours_t], [t * 1e3 for t in torch_t], impl,
            statistics.median(tuned_t) * 1e3 if tuned_t else None, tuned.schedule if tuned is not None else "",
            check.relative_error, check.worst_ratio,
        )  # fmt: skip
        results.append(result)
        bar.set_postfix(ratio=f"{result.ratio:.2f}")
    return results, failures



def cli_args(suite, batches, ops, pattern, rounds, out_dir, progress, isa, api, schedule, schedules, dtype="float32") -> list[str]:
    args = ["bench", "--suite", suite, "--batch", "all" if len(batches) > 1 else str(batches[0])]
    args += ["--op", "both" if len(ops) > 1 else ops[0], "--rounds", str(rounds), "--out", str(out_dir), "--isa", isa, "--api", api]
    args += ["--dtype", dtype]
    args += ["--schedule", schedule] + (["--schedules", str(schedules)] if schedules else [])
    return args + (["--filter", pattern] if pattern else []) + ([] if progress else ["--no-progress"])


def main(
    suite: str, batches: Sequence[int], ops: Sequence[str], pattern: str | None, rounds: int, out_dir: Path,
    progress: bool = True, isa: str = "native", api: str = "tbe", schedule: str = "default", schedules: str | None = None,
    dtype: str = "float32",
) -> dict:  # fmt: skip
    """Run, print the table, write ``bench.json``, ``README.md`` (the report) and ``bench.png``
    under ``out_dir``; returns the summary.

    ``isa`` (``native``, ``avx2``, ``avx512``) picks the vector ISA of both sides: ours is built
    for it and PyTorch capped to it before it loads (in a child process if torch is already
    loaded here with other settings). ``api`` (``tbe``, ``onednn``): the operator API ours is
    called through; ``dtype`` (``float32``, ``bfloat16``; onednn only) its type. A bf16 run also
    measures the bf16 dot-product peak where the target runs bf16 on ``vdpbf16ps`` (the roofline of
    its bf16 kernels: ``bf16_peak`` and each case's ``ours_bf16_peak_fraction``; not on Intel's
    cores, where the exact path's fp32 FMAs are the faster, :data:`~tvm_convgrad.isa.BF16_DOT_HALF_RATE`)."""
    if isa not in BENCH_ISAS:
        raise ValueError(f"--isa {isa!r}: must be one of {', '.join(BENCH_ISAS)}")
    if api not in APIS:
        raise ValueError(f"--api {api!r}: must be one of {', '.join(APIS)}")
    if schedule not in ("default", "tuned"):
        raise ValueError(f"--schedule {schedule!r}: must be default or tuned")
    if suite not in SUITES:
        raise ValueError(f"--suite {suite!r}: must be one of {', '.join(SUITES)}")
    if dtype not in BENCH_DTYPES:
        raise ValueError(f"--dtype {dtype!r}: must be one of {', '.join(BENCH_DTYPES)}")
    if dtype != "float32" and api != "onednn":
        raise ValueError(f"--dtype {dtype}: TBE's DSL takes float16; a {dtype} bench runs through --api onednn")
    if suite == "conv3d" and api != "onednn":
        raise ValueError("--suite conv3d: TBE's DSL is 2-D; the 3-D layers run through --api onednn")
    target = isa_target(isa)
    if not host_can_run(target):
        raise ValueError(f"--isa {isa}: this machine cannot run {isa_plan(target).name} code (its CPU lacks the instructions)")
    cases = load_cases(suite, batches, pattern)
    if not cases:
        raise ValueError(f"no benchmark case matches suite={suite!r}, batches={list(batches)}, filter={pattern!r}")
    caps = TORCH_ISA_CAPS[isa]
    if any(os.environ.get(k) != v for k, v in caps.items()):
        if "torch" in sys.modules:  # too late to cap it here: run the bench where torch has not loaded
            command = [sys.executable, "-m", "tvm_convgrad.cli", *cli_args(suite, batches, ops, pattern, rounds, out_dir, progress, isa, api, schedule, schedules, dtype)]
            if subprocess.run(command, env={**os.environ, **caps}).returncode != 0:
                raise RuntimeError(f"the benchmark child process failed: {' '.join(command)}")
            return json.loads((out_dir / "bench.json").read_text())["summary"]
        os.environ.update(caps)
    bf16_peak = measure_bf16_peak(target) if dtype == "bfloat16" and isa_plan(target).bf16_dot_pays else None
    probe = FmaProbe(target)
    peaks = [probe.measure()]
    gate = QuietGate(probe, peaks[0].gflops)
    records = (schedules or SHIPPED) if schedule == "tuned" else None
    results, failures = run_bench(cases, ops, rounds, progress, target, gate, api, records, dtype)
    peaks.append(probe.measure())
    summary = summarize(results)
    isas = describe_isas(target, results)
    print(format_table(results, summary, peaks, isas))
    if dtype == "bfloat16":
        print(bf16_peak if bf16_peak else f"bf16 dot-product peak: not measured ({isa_plan(target).name} target without "
              f"{'a fast ' if has_bf16_dot(target) else ''}AVX512-BF16: ours runs bf16 on fp32 FMAs, the fp32 peak is its roofline)")  # fmt: skip
    bf16_fractions = peak_fractions(results, bf16_peak.gflops) if bf16_peak else {}
    if bf16_fractions:
        print(f"ResNet-50 3x3 stride-1 layers at N=8: {min(bf16_fractions.values()):.0%}-{max(bf16_fractions.values()):.0%} of the bf16 dot-product peak")
    print(f"quiet gate: waited {gate.waited_s:.0f} s in all for the machine to be quiet; gave up {gate.gave_up} times")
    out_dir.mkdir(parents=True, exist_ok=True)
    peak = peak_gflops(peaks)
    record = {
        "environment": environment(target),
        "isa": {"name": isa, **isas},
        "settings": {"suite": suite, "batches": list(batches), "ops": list(ops), "filter": pattern, "rounds": rounds, "api": api,
                     "schedule": schedule, "schedules": str(records) if records else None, "dtype": dtype},
        "quiet_gate": {"threshold": QUIET, "waited_s": round(gate.waited_s, 1), "gave_up": gate.gave_up},
        "fma_peak": [asdict(p) | {"gflops": p.gflops} for p in peaks],
        "bf16_peak": asdict(bf16_peak) | {"gflops": bf16_peak.gflops} if bf16_peak else None,
        "summary": summary,
        "resnet50_3x3_s1_n8_peak_fraction": peak_fractions(results, peak),
        "resnet50_3x3_s1_n8_bf16_peak_fraction": bf16_fractions,
        "failed": [asdict(f) for f in failures],
        "results": [
            asdict(r) | {"ratio": r.ratio, "ours_gflops": r.ours_gflops, "torch_gflops": r.torch_gflops,
                         "ours_peak_fraction": r.ours_gflops / peak, "torch_peak_fraction": r.torch_gflops / peak}
            | ({"ours_bf16_peak_fraction": r.ours_gflops / bf16_peak.gflops, "torch_bf16_peak_fraction": r.torch_gflops / bf16_peak.gflops}
               if bf16_peak else {})
            for r in results
        ],
    }  # fmt: skip
    (out_dir / "bench.json").write_text(json.dumps(record, indent=1))
    (out_dir / "README.md").write_text(markdown_report(record))
    env = record["environment"]
    title = f"{env['cpu']} ({env['cores']} cores), measured FMA peak {peak:.0f} GFLOP/s\nours: {isas['ours']}\nPyTorch {env['torch']}: {isas['torch']}"
    if results:
        plot(results, out_dir / "bench.png", title, peak)
    print(f"wrote {out_dir / 'bench.json'}, {out_dir / 'README.md'} and {out_dir / 'bench.png'}")
    if failures:
        raise CheckFailed(failures)
    return summary
