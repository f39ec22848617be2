"""The bench's report: the table it prints, ``README.md`` (Markdown, against the goals) and
``bench.png`` (torch/ours per case and both sides' share of the FMA peak)."""

from __future__ import annotations

import os
import platform
import re
import time
from pathlib import Path
from typing import Sequence

import tvm
from tvm.target import Target

from ...isa import isa_plan
from ..peak import FmaPeak
from .results import BenchResult, geomean, peak_fractions, peak_gflops

__all__ = ["APIS", "GOALS", "describe_isas", "environment", "format_table", "markdown_report", "plot"]

APIS = {
    "tbe": "float16 inputs in 5HD/FracZ (TBE's DSL), float32 accumulation",
    "onednn": "oneDNN Graph ConvolutionBackwardWeights / ConvolutionBackwardData / Convolution: float32 NXC activations, XIO weights, float32 accumulation",
}
"""The operator API ours is called through (``--api``), as the report describes it."""


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
        ax.set_title(f"{op} N={batch}: geomean {geomean(ratios):.2f}", fontsize=9)
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


def describe_isas(target: Target, results: Sequence[BenchResult]) -> dict[str, str]:
    import torch

    plan = isa_plan(target)
    impls = sorted({r.torch_impl for r in results})
    return {
        "ours": f"{plan.name} (LLVM mcpu {target.attrs.get('mcpu', '')}, {plan.registers} x {plan.vector_bits}-bit registers)",
        "torch": f"ATen {torch.backends.cpu.get_cpu_capability()}, oneDNN {', '.join(impls)}",
    }


GOALS = {"resnet50": 1.3, "depthwise": 1.2, "dilated": 1.2, "grouped": None, "conv3d": None, "resnet50 fwd": 1.2}
"""Geomean torch/ours each case kind aims at (ResNet-50: per gradient and batch; its forward 1.2)."""


def goal(key: str) -> float | None:
    """The goal of a summary key ``"<kind> <op> N=<batch>"``: the kind's and op's, else the kind's."""
    kind, op, _ = key.split()
    return GOALS.get(f"{kind} {op}", GOALS.get(kind))


def markdown_report(record: dict) -> str:
    """The run as Markdown: where and how it ran, one row per case, the summary against the goals."""
    env, isa = record["environment"], record["isa"]
    peak = max(p["gflops"] for p in record["fma_peak"])
    dtype = record["settings"].get("dtype", "float32")
    bf16 = record.get("bf16_peak")
    if dtype != "bfloat16":
        bf16_line = []
    elif bf16:
        bf16_line = [f"* bf16 roofline: the measured `vdpbf16ps` dot-product peak, {bf16['gflops']:.0f} GFLOP/s (`bench.json`: each case's "
                     "`ours_bf16_peak_fraction`); ours runs bf16 on `vdpbf16ps`"]  # fmt: skip
    else:
        bf16_line = ["* bf16: this target runs no bf16 on `vdpbf16ps` (no AVX512-BF16, or an Intel core's, at half the fp32 FMAs' "
                     "rate), so no bf16 peak was measured; ours runs bf16 widened to fp32 FMAs (the fp32 peak is its roofline)"]  # fmt: skip
    torch_type = "float32" if dtype == "float32" else dtype
    lines = [
        f"# tvm_convgrad vs PyTorch, {isa['name']} ({env['time']})",
        "",
        f"`tvm-convgrad bench --isa {isa['name']}` on {env['cpu']} ({env['cores']} cores, host LLVM CPU "
        f"`{env['host_llvm_mcpu']}`), TVM {env['tvm']}, PyTorch {env['torch']}.",
        "",
        f"* ours: {isa['ours']}; {APIS[record['settings'].get('api', 'tbe')]}" + (f", {dtype}" if dtype != "float32" else ""),
        f"* PyTorch: {isa['torch']} (ATen capability {env['torch_cpu_capability']}); {torch_type} "
        f"{'channels-last' if record['settings'].get('api') == 'onednn' else 'NCHW'} "
        f"{'`torch.nn.grad`' if set(record['settings'].get('ops', [])) - {'forward'} else '`torch.nn.functional.conv2d`'}",
        f"* roofline: the measured fp32 FMA peak, {peak:.0f} GFLOP/s "
        f"({record['fma_peak'][0]['accumulators']} x {record['fma_peak'][0]['lanes']}-lane accumulators per core, all cores, best sample before / after the run)",
        *bf16_line,
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
        aim = goal(key)
        lines.append(f"| {key} | **{s['geomean_ratio']:.2f}** | {s['min_ratio']:.2f} ({s['min_case']}) | {f'>= {aim}' if aim else '-'} |")
    tuned = [(k, s) for k, s in record["summary"].items() if "geomean_tuned_speedup" in s]
    if tuned:
        where = record["settings"].get("schedules")
        lines += ["", f"Tuned schedules (`--schedule tuned`, records: `{where}`), timed interleaved with the default:", "",
                  "| cases | kernels with a record | geomean default/tuned time |", "|---|---|---|"]  # fmt: skip
        lines += [f"| {k} | {s['tuned_cases']} of {s['cases']} | **{s['geomean_tuned_speedup']:.3f}** |" for k, s in tuned]
    fractions = record["resnet50_3x3_s1_n8_peak_fraction"]
    if fractions:
        lines += ["", f"ResNet-50 3x3 stride-1 layers at N=8: **{min(fractions.values()):.0%}-{max(fractions.values()):.0%}** of the measured FMA peak (goal >= 75%)."]
    bf16_fractions = record.get("resnet50_3x3_s1_n8_bf16_peak_fraction")
    if bf16_fractions:
        lines += ["", f"The same layers: **{min(bf16_fractions.values()):.0%}-{max(bf16_fractions.values()):.0%}** of the measured bf16 dot-product peak (goal >= 80%)."]
    return "\n".join(lines) + "\n"
