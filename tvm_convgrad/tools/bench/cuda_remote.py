"""Check and time the kernels of a :mod:`.cuda_export` folder on this machine's GPU, against PyTorch.

Standalone, so that it runs where only TVM's runtime is installed (``TVM_USE_RUNTIME_LIB=1``): it
imports numpy, torch, TVM's runtime and the ``layout.py`` exported beside it, nothing of
``tvm_convgrad``. ``python cuda_remote.py DIR [--only RE] [--rounds 3] [--no-time] [--out FILE]``.

For every kernel of ``DIR/manifest.json``:

* **check**: NCHW / OIHW inputs drawn uniformly from [-1, 1] and rounded to float16, packed into
  the kernel's TBE layouts (5HD, FracZ); its result compared elementwise with PyTorch's gradient of
  the same inputs in float64 (``torch.nn.grad`` on the GPU), packed into the result's layout, within
  the bound of :func:`tvm_convgrad.tools.verify.error_bound` (``4 * K * 2**-24 + eps(result) *
  |reference|``). The whole result is compared, pads included, except the cross-group entries of a
  grouped (not depthwise) dW, which TBE fills and PyTorch has no counterpart of: there the
  per-group OIHW weights are. A kernel that fails is not timed, and the run exits with status 1.
* **time**: ours against PyTorch's float16 gradient on NCHW CUDA tensors (cuDNN,
  ``cudnn.benchmark`` on), as ``tvm-convgrad bench --target cuda`` times them: one call to warm up,
  CUDA events around as many back-to-back calls as fill a sample, interleaved, medians of
  ``rounds`` samples, ratio torch / ours (> 1: ours is faster). Where a call's GPU work is shorter
  than PyTorch's dispatch on the host (~30 us), that measures the host; so each side's GPU time per
  call (:func:`kernel_seconds`, CUPTI) is reported beside it.

``--device cpu`` runs a folder exported for ``llvm`` on this CPU (the test suite's check of the
runner itself; timing there uses wall clocks).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

EPS = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}
"""A result type's rounding, as in :mod:`tvm_convgrad.tools.verify`."""


def load_layout(folder: Path):
    """The exported ``layout.py`` (the package's own where the folder has none)."""
    path = folder / "layout.py"
    if not path.exists():
        from tvm_convgrad import layout

        return layout
    spec = importlib.util.spec_from_file_location("exported_tbe_layout", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def use_exported_fatbins(folder: Path, kernels: list[dict], arch: str) -> None:
    """Load TVM's CUDA runtime (a runtime-only TVM does not) and answer its compile callback with
    the fatbins the export compiled, so that nothing is compiled here (a source it did not
    compile, this machine's ``nvcc`` compiles, with a warning)."""
    import tvm
    import tvm_ffi

    if not tvm.runtime.enabled("cuda"):
        from tvm_ffi.libinfo import load_lib_ctypes

        runtime_dir = Path(tvm.base._LOADED_LIBS["tvm_runtime"]._name).resolve().parent
        load_lib_ctypes(package="tvm", target_name="tvm_runtime_cuda", extra_lib_paths=[runtime_dir], mode="RTLD_LOCAL")
    fatbins = {k["source_sha256"]: folder / f"{k['name']}.fatbin" for k in kernels}

    @tvm_ffi.register_global_func("tvm_callback_cuda_compile", override=True)
    def compile_cuda(code, *_):
        path = fatbins.get(hashlib.sha256(str(code).encode()).hexdigest())
        if path is not None:
            return path.read_bytes()
        print("warning: a CUDA source the export did not compile; compiling it with nvcc here", file=sys.stderr)
        with tempfile.TemporaryDirectory() as tmp:
            source, binary = Path(tmp, "kernel.cu"), Path(tmp, "kernel.fatbin")
            source.write_text(str(code))
            number = arch.removeprefix("sm_")
            subprocess.run(["nvcc", "--fatbin", "-O3", "-gencode", f"arch=compute_{number},code=sm_{number}", "--use_fast_math",
                            "-o", str(binary), str(source)], check=True)  # fmt: skip
            return binary.read_bytes()


def draw_inputs(k: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """NCHW ``x``, ``dy`` and OIHW ``w`` of kernel ``k``'s case, float16."""
    shapes = {"x": (k["N"], k["Cin"], k["H"], k["W"]), "dy": (k["N"], k["Cout"], k["OH"], k["OW"]),
              "w": (k["Cout"], k["Cin"] // k["groups"], k["KH"], k["KW"])}  # fmt: skip
    return {name: rng.uniform(-1.0, 1.0, shape).astype(np.float16) for name, shape in shapes.items()}


def packed(k: dict, layout, a: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The kernel's arguments (TBE layouts, TBE's order)."""
    if k["op"] == "filter":
        return [layout.nchw_to_5hd(a["x"]), layout.nchw_to_5hd(a["dy"])]
    if k["op"] == "forward":
        return [layout.nchw_to_5hd(a["x"]), layout.oihw_to_fracz(a["w"], k["groups"])]
    return [layout.oihw_to_fracz(a["w"], k["groups"]), layout.nchw_to_5hd(a["dy"])]


def torch_gradient(k: dict, tensors: dict):
    """PyTorch's gradient (``op`` forward: the convolution) of ``tensors`` (NCHW / OIHW)."""
    import torch

    conv = {"stride": k["stride"], "padding": k["pad"], "dilation": k["dilation"], "groups": k["groups"]}
    x, dy, w = tensors["x"], tensors["dy"], tensors["w"]
    if k["op"] == "filter":
        return torch.nn.grad.conv2d_weight(x, w.shape, dy, **conv)
    if k["op"] == "forward":
        return torch.nn.functional.conv2d(x, w, None, **conv)
    return torch.nn.grad.conv2d_input(x.shape, w, dy, **conv)


def expected_result(k: dict, layout, reference: np.ndarray) -> np.ndarray:
    """PyTorch's float64 NCHW / OIHW ``reference`` in the kernel's result layout (zeros in pads)."""
    shape = tuple(k["output"][0])
    if k["op"] == "filter":
        return layout.oihw_to_fracz(reference, k["groups"]).reshape(shape)
    return layout.nchw_to_5hd(reference).reshape(shape)


def check(k: dict, layout, function, device: str, rng: np.random.Generator, reference_device: str) -> tuple[dict, list]:
    """Run kernel ``k`` once on ``device`` and compare (module docstring), PyTorch's float64 on
    ``reference_device``; returns the check and the kernel's arguments."""
    import torch
    import tvm

    dev = tvm.cuda(0) if device == "cuda" else tvm.cpu(0)
    a = draw_inputs(k, rng)
    args = [tvm.runtime.tensor(array, dev) for array in packed(k, layout, a)]
    args.append(tvm.runtime.empty(tuple(k["output"][0]), k["output"][1], dev))
    function(*args)
    result = args[-1].numpy().astype(np.float64)
    exact = {name: torch.from_numpy(v).to(reference_device, torch.float64) for name, v in a.items()}
    reference = torch_gradient(k, exact).cpu().numpy()
    if k["op"] == "filter" and not k["whole"]:  # grouped dW: the per-group weights
        result = layout.dw_result_to_oihw(result, reference.shape, k["groups"])
        expected = reference
    else:
        expected = expected_result(k, layout, reference)
    bound = 4 * k["reduction"] * 2.0**-24 + EPS[k["output"][1]] * np.abs(expected)
    error = np.abs(result - expected)
    worst = float((error / bound).max())
    outcome = {"worst_ratio": worst, "max_abs_error": float(error.max()), "max_abs_reference": float(np.abs(expected).max())}
    return outcome | {"ok": worst <= 1.0}, args


def sample(call, device: str, seconds: float) -> float:
    """Seconds per call: one call to warm up, then back-to-back calls filling ``seconds`` (CUDA events on the GPU;
    also ``tvm-convgrad bench --target cuda``'s :func:`.cuda.sample_cuda`)."""
    import torch

    call()
    if device != "cuda":
        calls, began = 0, time.perf_counter()
        while time.perf_counter() - began < seconds:
            call()
            calls += 1
        return (time.perf_counter() - began) / calls
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    calls, began = 0, time.perf_counter()
    start.record()
    while time.perf_counter() - began < seconds:
        for _ in range(10):
            call()
        calls += 10
        torch.cuda.synchronize()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / calls


def kernel_seconds(call, calls: int = 20) -> float:
    """GPU time per call: the durations of the device activities (kernels, memsets) that ``calls``
    calls launch, summed (CUPTI, through ``torch.profiler``), over ``calls``. Unlike
    :func:`sample`, it leaves out what the host spends launching (PyTorch's dispatch, ~30 us a call)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    micros = sum(getattr(e, "self_device_time_total", 0) for e in prof.key_averages())
    return micros / 1e6 / calls


def run(folder: Path, only: str | None = None, rounds: int = 3, seconds: float = 0.05, device: str = "cuda", timing: bool = True) -> dict:
    """Check (and time) every kernel of ``folder``; returns the record written by :func:`main`."""
    import torch
    import tvm

    manifest = json.loads((folder / "manifest.json").read_text())
    kernels = [k for k in manifest["kernels"] if only is None or re.search(only, f"{k['name']} {k['case']}")]
    layout = load_layout(folder)
    if device == "cuda":
        use_exported_fatbins(folder, kernels, manifest["arch"])
        torch.backends.cudnn.benchmark = True
    rng = np.random.default_rng(0)
    rows = []
    for k in kernels:
        function = tvm.runtime.load_module(str(folder / f"{k['name']}.so"))[k["name"]]
        outcome, args = check(k, layout, function, device, rng, device if timing else "cpu")
        row = {key: k[key] for key in ("name", "case", "kind", "op", "N", "units", "flops")} | outcome
        if outcome["ok"] and timing:
            tensors = {name: torch.from_numpy(v).to(device, torch.float16 if device == "cuda" else torch.float32)
                       for name, v in draw_inputs(k, rng).items()}  # fmt: skip
            ours, theirs = [], []
            for _ in range(rounds):  # interleaved
                ours.append(sample(lambda: function(*args), device, seconds))
                theirs.append(sample(lambda: torch_gradient(k, tensors), device, seconds))
            row |= {"ours_ms": statistics.median(ours) * 1e3, "torch_ms": statistics.median(theirs) * 1e3,
                    "ours_samples_ms": [t * 1e3 for t in ours], "torch_samples_ms": [t * 1e3 for t in theirs]}  # fmt: skip
            row["ratio"] = row["torch_ms"] / row["ours_ms"]
            if device == "cuda":
                row["ours_gpu_ms"] = kernel_seconds(lambda: function(*args)) * 1e3
                row["torch_gpu_ms"] = kernel_seconds(lambda: torch_gradient(k, tensors)) * 1e3
                row["gpu_ratio"] = row["torch_gpu_ms"] / row["ours_gpu_ms"] if row["ours_gpu_ms"] > 0 else None
        rows.append(row)
        print(format_row(row), flush=True)
    return {"environment": environment(device), "arch": manifest.get("arch"), "results": rows, "summary": summarize(rows)}


def format_row(r: dict) -> str:
    verdict = "OK" if r["ok"] else "MISMATCH"
    line = f"{r['op']:7s} {r['case']:44s} {r['units']:12s} {r['worst_ratio']:8.2g} of bound {verdict:8s}"
    if "ratio" in r:
        tflops = r["flops"] / r["ours_ms"] / 1e9
        line += f" ours {r['ours_ms']:8.4f} ms  torch {r['torch_ms']:8.4f} ms  torch/ours {r['ratio']:5.2f}  ours {tflops:6.1f} TF/s"
    if r.get("gpu_ratio"):
        line += f"  GPU time: ours {r['ours_gpu_ms']:8.4f} torch {r['torch_gpu_ms']:8.4f} ms, torch/ours {r['gpu_ratio']:5.2f}"
    return line


def summarize(rows: list[dict]) -> dict:
    """Geomean torch / ours per network, gradient and batch."""
    groups: dict[str, list[float]] = {}
    for r in rows:
        for key in ("ratio", "gpu_ratio"):
            if r.get(key):
                suffix = " GPU time" if key == "gpu_ratio" else ""
                groups.setdefault(f"{r['case'].split('.')[0]} {r['op']} N={r['N']}{suffix}", []).append(r[key])
    return {key: {"geomean_ratio": math.exp(statistics.fmean(math.log(v) for v in values)), "min_ratio": min(values), "cases": len(values)}
            for key, values in groups.items()}  # fmt: skip


def environment(device: str) -> dict:
    import torch
    import tvm

    env = {"tvm": tvm.__version__, "torch": torch.__version__, "device": device}
    if device == "cuda":
        env |= {"gpu": torch.cuda.get_device_name(), "cudnn": torch.backends.cudnn.version(), "cuda": torch.version.cuda}
    return env


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a folder written by tvm_convgrad.tools.bench.cuda_export")
    parser.add_argument("--only", default=None, help="regular expression on kernel and case names")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sample-s", type=float, default=0.05, help="seconds of back-to-back calls per sample")
    parser.add_argument("--no-time", action="store_true", help="check only, PyTorch's reference on the CPU (e.g. under compute-sanitizer)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", type=Path, default=None, help="write the record (JSON) here")
    args = parser.parse_args(argv)
    record = run(args.folder, args.only, args.rounds, args.sample_s, args.device, not args.no_time)
    for key, s in record["summary"].items():
        print(f"{key:40s} geomean torch/ours {s['geomean_ratio']:5.2f}  min {s['min_ratio']:5.2f}  ({s['cases']} cases)")
    failed = [r["name"] for r in record["results"] if not r["ok"]]
    print(f"{len(record['results'])} kernels checked, {len(failed)} failed" + (f": {', '.join(failed)}" if failed else ""))
    if args.out:
        args.out.write_text(json.dumps(record, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
