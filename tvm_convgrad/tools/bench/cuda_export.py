"""The CUDA bench split in two: kernels built on this machine, checked and timed on a GPU machine
that has TVM's runtime alone (no compiler, no ``tvm_convgrad``).

``python -m tvm_convgrad.tools.bench.cuda_export DIR [--suite resnet50] [--batches 1,8]
[--filter RE] [--ops filter,input] [--arch sm_90]`` writes into ``DIR``, for every (case, gradient):

* ``<kernel>.so``: the kernel's library (its host code and CUDA C++ source);
* ``<kernel>.fatbin``: that source compiled for ``--arch`` by this machine's ``nvcc``, as TVM's
  runtime would compile it when loading the library (``tvm.support.nvcc``'s flags), so that the GPU
  machine compiles nothing;
* ``manifest.json``: each kernel's case (NCHW geometry, PyTorch conventions), gradient, arguments,
  result and the reduction length of its error bound (:func:`~tvm_convgrad.tools.verify.error_bound`);
* ``layout.py``: the package's layout module, copied (the packing's single home) and
  ``cuda_remote.py``: the runner (:mod:`.cuda_remote`).

On the GPU machine: ``TVM_USE_RUNTIME_LIB=1 python DIR/cuda_remote.py DIR`` (numpy, torch with
CUDA and TVM's runtime library importable).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Sequence

import tvm

from ... import layout
from ...compile import build
from ...dsl.compute.depthwise import depthwise
from ..verify import reduction_length
from . import cuda_remote
from .cases import OPS, load_cases, tbe_result

__all__ = ["compile_fatbin", "export", "main"]


def compile_fatbin(source: str, arch: str) -> bytes:
    """``source`` (a CUDA kernel's C++) compiled by ``nvcc`` into a fatbin for ``arch`` (``sm_90``),
    with the flags of TVM's runtime callback ``tvm_callback_cuda_compile``."""
    from tvm.support import nvcc

    number = arch.removeprefix("sm_")
    with tvm.target.Target({"kind": "cuda", "arch": arch}):
        return bytes(nvcc.compile_cuda(source, "fatbin", ["-gencode", f"arch=compute_{number},code=sm_{number}"], compiler="nvcc"))


def export(out_dir: Path, suite: str = "resnet50", batches: Sequence[int] = (1, 8), pattern: str | None = None,
           ops: Sequence[str] = ("filter", "input"), arch: str = "sm_90") -> list[dict]:  # fmt: skip
    """Build every (case, op) for ``arch``, write the libraries, fatbins and the manifest (module
    docstring) under ``out_dir``; returns the manifest's kernels. ``arch`` ``llvm``: for this CPU,
    without fatbins (the runner's ``--device cpu``)."""
    cuda = arch != "llvm"
    if cuda and shutil.which("nvcc") is None:
        raise RuntimeError("cuda_export needs nvcc (the CUDA toolkit) on PATH to compile the kernels for the GPU machine")
    out_dir.mkdir(parents=True, exist_ok=True)
    kernels = []
    for case in load_cases(suite, batches, pattern):
        for op in ops:
            start = time.perf_counter()
            kernel = build(tbe_result(case, op), target={"kind": "cuda", "arch": arch} if cuda else "llvm", schedules=None)
            kernel.export_library(str(out_dir / f"{kernel.name}.so"))
            source = kernel.source if cuda else ""
            if cuda:
                (out_dir / f"{kernel.name}.fatbin").write_bytes(compile_fatbin(source, arch))
            kernels.append({
                "name": kernel.name, "case": case.name, "kind": case.kind, "op": op, "units": kernel.units or "cpu",
                "N": case.N, "Cin": case.Cin, "H": case.H, "W": case.W, "Cout": case.Cout, "KH": case.KH, "KW": case.KW,
                "stride": list(case.stride), "pad": list(case.pad), "dilation": list(case.dilation), "groups": case.groups,
                "OH": case.OH, "OW": case.OW, "flops": case.flops,
                "inputs": [[list(a.shape), a.dtype] for a in kernel.inputs], "output": [list(kernel.output.shape), kernel.output.dtype],
                "reduction": reduction_length(kernel.params), "whole": op != "filter" or case.groups == 1 or depthwise(kernel.params),
                "source_sha256": hashlib.sha256(source.encode()).hexdigest(),
                "build_s": round(time.perf_counter() - start, 2),
            })  # fmt: skip
            print(f"{OPS[op]:5s} {case.name:44s} {kernels[-1]['units']:12s} {kernels[-1]['build_s']:5.1f} s", flush=True)
    manifest = {"arch": arch, "tvm": tvm.__version__, "kernels": kernels}
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1))
    shutil.copyfile(layout.__file__, out_dir / "layout.py")
    shutil.copyfile(cuda_remote.__file__, out_dir / "cuda_remote.py")
    return kernels


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tvm_convgrad.tools.bench.cuda_export", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the folder to write (carried to the GPU machine)")
    parser.add_argument("--suite", default="resnet50")
    parser.add_argument("--batches", default="1,8", help="comma-separated batch sizes")
    parser.add_argument("--filter", default=None, help="regular expression on the case names")
    parser.add_argument("--ops", default="filter,input", help=f"comma-separated, of {', '.join(OPS)}")
    parser.add_argument("--arch", default="sm_90", help="the GPU's arch (sm_80: A100, sm_90: H100 / H200)")
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    kernels = export(args.out, args.suite, batches, args.filter, args.ops.split(","), args.arch)
    print(f"wrote {len(kernels)} kernels to {args.out}; on the GPU machine: TVM_USE_RUNTIME_LIB=1 python {args.out}/cuda_remote.py {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
