"""Every fact the package knows about vector ISAs: the plan of an LLVM target (its registers, lanes
and what its FMAs can take), the LLVM CPU model and triple that stand for an ISA, the host's
features, and how PyTorch is capped to one ISA when the bench compares both sides on it.

The cube's unit is a row of 16 fp32 lanes (one C0 block). How many registers such a row takes,
and how many rows fit in the register file next to the operands, depends on the target's vector
ISA, read from the Target itself (``mtriple`` / ``mcpu`` / ``mattr``, through LLVM's own feature
table), never from the host unless the target says "this machine":

=========  ==========  =========  ============  ===============  ====================================
plan       registers   lanes      C0 row        accumulators     operands of an FMA
=========  ==========  =========  ============  ===============  ====================================
avx512     32 zmm      16         1 register    28               broadcast from memory (``{1to16}``)
avx2       16 ymm      8          2 registers   12               ``vbroadcastss`` + vector register
sse        16 xmm      4          4 registers   8                no FMA: ``mulps`` + ``addps``
neon       32 v        4          4 registers   24               ``fmla`` by element
=========  ==========  =========  ============  ===============  ====================================

An ``avx512`` target with AVX512-BF16 (``+avx512bf16``: Zen 4/5, Cooper Lake, Sapphire Rapids and
later) also has ``bf16_dot``; its bf16 gradients run on ``vdpbf16ps`` (:mod:`.schedule.cpu.bf16`)
where that pays (``bf16_dot_pays``): on Zen 4/5 a ``vdpbf16ps`` does twice the products of the fp32
FMA a cycle, on Intel's cores (:data:`BF16_DOT_HALF_RATE`) half, and there the exact path (bf16
widened to fp32, FMAs) is the faster one. With AMX-BF16 as well (``+amx-tile,+amx-bf16``: Sapphire
Rapids and later) ``amx_bf16``: its 2-D bf16 dW and dX run on AMX tiles (:mod:`.schedule.cpu.amx`),
its other bf16 kernels as a core without AMX runs them.
Any other LLVM target gets the ``generic`` plan (as ``sse``: 16 registers of 128 bits), which
is correct everywhere and small enough not to spill on a 16-register machine.

A plan's ``accumulators`` is the register budget of one tile's partial sums; the rest of the
file holds the operands of one reduction step (the loaded vectors and the broadcast scalar).
The tile sizes below are derived from it, so every tile of every formulation fits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import tvm
from tvm.target import Target

from .layout import C0

__all__ = [
    "AMX_L2_BYTES",
    "BENCH_ISAS", "BF16_DOT_HALF_RATE", "ISA_MCPU", "L2_BYTES", "IsaPlan", "PLANS", "TORCH_ISA_CAPS", "X86_TRIPLE", "has_amx_bf16", "has_bf16_dot", "host_can_run", "host_features", "host_mattr", "isa_plan",
    "x86_triple",
]  # fmt: skip


@dataclass(frozen=True)
class IsaPlan:
    """How a 16-lane cube row maps onto one ISA's register file."""

    name: str
    vector_bits: int
    registers: int
    accumulators: int
    fma: bool
    broadcast_operand: bool  # an FMA can take a broadcast scalar from memory (AVX-512 ``{1toN}``)
    converts_fp16: bool = True  # fp16 -> fp32 in one instruction as a vector loads (F16C, NEON)
    memory_operands: bool = True  # an FMA can read one operand from memory (x86; not AArch64)
    register_kind: str = "xmm"  # how the assembly names its vector registers: zmm, ymm, xmm, v
    bf16_dot: bool = False  # AVX512-BF16's ``vdpbf16ps``: bf16 mads run on bf16 pairs (:mod:`.schedule.cpu.bf16`)
    amx_bf16: bool = False  # AMX-BF16's ``tdpbf16ps`` on 16x32 bf16 tiles: bf16 dW runs on tiles (:mod:`.schedule.cpu.amx`)
    bf16_dot_pays: bool = False  # ``vdpbf16ps`` does more products a cycle than the fp32 FMA (not a BF16_DOT_HALF_RATE core)
    l2_bytes: int = 1 << 20  # one core's L2 (:data:`L2_BYTES` by CPU model, :data:`AMX_L2_BYTES` with AMX; else 1 MB)

    @property
    def lanes(self) -> int:
        """fp32 lanes of one vector register."""
        return self.vector_bits // 32

    @property
    def registers_per_row(self) -> int:
        """Vector registers one 16-lane C0 row takes."""
        return C0 // self.lanes

    @property
    def row_parts(self) -> list[int]:
        """How many of a C0 row's registers a tile may take: the divisors of ``registers_per_row``
        (AVX2: 1 or 2 ymm; AVX-512: the one zmm)."""
        return [d for d in range(1, self.registers_per_row + 1) if self.registers_per_row % d == 0]

    def rows(self, limit: int = C0, divides: int | None = None) -> int:
        """How many 16-lane rows of accumulators a tile may hold: at most ``limit``, and a divisor
        of ``divides`` when given (a whole number of tiles along that axis)."""
        most = max(1, min(limit, self.accumulators // self.registers_per_row))
        if divides is None:
            return most
        return max(d for d in range(1, most + 1) if divides % d == 0)

    def describe(self) -> str:
        return f"{self.name}: {self.registers} x {self.vector_bits}-bit registers, {self.accumulators} accumulators"


PLANS = {
    "avx512": IsaPlan("avx512", 512, 32, 28, fma=True, broadcast_operand=True, register_kind="zmm"),
    "avx2": IsaPlan("avx2", 256, 16, 12, fma=True, broadcast_operand=False, register_kind="ymm"),
    "sse": IsaPlan("sse", 128, 16, 8, fma=False, broadcast_operand=False, converts_fp16=False),
    "neon": IsaPlan("neon", 128, 32, 24, fma=True, broadcast_operand=False, memory_operands=False, register_kind="v"),
    "generic": IsaPlan("generic", 128, 16, 8, fma=False, broadcast_operand=False, converts_fp16=False, memory_operands=False),
}

BF16_DOT_HALF_RATE = frozenset({"cooperlake", "sapphirerapids", "emeraldrapids", "graniterapids", "graniterapids-d", "diamondrapids", "rocketlake"})
"""LLVM CPU models (Intel's AVX512-BF16 cores) whose ``vdpbf16ps`` does half the products of their
two 512-bit fp32 FMA pipes a cycle: measured 243 against 485 GFLOP/s on a Sapphire Rapids, 117-170
against 340 on an Emerald Rapids (2 cores each, ``tools.bf16_peak`` and ``tools.peak``), where a
Zen 4 does 468 against 234. ``rocketlake`` is how LLVM names a Sapphire Rapids guest that reports
family 6 model 167 (:func:`host_mattr` adds its AVX512-BF16)."""

L2_BYTES = {
    **dict.fromkeys(("znver1", "znver2", "znver3", "rocketlake", "icelake-client"), 512 << 10),
    **dict.fromkeys(("znver4", "znver5", "skylake-avx512", "cascadelake", "cooperlake"), 1 << 20),
    **dict.fromkeys(("icelake-server", "tigerlake", "alderlake"), 1280 << 10),
    **dict.fromkeys(("sapphirerapids", "emeraldrapids", "graniterapids", "graniterapids-d", "diamondrapids", "raptorlake"), 2 << 20),
    **dict.fromkeys(("haswell", "broadwell", "skylake"), 256 << 10),
}
"""One core's L2 by LLVM CPU model (:attr:`IsaPlan.l2_bytes`; a model not named here counts as 1 MB):
what a task that keeps its working set in cache may hold (Winograd's tasks,
:func:`~tvm_convgrad.schedule.cpu.winograd.task_bytes`). ``rocketlake`` is counted as the client
core LLVM names so (512 KB), though a Sapphire Rapids guest may report it: with AMX it is one
(:data:`AMX_L2_BYTES`)."""

AMX_L2_BYTES = 2 << 20
"""One core's L2 on a target with AMX, whatever its CPU model says: every core with AMX tiles
(Sapphire, Emerald, Granite Rapids) has 2 MB. A Sapphire Rapids KVM guest that reports family 6
model 167 is ``rocketlake`` to LLVM (512 KB): its Winograd tasks had been cut to a tile row each,
the 256 -> 256 dX on 14x14 at N=8 5.96 ms against 4.17 with its L2 counted (2026-12-06)."""

ISA_MCPU = {"avx512": "skylake-avx512", "avx2": "haswell", "sse": "x86-64"}
"""The LLVM CPU model that stands for an x86 vector ISA when the host's own CPU is of another plan
(:func:`tvm_convgrad.isa_target`)."""

BENCH_ISAS = ("native", "avx2", "avx512")
"""The ISAs the bench puts both sides on (``tvm-convgrad bench --isa``): this CPU's, or a cap."""

TORCH_ISA_CAPS = {
    "native": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
}
"""Environment that caps PyTorch (ATen's kernels and oneDNN's) to one ISA; read when torch loads."""


def _features(target: Target) -> set[str]:
    try:
        return set(tvm.target.codegen.llvm_get_cpu_features(target))
    except Exception:  # an LLVM without this target's backend: nothing is known
        return set()


X86_TRIPLE = "x86_64-linux-gnu"
"""The triple of an x86 target built on a host of another architecture (cross-compiled)."""


def x86_triple() -> str:
    """This machine's triple when it is an x86-64 one, else :data:`X86_TRIPLE`: the triple every
    x86 target the package makes for a vector ISA names (:func:`tvm_convgrad.isa_target`), so that
    it is x86 code on any host (an AArch64 one included)."""
    host = tvm.target.codegen.llvm_get_system_triple()
    return host if host.startswith("x86_64") else X86_TRIPLE


def _triple(target: Target) -> str:
    triple = str(target.attrs.get("mtriple", "") or "")
    return triple or tvm.target.codegen.llvm_get_system_triple()


def isa_plan(target: Target) -> IsaPlan:
    """The plan of an LLVM target: what its ``mtriple`` / ``mcpu`` / ``mattr`` enable.

    ``{"kind": "llvm", "mcpu": "haswell"}`` is AVX2 on any host, ``"mattr": ["-avx512f"]``
    turns AVX-512 off, ``{"kind": "llvm"}`` alone is LLVM's baseline x86-64 (SSE2), and
    ``"mtriple": "aarch64-linux-gnu"`` is NEON.
    """
    triple = _triple(target)
    features = _features(target)
    if triple.startswith(("aarch64", "arm64")):
        return PLANS["neon"]  # Advanced SIMD (and fcvtl) are part of the AArch64 base ISA
    plan = PLANS["generic"]
    if triple.startswith(("x86_64", "i686", "i386")):
        if "avx512f" in features:
            plan = PLANS["avx512"]
        elif "avx2" in features and "fma" in features:
            plan = PLANS["avx2"]
        elif "sse2" in features:
            plan = PLANS["sse"]
        bf16_dot = plan.name == "avx512" and "avx512bf16" in features
        amx = bf16_dot and {"amx-tile", "amx-bf16"} <= features
        mcpu = str(target.attrs.get("mcpu", "") or "")
        pays = bf16_dot and mcpu not in BF16_DOT_HALF_RATE
        return replace(plan, converts_fp16="f16c" in features, bf16_dot=bf16_dot, amx_bf16=amx, bf16_dot_pays=pays,
                       l2_bytes=max(L2_BYTES.get(mcpu, plan.l2_bytes), AMX_L2_BYTES if amx else 0))  # fmt: skip
    return replace(plan, converts_fp16=False, memory_operands=False)


def has_amx_bf16(target: Target) -> bool:
    """Whether an LLVM target has AMX-BF16 tiles (``tdpbf16ps``: Sapphire Rapids and later)."""
    return target.kind.name == "llvm" and isa_plan(target).amx_bf16


def has_bf16_dot(target: Target) -> bool:
    """Whether an LLVM target has AVX512-BF16's ``vdpbf16ps`` (Zen 4/5, Cooper Lake, Sapphire Rapids and later)."""
    return target.kind.name == "llvm" and isa_plan(target).bf16_dot


# LLVM feature name -> the flag Linux shows in /proc/cpuinfo, where they differ.
_CPUINFO_NAMES = {"sse4.1": "sse4_1", "sse4.2": "sse4_2", "lzcnt": "abm", "bmi": "bmi1", "avx512bf16": "avx512_bf16", "amx-tile": "amx_tile",
                  "amx-bf16": "amx_bf16", "avx512fp16": "avx512_fp16"}  # fmt: skip
# Features whose absence on the host would make a target's code fault (illegal instruction).
_CHECKED_FEATURES = (
    "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512fp16", "avx512bf16", "amx-tile", "amx-bf16", "avx2", "avx", "fma", "f16c",
    "bmi", "bmi2", "lzcnt", "movbe", "popcnt", "sse4.2", "sse4.1", "ssse3",
)  # fmt: skip


def host_features() -> set[str]:
    """The host CPU's features in LLVM's names: ``/proc/cpuinfo`` where there is one (a VM may
    hide features its CPU model has), else what LLVM knows of the host CPU model."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(line.split(":", 1)[1].split() for line in f if line.startswith("flags"))
    except (OSError, StopIteration):
        return _features(Target({"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu()}))
    names = set(flags)
    return {feature for feature in _CHECKED_FEATURES if _CPUINFO_NAMES.get(feature, feature) in names} | {"sse2"}


def host_mattr(mcpu: str) -> list[str]:
    """The ``mattr`` that makes LLVM's CPU model ``mcpu`` this host: ``+feature`` for each checked
    feature the host has and the model lacks, ``-feature`` for each the model has and the host lacks.

    A virtual machine may present one CPU model and another's features: a KVM guest on a
    Sapphire Rapids host that says family 6 model 167 is ``rocketlake`` to LLVM (no AVX512-BF16,
    no AMX) while its ``/proc/cpuinfo`` lists ``avx512_bf16`` and ``amx_bf16``; a guest may also
    hide a feature its model has. Empty where the model is the host (or no ``/proc/cpuinfo`` says
    otherwise)."""
    model = _features(Target({"kind": "llvm", "mcpu": mcpu})) & set(_CHECKED_FEATURES)
    host = host_features() & set(_CHECKED_FEATURES)
    return [f"+{feature}" for feature in _CHECKED_FEATURES if feature in host - model] + [
        f"-{feature}" for feature in _CHECKED_FEATURES if feature in model - host
    ]


def host_can_run(target: Target) -> bool:
    """Whether code built for ``target`` runs on this machine (same architecture, and every
    instruction-set feature the target enables is present here)."""
    host = tvm.target.codegen.llvm_get_system_triple().split("-")[0]
    if _triple(target).split("-")[0] != host:
        return False
    needed = _features(target) & set(_CHECKED_FEATURES)
    return needed <= host_features()
