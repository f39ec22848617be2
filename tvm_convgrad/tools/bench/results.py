"""What a bench run found: one :class:`BenchResult` per timed case, one :class:`BenchFailure` per
case whose kernel did not match the float64 reference (checked before timing), and the summaries."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from ...compile import Kernel
from ..peak import FmaPeak
from ..verify import Check, check_kernel

__all__ = ["BenchFailure", "BenchResult", "CheckFailed", "checked", "geomean", "peak_fractions", "peak_gflops", "summarize"]


@dataclass
class BenchResult:
    case: str
    kind: str
    batch: int
    op: str  # "wgrad" | "dgrad" | "fwd"
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
    """The kernel's check against the float64 reference (:func:`~tvm_convgrad.tools.verify.check_kernel`),
    or None, with the failure recorded, when it does not match."""
    check = check_kernel(kernel)
    if check.ok:
        return check
    failures.append(BenchFailure(case, op, kernel.schedule, str(check)))
    return None


def geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def summarize(results: Sequence[BenchResult]) -> dict[str, dict]:
    """Per (kind, op, batch): geometric mean and minimum of torch/ours, max compile time."""
    groups: dict[str, list[BenchResult]] = {}
    for r in results:
        groups.setdefault(f"{r.kind} {r.op} N={r.batch}", []).append(r)
    return {
        key: {
            "cases": len(rs),
            "geomean_ratio": geomean([r.ratio for r in rs]),
            "min_ratio": min(r.ratio for r in rs),
            "min_case": min(rs, key=lambda r: r.ratio).case,
            "max_compile_s": max(r.compile_s for r in rs),
            **({"geomean_tuned_speedup": geomean([r.tuned_speedup for r in rs]),
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
