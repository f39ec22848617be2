"""Timing both sides alike on a shared machine: samples of >= 0.15 s, a pause between the two
runtimes (whose idle worker threads would otherwise spin against each other), a gate that waits
until an FMA probe shows the cores free, and which oneDNN implementation PyTorch ran."""

from __future__ import annotations

import ctypes
import os
import sys
import tempfile
import time
from typing import Callable

import numpy as np
import tvm

from ...compile import Kernel
from ..peak import FmaProbe
from .cases import BenchCase

__all__ = [
    "PAUSE_SECONDS", "QUIET", "QUIET_PROBE_MS", "QUIET_WAIT_SECONDS", "SAMPLE_SECONDS", "QuietGate", "onednn_implementations",
    "sample", "timed_ours", "torch_call",
]  # fmt: skip

SAMPLE_SECONDS = 0.15
QUIET = 0.85  # a sample waits until the FMA probe reaches this share of the run's peak
QUIET_PROBE_MS = 15
QUIET_WAIT_SECONDS = 20.0
PAUSE_SECONDS = 0.25  # > the ~0.1-0.3 s that idle TVM (300k yields) and libgomp workers spin


def sample(fn: Callable[[], None]) -> float:
    """Seconds per call of ``fn``, averaged over as many calls as fill SAMPLE_SECONDS."""
    fn()
    calls, start = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= SAMPLE_SECONDS:
            return elapsed / calls


def timed_ours(kernel: Kernel, rng: np.random.Generator) -> Callable[[], float]:
    dev = kernel.device
    args = [tvm.runtime.tensor(rng.uniform(-1, 1, a.shape).astype(a.dtype), dev) for a in kernel.inputs]
    args.append(tvm.runtime.empty(kernel.output.shape, kernel.output.dtype, dev))
    evaluator = kernel.executable.mod.time_evaluator(kernel.name, dev, number=1, repeat=1, min_repeat_ms=int(SAMPLE_SECONDS * 1e3))
    return lambda: float(evaluator(*args).mean)


def torch_call(case: BenchCase, op: str, rng: np.random.Generator, channels_last: bool = False, device: str = "cpu", dtype=None) -> Callable[[], object]:
    """PyTorch's gradient (``op`` forward: the convolution) of ``case`` on random float32 NCHW tensors (channels-last, or on another
    ``device`` / ``dtype``: the CUDA bench's float16)."""
    import torch

    size, out, _ = case.spatial
    memory = (torch.channels_last if case.rank == 2 else torch.channels_last_3d) if channels_last else torch.contiguous_format

    def tensor(shape):
        return torch.from_numpy(rng.uniform(-1, 1, shape).astype("float32")).to(device=device, dtype=dtype)

    x = tensor((case.N, case.Cin, *size)).to(memory_format=memory)
    w = tensor(case.filter_sizes).to(memory_format=memory)  # a channels-last model's weights are channels-last too
    dy = tensor((case.N, case.Cout, *out)).to(memory_format=memory)
    kw = {"stride": case.stride, "padding": case.pad, "dilation": case.dilation, "groups": case.groups}
    grad = torch.nn.grad
    if op == "forward":
        conv = torch.nn.functional.conv2d if case.rank == 2 else torch.nn.functional.conv3d
        return lambda: conv(x, w, None, **kw)
    if op == "filter":
        weight = grad.conv2d_weight if case.rank == 2 else grad.conv3d_weight
        return lambda: weight(x, w.shape, dy, **kw)
    data = grad.conv2d_input if case.rank == 2 else grad.conv3d_input
    return lambda: data(x.shape, w, dy, **kw)


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
