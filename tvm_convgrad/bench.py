"""``tvm-convgrad bench``: the package's kernels against PyTorch's oneDNN kernels, one ISA, one run.

For every case of the benchmark shape set (``data/bench_shapes.json``: ResNet-50 v1.5 from
oneDNN's benchdnn, a ResNeXt grouped conv, MobileNetV2 depthwise, a dilated conv; N = 1 and 8)
and each gradient:

* ours: float16 inputs in TBE layouts (5HD / FracZ), float32 accumulation, compile excluded,
  built for the chosen vector ISA (``--isa native|avx2|avx512``: :func:`~tvm_convgrad.isa_target`);
  with ``--api onednn`` the weight gradient through the oneDNN Graph frontend instead
  (``ConvolutionBackwardWeights``: float32 NXC inputs, XIO result, PyTorch in channels-last);
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

import ctypes
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import tvm

from tvm.target import Target

from tvm import te

from . import dsl, layout, usable_cores
from .build import SHIPPED, Kernel, build, isa_target
from .dsl.compute import cube_util
from .frontends import onednn
from .peak import FmaPeak, FmaProbe
from .schedule.isa import host_can_run, isa_plan
from .tvm import placeholder
from .verify import Check, check_kernel

__all__ = [
    "APIS", "BenchCase", "BenchFailure", "BenchResult", "CheckFailed", "GOALS", "ISAS", "TORCH_ISA_CAPS", "load_cases", "main", "markdown_report", "onednn_result",
    "run_bench", "summarize",
]  # fmt: skip

ISAS = ("native", "avx2", "avx512")
APIS = {
    "tbe": "float16 inputs in 5HD/FracZ (TBE's DSL), float32 accumulation",
    "onednn": "oneDNN Graph ConvolutionBackwardWeights: float32 NXC inputs, XIO result, float32 accumulation",
}
"""The operator API ours is called through (``--api``), as the report describes it."""
TORCH_ISA_CAPS = {
    "native": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
}
"""Environment that caps PyTorch (ATen's kernels and oneDNN's) to one ISA; read when torch loads."""

SAMPLE_SECONDS = 0.15
QUIET = 0.85  # a sample waits until the FMA probe reaches this share of the run's peak
QUIET_PROBE_MS = 15
QUIET_WAIT_SECONDS = 20.0
PAUSE_SECONDS = 0.25  # > the ~0.1-0.3 s that idle TVM (300k yields) and libgomp workers spin
OPS = {"filter": "wgrad", "input": "dgrad"}


@dataclass(frozen=True)
class BenchCase:
    """One convolution of the shape set (NCHW, PyTorch conventions, symmetric pads). A 3-D one
    (kind ``conv3d``, NCDHW) adds ``D``, ``KD``, ``OD``; its ``stride`` / ``pad`` / ``dilation``
    then have three entries, depth first."""

    name: str
    kind: str
    N: int
    Cin: int
    H: int
    W: int
    Cout: int
    KH: int
    KW: int
    stride: tuple[int, int]
    pad: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    OH: int
    OW: int
    count: int = 1
    D: int = 1
    KD: int = 1
    OD: int = 1

    @property
    def rank(self) -> int:
        """Spatial rank: 2 or 3."""
        return len(self.stride)

    @property
    def flops(self) -> int:
        return 2 * self.N * self.Cout * (self.Cin // self.groups) * self.KD * self.KH * self.KW * self.OD * self.OH * self.OW

    @property
    def spatial(self) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """``(input, output, kernel)`` spatial extents, depth first in 3-D."""
        depth = self.rank == 3
        return (
            ((self.D,) if depth else ()) + (self.H, self.W),
            ((self.OD,) if depth else ()) + (self.OH, self.OW),
            ((self.KD,) if depth else ()) + (self.KH, self.KW),
        )

    @property
    def filter_sizes(self) -> list[int]:
        return [self.Cout, self.Cin // self.groups, *self.spatial[2]]

    @property
    def pads(self) -> list[int]:
        return [self.pad[0], self.pad[0], self.pad[1], self.pad[1]]


@dataclass
class BenchResult:
    case: str
    kind: str
    batch: int
    op: str  # "wgrad" | "dgrad"
    flops: int
    kernel: str  # "3x3/s1" (KHxKW/stride)
    compile_s: float
    ours_ms: float
    torch_ms: float
    ours_samples_ms: list[float] = field(default_factory=list)
    torch_samples_ms: list[float] = field(default_factory=list)
    torch_impl: str = ""  # the oneDNN implementation(s) PyTorch ran, e.g. "jit:avx2"
    tuned_ms: float | None = None  # with --schedule tuned: the kernel built from the tuning records
    tuned_schedule: str = ""  # "tuned:<database>", or "default" when no record matched
    max_rel_err: float = float("nan")  # max |ours - float64 reference| / max |reference|, checked before timing
    bound_ratio: float = float("nan")  # the largest elementwise |error| / allowed error (<= 1: within the bound)

    @property
    def tuned_speedup(self) -> float | None:
        """default time / tuned time (None unless the run timed a tuned kernel)."""
        return None if self.tuned_ms is None else self.ours_ms / self.tuned_ms

    @property
    def ratio(self) -> float:
        """torch time / our time: > 1 means ours is faster."""
        return self.torch_ms / self.ours_ms

    @property
    def ours_gflops(self) -> float:
        return self.flops / self.ours_ms / 1e6

    @property
    def torch_gflops(self) -> float:
        return self.flops / self.torch_ms / 1e6


@dataclass(frozen=True)
class BenchFailure:
    """A case whose kernel did not match the float64 reference: not timed, named in the report,
    and the command exits with status 1."""

    case: str
    op: str
    kernel: str  # which kernel: "default" or the tuned one's schedule
    check: str  # the check's verdict (errors, share of the bound)


class CheckFailed(RuntimeError):
    """Some cases of a bench run computed the wrong result (the others were timed and reported)."""

    def __init__(self, failures: Sequence[BenchFailure]):
        self.failures = list(failures)
        names = "; ".join(f"{f.case} {f.op} ({f.kernel}): {f.check}" for f in failures)
        super().__init__(f"{len(failures)} case(s) do not match the float64 reference and were not timed: {names}")


def checked(kernel: Kernel, case: str, op: str, failures: list[BenchFailure]) -> Check | None:
    """The kernel's check against the float64 reference (:func:`~tvm_convgrad.verify.check_kernel`),
    or None, with the failure recorded, when it does not match."""
    check = check_kernel(kernel)
    if check.ok:
        return check
    failures.append(BenchFailure(case, op, kernel.schedule, str(check)))
    return None


SUITES = ("resnet50", "all", "conv3d")
"""``resnet50``; ``all`` (every 2-D kind); ``conv3d`` (3-D layers, through ``--api onednn``)."""


def load_cases(suite: str = "resnet50", batches: Sequence[int] = (1, 8), pattern: str | None = None) -> list[BenchCase]:
    """Cases of the shape set: ``suite`` (:data:`SUITES`), batch sizes, a name regex."""
    text = resources.files("tvm_convgrad").joinpath("data/bench_shapes.json").read_text()
    cases = []
    for c in json.loads(text)["cases"]:
        wanted = {"all": c["kind"] != "conv3d", "resnet50": c["kind"] == "resnet50", "conv3d": c["kind"] == "conv3d"}
        if not wanted.get(suite, False):
            continue
        if c["N"] not in batches:
            continue
        if pattern and not re.search(pattern, c["name"]):
            continue
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in c.items() if k in BenchCase.__dataclass_fields__}
        cases.append(BenchCase(**fields))
    return cases


def tbe_result(case: BenchCase, op: str):
    """The DSL result tensor of one gradient of ``case`` (float16 inputs in TBE layouts)."""
    dy = placeholder(layout.shape_5hd(case.N, case.Cout, case.OH, case.OW), name="out_backprop", dtype="float16")
    para = {"strides": list(case.stride), "padding": case.pads, "dilations": [1, 1, *case.dilation]}
    name = re.sub(r"\W", "_", f"bench_{OPS[op]}_{case.name}")
    if op == "filter":
        x = placeholder(layout.shape_5hd(case.N, case.Cin, case.H, case.W), name="input_x", dtype="float16")
        return dsl.conv2d_backprop_filter(x, dy, case.filter_sizes, {**para, "groups": case.groups, "kernel_name": name})
    filters = placeholder(layout.shape_fracz(case.filter_sizes, case.groups), name="filters", dtype="float16")
    group_dict = cube_util.calculate_group(case.filter_sizes, case.groups)
    return dsl.conv2d_backprop_input(
        filters, dy, case.filter_sizes, [case.N, case.Cin, case.H, case.W], {**para, "group_dict": group_dict, "kernel_name": name}
    )


def onednn_result(case: BenchCase):
    """The weight gradient of ``case`` through the oneDNN Graph frontend (float32 NXC, XIO)."""
    size, out, kernel = case.spatial
    x = te.placeholder((case.N, *size, case.Cin), "float32", name="src")
    dy = te.placeholder((case.N, *out, case.Cout), "float32", name="diff_dst")
    return onednn.convolution_backward_weights(
        x, dy, [*kernel, case.Cin // case.groups, case.Cout], strides=list(case.stride), pads_begin=list(case.pad),
        pads_end=list(case.pad), dilations=list(case.dilation), groups=case.groups,
        kernel_name=re.sub(r"\W", "_", f"bench_onednn_{case.name}"),
    )  # fmt: skip


def _sample(fn: Callable[[], None]) -> float:
    """Seconds per call of ``fn``, averaged over as many calls as fill SAMPLE_SECONDS."""
    fn()
    calls, start = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= SAMPLE_SECONDS:
            return elapsed / calls


def _ours(kernel: Kernel, rng: np.random.Generator) -> Callable[[], float]:
    dev = kernel.device
    args = [tvm.runtime.tensor(rng.uniform(-1, 1, a.shape).astype(a.dtype), dev) for a in kernel.inputs]
    args.append(tvm.runtime.empty(kernel.output.shape, kernel.output.dtype, dev))
    evaluator = kernel.executable.mod.time_evaluator(kernel.name, dev, number=1, repeat=1, min_repeat_ms=int(SAMPLE_SECONDS * 1e3))
    return lambda: float(evaluator(*args).mean)


def _torch_call(case: BenchCase, op: str, rng: np.random.Generator, channels_last: bool = False, device: str = "cpu", dtype=None) -> Callable[[], object]:
    """PyTorch's gradient of ``case`` on random float32 NCHW tensors (channels-last, or on another
    ``device`` / ``dtype``: the CUDA bench's float16)."""
    import torch

    size, out, _ = case.spatial
    memory = (torch.channels_last if case.rank == 2 else torch.channels_last_3d) if channels_last else torch.contiguous_format

    def tensor(shape):
        return torch.from_numpy(rng.uniform(-1, 1, shape).astype("float32")).to(device=device, dtype=dtype)

    x = tensor((case.N, case.Cin, *size)).to(memory_format=memory)
    w = tensor(case.filter_sizes)
    dy = tensor((case.N, case.Cout, *out)).to(memory_format=memory)
    kw = {"stride": case.stride, "padding": case.pad, "dilation": case.dilation, "groups": case.groups}
    grad = torch.nn.grad
    if op == "filter":
        weight = grad.conv2d_weight if case.rank == 2 else grad.conv3d_weight
        return lambda: weight(x, w.shape, dy, **kw)
    return lambda: grad.conv2d_input(x.shape, w, dy, **kw)


def onednn_implementations(call: Callable[[], object]) -> str:
    """The oneDNN convolution implementations ``call`` runs (e.g. ``"jit:avx2"``), read from
    oneDNN's verbose log (written to file descriptor 1, captured here); ``"aten"`` if none."""
    import torch

    libc = ctypes.CDLL(None)
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 1)
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                call()
        finally:
            libc.fflush(None)
            os.dup2(saved, 1)
            os.close(saved)
        log.seek(0)
        text = log.read().decode(errors="replace")
    impls = {f[6] for f in (line.split(",") for line in text.splitlines()) if f[2:6] == ["primitive", "exec", "cpu", "convolution"]}
    return "+".join(sorted(impls)) or "aten"


class QuietGate:
    """Waits, before each sample, until the machine runs the FMA probe at >= ``QUIET`` of the
    run's peak (on a shared VM another tenant can take a core for seconds: a kernel timed then
    says nothing about the kernel). Gives up after ``QUIET_WAIT_SECONDS`` and counts it."""

    def __init__(self, probe: FmaProbe, peak: float):
        self.probe, self.peak, self.waited_s, self.gave_up = probe, peak, 0.0, 0

    def wait(self):
        start = time.perf_counter()
        while self.probe.sample(QUIET_PROBE_MS) < QUIET * self.peak:
            if time.perf_counter() - start > QUIET_WAIT_SECONDS:
                self.gave_up += 1
                break
            time.sleep(0.2)
        self.waited_s += time.perf_counter() - start


def run_bench(
    cases: Sequence[BenchCase], ops: Sequence[str], rounds: int = 5, progress: bool = True, target: Target | None = None,
    gate: QuietGate | None = None, api: str = "tbe", schedules: str | Path | None = None,
) -> tuple[list[BenchResult], list[BenchFailure]]:
    """Build (for ``target``, default this CPU), check against the float64 reference, and time
    every (case, op), ours and torch interleaved, each sample after ``gate`` says the machine is
    quiet; see the module docstring. A kernel that does not match the reference is not timed:
    it is returned as a :class:`BenchFailure`.
    ``api="onednn"``: the weight gradient through the oneDNN frontend (``ops`` must be filter).
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
        result_tensor = onednn_result(case) if api == "onednn" else tbe_result(case, op)
        kernel = build(result_tensor, target=target, schedules=None)
        compile_s = time.perf_counter() - start
        tuned = build(result_tensor, target=target, schedules=schedules) if schedules is not None else None
        check = checked(kernel, case.name, OPS[op], failures)
        if check is None or (tuned is not None and tuned is not kernel and checked(tuned, case.name, OPS[op], failures) is None):
            continue
        tuned_t: list[float] = []
        timed_tuned = _ours(tuned, rng) if tuned is not None else None
        call = _torch_call(case, op, rng, channels_last=api == "onednn")
        impl = onednn_implementations(call)
        ours, theirs = _ours(kernel, rng), lambda: _sample(call)
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


def _geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def summarize(results: Sequence[BenchResult]) -> dict[str, dict]:
    """Per (kind, op, batch): geometric mean and minimum of torch/ours, max compile time."""
    groups: dict[str, list[BenchResult]] = {}
    for r in results:
        groups.setdefault(f"{r.kind} {r.op} N={r.batch}", []).append(r)
    return {
        key: {
            "cases": len(rs),
            "geomean_ratio": _geomean([r.ratio for r in rs]),
            "min_ratio": min(r.ratio for r in rs),
            "min_case": min(rs, key=lambda r: r.ratio).case,
            "max_compile_s": max(r.compile_s for r in rs),
            **({"geomean_tuned_speedup": _geomean([r.tuned_speedup for r in rs]),
                "tuned_cases": sum(r.tuned_schedule.startswith("tuned") for r in rs)}
               if all(r.tuned_ms is not None for r in rs) else {}),
        }
        for key, rs in sorted(groups.items())
    }


def peak_gflops(peaks: Sequence[FmaPeak]) -> float:
    """The roofline of a run: the best of its FMA-peak measurements (before and after)."""
    return max(p.gflops for p in peaks)


def peak_fractions(results: Sequence[BenchResult], peak: float) -> dict[str, float]:
    """Our GFLOP/s over the measured FMA peak for the ResNet-50 3x3 stride-1 layers at N=8,
    per case and gradient."""
    return {
        f"{r.case} {r.op}": r.ours_gflops / peak
        for r in results
        if r.kind == "resnet50" and r.kernel == "3x3/s1" and r.batch == 8
    }


def format_table(results: Sequence[BenchResult], summary: dict, peaks: Sequence[FmaPeak], isas: dict) -> str:
    peak = peak_gflops(peaks)
    lines = [
        f"ours: {isas['ours']}   PyTorch: {isas['torch']}",
        f"{'case':42s} {'op':5s} {'ours ms':>9s} {'torch ms':>9s} {'torch/ours':>10s} {'ours GF/s':>9s} {'%peak':>6s} "
        f"{'torch GF/s':>10s} {'%peak':>6s} {'oneDNN':>22s} {'compile s':>9s} {'rel err':>8s}",
    ]
    for r in results:
        lines.append(
            f"{r.case:42s} {r.op:5s} {r.ours_ms:9.3f} {r.torch_ms:9.3f} {r.ratio:10.2f} {r.ours_gflops:9.1f} "
            f"{r.ours_gflops / peak:6.0%} {r.torch_gflops:10.1f} {r.torch_gflops / peak:6.0%} {r.torch_impl:>22s} {r.compile_s:9.2f} "
            f"{r.max_rel_err:8.1e}"
        )
    lines.append("")
    lines.append(f"{peaks[0]}; after the run {peaks[-1].gflops:.0f} GFLOP/s; roofline {peak:.0f} GFLOP/s")
    fractions = peak_fractions(results, peak)
    if fractions:
        worst = min(fractions, key=fractions.get)
        lines.append(
            f"ResNet-50 3x3 stride-1 layers at N=8: {min(fractions.values()):.0%}-{max(fractions.values()):.0%} "
            f"of the measured FMA peak (lowest: {worst})"
        )
    for key, s in summary.items():
        tuned = f"  tuned/default {s['geomean_tuned_speedup']:.3f} ({s['tuned_cases']} with a record)" if "geomean_tuned_speedup" in s else ""
        lines.append(
            f"{key:24s} geomean torch/ours {s['geomean_ratio']:5.2f}  min {s['min_ratio']:5.2f} ({s['min_case']})  "
            f"max compile {s['max_compile_s']:.2f} s  [{s['cases']} cases]{tuned}"
        )
    for r in results:
        if r.tuned_ms is not None:
            lines.append(f"  {r.case} {r.op}: default {r.ours_ms:.3f} ms, {r.tuned_schedule} {r.tuned_ms:.3f} ms ({r.tuned_speedup:.2f}x)")
    return "\n".join(lines)


def plot(results: Sequence[BenchResult], path: Path, title: str, peak: float):
    """Per (op, batch): torch/ours per case (bars), and both runtimes' share of the FMA peak."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r.op, r.batch) for r in results})
    fig, axes = plt.subplots(len(panels), 1, figsize=(14, 3.4 * len(panels)), squeeze=False)
    for ax, (op, batch) in zip(axes[:, 0], panels):
        rs = [r for r in results if (r.op, r.batch) == (op, batch)]
        ratios = [r.ratio for r in rs]
        ax.bar(range(len(rs)), ratios, color=["tab:green" if v >= 1 else "tab:red" for v in ratios])
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(rs)), [re.sub(r"^(resnet_50_v1_5|[a-z0-9_]+?)\.|\.n\d+$", "", r.case) for r in rs], rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("torch / ours (bars)")
        share = ax.twinx()
        share.plot(range(len(rs)), [100 * r.ours_gflops / peak for r in rs], "o", color="tab:blue", markersize=3, label="ours % of FMA peak")
        share.plot(range(len(rs)), [100 * r.torch_gflops / peak for r in rs], "x", color="tab:gray", markersize=4, label="torch % of FMA peak")
        share.set_ylim(0, 110)
        share.set_ylabel("% of FMA peak")
        share.legend(loc="upper right", fontsize=7)
        ax.set_title(f"{op} N={batch}: geomean {_geomean(ratios):.2f}", fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def environment(target: Target) -> dict:
    import torch

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "host_llvm_mcpu": tvm.target.codegen.llvm_get_system_cpu(),
        "target": str(target),
        "tvm": tvm.__version__,
        "torch": torch.__version__,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_isa_caps": {k: os.environ.get(k) for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")},
        "TVM_NUM_THREADS": os.environ.get("TVM_NUM_THREADS"),
        "torch_threads": torch.get_num_threads(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def _describe_isas(target: Target, results: Sequence[BenchResult]) -> dict[str, str]:
    import torch

    plan = isa_plan(target)
    impls = sorted({r.torch_impl for r in results})
    return {
        "ours": f"{plan.name} (LLVM mcpu {target.attrs.get('mcpu', '')}, {plan.registers} x {plan.vector_bits}-bit registers)",
        "torch": f"ATen {torch.backends.cpu.get_cpu_capability()}, oneDNN {', '.join(impls)}",
    }


GOALS = {"resnet50": 1.3, "depthwise": 1.2, "dilated": 1.2, "grouped": None, "conv3d": None}
"""Geomean torch/ours each case kind aims at (ResNet-50: per gradient and batch)."""


def markdown_report(record: dict) -> str:
    """The run as Markdown: where and how it ran, one row per case, the summary against the goals."""
    env, isa = record["environment"], record["isa"]
    peak = max(p["gflops"] for p in record["fma_peak"])
    lines = [
        f"# tvm_convgrad vs PyTorch, {isa['name']} ({env['time']})",
        "",
        f"`tvm-convgrad bench --isa {isa['name']}` on {env['cpu']} ({env['cores']} cores, host LLVM CPU "
        f"`{env['host_llvm_mcpu']}`), TVM {env['tvm']}, PyTorch {env['torch']}.",
        "",
        f"* ours: {isa['ours']}; {APIS[record['settings'].get('api', 'tbe')]}",
        f"* PyTorch: {isa['torch']} (ATen capability {env['torch_cpu_capability']}); float32 "
        f"{'channels-last' if record['settings'].get('api') == 'onednn' else 'NCHW'} `torch.nn.grad`",
        f"* roofline: the measured fp32 FMA peak, {peak:.0f} GFLOP/s "
        f"({record['fma_peak'][0]['accumulators']} x {record['fma_peak'][0]['lanes']}-lane accumulators per core, all cores, best sample before / after the run)",
        f"* medians of {record['settings']['rounds']} interleaved samples, each taken once an FMA probe showed the cores free "
        f"(>= {record['quiet_gate']['threshold']:.0%} of the peak; {record['quiet_gate']['waited_s']:.0f} s of waiting in all); raw numbers: `bench.json`; chart: `bench.png`",
        "* every kernel checked against the float64 reference before it was timed (`max rel err`: max |ours - reference| / "
        "max |reference|; every element within the bound of fp32 sums rounded once to the result's type)",
        "",
        "| case | op | kernel | ours ms | torch ms | torch/ours | ours GFLOP/s | % peak | torch GFLOP/s | % peak | oneDNN | compile s | max rel err |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in record["results"]:
        lines.append(
            f"| {r['case']} | {r['op']} | {r['kernel']} | {r['ours_ms']:.3f} | {r['torch_ms']:.3f} | {r['ratio']:.2f} | "
            f"{r['ours_gflops']:.1f} | {r['ours_peak_fraction']:.0%} | {r['torch_gflops']:.1f} | {r['torch_peak_fraction']:.0%} | "
            f"{r['torch_impl']} | {r['compile_s']:.2f} | {r['max_rel_err']:.1e} |"
        )
    for f in record.get("failed", []):
        lines.append(f"| {f['case']} | {f['op']} | **does not match the reference ({f['kernel']}): {f['check']}** | | | | | | | | | | |")
    lines += ["", "| cases | geomean torch/ours | lowest case | goal |", "|---|---|---|---|"]
    for key, s in record["summary"].items():
        goal = GOALS.get(key.split()[0])
        lines.append(f"| {key} | **{s['geomean_ratio']:.2f}** | {s['min_ratio']:.2f} ({s['min_case']}) | {f'>= {goal}' if goal else '-'} |")
    tuned = [(k, s) for k, s in record["summary"].items() if "geomean_tuned_speedup" in s]
    if tuned:
        where = record["settings"].get("schedules")
        lines += ["", f"Tuned schedules (`--schedule tuned`, records: `{where}`), timed interleaved with the default:", "",
                  "| cases | kernels with a record | geomean default/tuned time |", "|---|---|---|"]  # fmt: skip
        lines += [f"| {k} | {s['tuned_cases']} of {s['cases']} | **{s['geomean_tuned_speedup']:.3f}** |" for k, s in tuned]
    fractions = record["resnet50_3x3_s1_n8_peak_fraction"]
    if fractions:
        lines += ["", f"ResNet-50 3x3 stride-1 layers at N=8: **{min(fractions.values()):.0%}-{max(fractions.values()):.0%}** of the measured FMA peak (goal >= 75%)."]
    return "\n".join(lines) + "\n"


def _cli_args(suite, batches, ops, pattern, rounds, out_dir, progress, isa, api, schedule, schedules) -> list[str]:
    args = ["bench", "--suite", suite, "--batch", "all" if len(batches) > 1 else str(batches[0])]
    args += ["--op", "both" if len(ops) > 1 else ops[0], "--rounds", str(rounds), "--out", str(out_dir), "--isa", isa, "--api", api]
    args += ["--schedule", schedule] + (["--schedules", str(schedules)] if schedules else [])
    return args + (["--filter", pattern] if pattern else []) + ([] if progress else ["--no-progress"])


def main(
    suite: str, batches: Sequence[int], ops: Sequence[str], pattern: str | None, rounds: int, out_dir: Path,
    progress: bool = True, isa: str = "native", api: str = "tbe", schedule: str = "default", schedules: str | None = None,
) -> dict:  # fmt: skip
    """Run, print the table, write ``bench.json``, ``README.md`` (the report) and ``bench.png``
    under ``out_dir``; returns the summary.

    ``isa`` (``native``, ``avx2``, ``avx512``) picks the vector ISA of both sides: ours is built
    for it and PyTorch capped to it before it loads (in a child process if torch is already
    loaded here with other settings). ``api`` (``tbe``, ``onednn``): the operator API ours is
    called through; ``onednn`` times the weight gradient only."""
    if isa not in ISAS:
        raise ValueError(f"--isa {isa!r}: must be one of {', '.join(ISAS)}")
    if api not in APIS:
        raise ValueError(f"--api {api!r}: must be one of {', '.join(APIS)}")
    if api == "onednn" and list(ops) != ["filter"]:
        raise ValueError("--api onednn: the oneDNN operators are weight gradients: use --op filter")
    if schedule not in ("default", "tuned"):
        raise ValueError(f"--schedule {schedule!r}: must be default or tuned")
    if suite not in SUITES:
        raise ValueError(f"--suite {suite!r}: must be one of {', '.join(SUITES)}")
    if suite == "conv3d" and api != "onednn":
        raise ValueError("--suite conv3d: TBE's DSL is 2-D; the 3-D layers run through --api onednn --op filter")
    target = isa_target(isa)
    if not host_can_run(target):
        raise ValueError(f"--isa {isa}: this machine cannot run {isa_plan(target).name} code (its CPU lacks the instructions)")
    cases = load_cases(suite, batches, pattern)
    if not cases:
        raise ValueError(f"no benchmark case matches suite={suite!r}, batches={list(batches)}, filter={pattern!r}")
    caps = TORCH_ISA_CAPS[isa]
    if any(os.environ.get(k) != v for k, v in caps.items()):
        if "torch" in sys.modules:  # too late to cap it here: run the bench where torch has not loaded
            command = [sys.executable, "-m", "tvm_convgrad.cli", *_cli_args(suite, batches, ops, pattern, rounds, out_dir, progress, isa, api, schedule, schedules)]
            if subprocess.run(command, env={**os.environ, **caps}).returncode != 0:
                raise RuntimeError(f"the benchmark child process failed: {' '.join(command)}")
            return json.loads((out_dir / "bench.json").read_text())["summary"]
        os.environ.update(caps)
    probe = FmaProbe(target)
    peaks = [probe.measure()]
    gate = QuietGate(probe, peaks[0].gflops)
    records = (schedules or SHIPPED) if schedule == "tuned" else None
    results, failures = run_bench(cases, ops, rounds, progress, target, gate, api, records)
    peaks.append(probe.measure())
    summary = summarize(results)
    isas = _describe_isas(target, results)
    print(format_table(results, summary, peaks, isas))
    print(f"quiet gate: waited {gate.waited_s:.0f} s in all for the machine to be quiet; gave up {gate.gave_up} times")
    out_dir.mkdir(parents=True, exist_ok=True)
    peak = peak_gflops(peaks)
    record = {
        "environment": environment(target),
        "isa": {"name": isa, **isas},
        "settings": {"suite": suite, "batches": list(batches), "ops": list(ops), "filter": pattern, "rounds": rounds, "api": api,
                     "schedule": schedule, "schedules": str(records) if records else None},
        "quiet_gate": {"threshold": QUIET, "waited_s": round(gate.waited_s, 1), "gave_up": gate.gave_up},
        "fma_peak": [asdict(p) | {"gflops": p.gflops} for p in peaks],
        "summary": summary,
        "resnet50_3x3_s1_n8_peak_fraction": peak_fractions(results, peak),
        "failed": [asdict(f) for f in failures],
        "results": [
            asdict(r) | {"ratio": r.ratio, "ours_gflops": r.ours_gflops, "torch_gflops": r.torch_gflops,
                         "ours_peak_fraction": r.ours_gflops / peak, "torch_peak_fraction": r.torch_gflops / peak}
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
