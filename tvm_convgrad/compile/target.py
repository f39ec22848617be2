"""Targets: what ``"llvm"`` / ``"cuda"`` / a dict mean, the x86 target of a vector ISA, and the pass
context the package compiles in (64-bit indices on CPUs)."""

from __future__ import annotations

import os

import tvm
from tvm.ir.instrument import pass_instrument
from tvm.target import Target

from ..errors import ConvGradError
from ..isa import ISA_MCPU, host_mattr, isa_plan, x86_triple
from ..machine import usable_cores

__all__ = ["KeepIndexWidth", "isa_target", "pass_context", "resolve_target"]


def _cuda_arch() -> str:
    dev = tvm.cuda(0)
    if tvm.runtime.enabled("cuda") and dev.exist:
        return "sm_" + dev.compute_version.replace(".", "")
    return "sm_80"


def resolve_target(target: str | dict | Target = "llvm") -> Target:
    """A :class:`tvm.target.Target` from ``"llvm"`` (this CPU, all cores; the environment
    variable ``TVM_CONVGRAD_MCPU`` names another LLVM CPU model, e.g. ``haswell`` to build and
    test the AVX2 plan on an AVX-512 machine), ``"cuda"`` (this GPU's arch, else sm_80), a target
    dict, or a Target."""
    if isinstance(target, Target):
        return target
    if isinstance(target, dict):
        try:
            return Target(target)
        except Exception as err:  # TVM's own message says which key is wrong
            raise ConvGradError("build", "target", target, f"is not a valid TVM target: {str(err).strip().splitlines()[-1]}") from None
    if target == "llvm":
        return _this_cpu(usable_cores())
    if target == "cuda":
        return Target({"kind": "cuda", "arch": _cuda_arch()})
    raise ConvGradError("build", "target", target, "must be 'llvm', 'cuda', a target dict or a tvm.target.Target")



def _this_cpu(cores: int) -> Target:
    """This CPU as an LLVM target: its model, with the features the host has and the model lacks (or
    lacks and the model has) as ``mattr`` (:func:`tvm_convgrad.isa.host_mattr`); ``TVM_CONVGRAD_MCPU``
    names a model to build for as it is, whatever this host has."""
    mcpu = os.environ.get("TVM_CONVGRAD_MCPU")
    if mcpu:
        return Target({"kind": "llvm", "mcpu": mcpu, "num-cores": cores})
    mcpu = tvm.target.codegen.llvm_get_system_cpu()
    mattr = host_mattr(mcpu)
    return Target({"kind": "llvm", "mcpu": mcpu, "num-cores": cores, **({"mattr": mattr} if mattr else {})})


def isa_target(isa: str = "native", cores: int | None = None) -> Target:
    """An x86 LLVM target for one vector ISA: ``"native"`` (this CPU, as ``"llvm"``), ``"avx512"``,
    ``"avx2"`` or ``"sse"``. The host's own CPU model when its plan is that ISA (so the code is
    tuned for it), else the model of :data:`ISA_MCPU` (e.g. AVX2 = ``haswell`` on an AVX-512
    machine) with an x86-64 triple (x86 code whatever the host: on an AArch64 one it cross-compiles);
    ``cores`` threads (default: every usable core)."""
    cores = cores or usable_cores()
    host = _this_cpu(cores)
    if isa == "native" or (isa in ISA_MCPU and isa_plan(host).name == isa):
        return host
    if isa not in ISA_MCPU:
        raise ConvGradError("isa_target", "isa", isa, f"must be 'native' or one of {sorted(ISA_MCPU)}")
    return Target({"kind": "llvm", "mtriple": x86_triple(), "mcpu": ISA_MCPU[isa], "num-cores": cores})



@pass_instrument
class KeepIndexWidth:
    """Skips TVM's ``NarrowDataType(32)``, which would turn the 64-bit indices of CPU kernels back
    into 32-bit ones: LLVM then sign-extends every address in the hot loops (and vectorizes that
    arithmetic), costing dX up to a third of its speed."""

    def should_run(self, mod, info) -> bool:
        return info.name != "tirx.NarrowDataType"


def pass_context(target: str | dict | Target = "llvm") -> tvm.transform.PassContext:
    """The ``PassContext`` the package compiles in; use it around your own ``tvm.compile`` of
    :func:`lower`'s module for the same code."""
    target = resolve_target(target)
    return tvm.transform.PassContext(instruments=[KeepIndexWidth()] if target.kind.name == "llvm" else [])

