"""How the CUDA schedule is lowered: onto a GPU (thread bindings, GPU memory scopes, tensor-core
intrinsics), or, emulated, onto a CPU: the same schedule with the thread bindings left as serial
loops and each tensor-core block left as the plain TIR the intrinsic stands for (that it matches
the intrinsic's registered description is checked by tensorizing a copy), the fragments stored as
ordinary buffers (shared memory stays: LLVM allocates it like any other buffer). LLVM then builds
and runs the CUDA schedule's tiling, staging, padding and fragment layout on the host
(:func:`tvm_convgrad.emulate_cuda`).
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import s_tir

__all__ = ["Lowering", "all_blocks"]


@dataclass(frozen=True)
class Lowering:
    """The device-specific steps of the schedule: binding loops to threads, memory scopes and
    tensor-core intrinsics on CUDA; serial loops, plain buffers and the intrinsics' own TIR in
    the CPU emulation."""

    emulate: bool = False

    def bind(self, sch: s_tir.Schedule, loop, thread: str):
        if not self.emulate:
            sch.bind(loop, thread)

    def finish(self, sch: s_tir.Schedule):
        """Emulated: store the fragments (``wmma.*`` scopes, which LLVM cannot allocate) as ordinary buffers."""
        if not self.emulate:
            return
        for block in all_blocks(sch):
            for index, region in enumerate(sch.get(block).writes):
                if region.source.scope().startswith("wmma."):
                    sch.set_scope(block, index, "global")

    def tensorize(self, sch: s_tir.Schedule, target, intrin: str):
        """Replace ``target`` (a loop or block) by ``intrin``; emulated: check that it matches
        the intrinsic's description (on a copy) and keep it as plain TIR."""
        if self.emulate:
            sch.copy().tensorize(target, intrin)
        else:
            sch.tensorize(target, intrin)



def all_blocks(sch: s_tir.Schedule) -> list:
    """Every block of the schedule, nested ones too."""
    blocks, stack = [], list(sch.get_child_blocks(sch.get_sblock("root")))
    while stack:
        block = stack.pop()
        blocks.append(block)
        stack.extend(sch.get_child_blocks(block))
    return blocks

