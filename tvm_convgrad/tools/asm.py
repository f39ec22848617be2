"""Read generated assembly: the innermost loops, the FMAs in them and any stack traffic (spills).

The schedules' promise is about the hot loop: every FMA of a register tile inside the innermost
reduction loop, its accumulators in registers for the whole loop, no spill store or reload. This
module finds those loops in LLVM's assembly (x86-64 AT&T syntax or AArch64) by their back
edges, so that tests can check the promise for any target, cross-compiled, whatever the host.

>>> loops = hot_loops(kernel.source)
>>> [(loop.fmas, loop.vector_width, loop.stack_accesses) for loop in loops]
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Loop", "fma_instructions", "hot_loops", "innermost_loops"]

_LABEL = re.compile(r"^(\.?L[\w$.]+):")
_BRANCH = re.compile(r"^\s+(j[a-z]+|b\.[a-z]+|b|cbn?z|tbn?z)\s+(?:[^,]+,\s*)*(\.?L[\w$.]+)\s*$")
# x86: vfmadd231ps and friends (packed single), AArch64: fmla on .4s vectors (by element or vector)
_FMA = re.compile(r"^\s+(v?f(?:n?madd|n?msub)\d*ps|fmla)\b(.*)$")
_MULPS = re.compile(r"^\s+v?mulps\b")  # SSE has no FMA: its mads are mulps + addps
_DOT = re.compile(r"^\s+vdpbf16ps\b")  # AVX512-BF16: 16 lanes x 2 bf16 pairs per instruction
_X86_STACK = re.compile(r"\(%rsp\)")  # rbp is a general register (LLVM omits the frame pointer)
_ARM_STACK = re.compile(r"\[sp\b")
_X86_VECTOR = re.compile(r"%[xyz]mm\d+")
_ARM_VECTOR = re.compile(r"\b[qvds]\d+\b")


@dataclass(frozen=True)
class Loop:
    """One loop of the assembly: the lines from its label to its back-edge branch."""

    label: str
    lines: tuple[str, ...]

    @property
    def fma_lines(self) -> list[str]:
        return [line for line in self.lines if _FMA.match(line)]

    @property
    def fmas(self) -> int:
        return len(self.fma_lines)

    @property
    def dot_lines(self) -> list[str]:
        """The bf16 dot products (``vdpbf16ps``) of the loop."""
        return [line for line in self.lines if _DOT.match(line)]

    @property
    def mads(self) -> int:
        """Vector multiply-adds: FMAs, ``vdpbf16ps`` (bf16 pairs), or ``mulps`` on targets without FMA (SSE)."""
        return self.fmas + len(self.dot_lines) or sum(bool(_MULPS.match(line)) for line in self.lines)

    @property
    def broadcast_fmas(self) -> int:
        """FMAs with an embedded broadcast memory operand (AVX-512's ``m32{1toN}``)."""
        return sum("{1to" in line for line in self.fma_lines)

    @property
    def vector_registers(self) -> set[str]:
        """Register kinds the FMAs (or ``mulps``) write: ``zmm`` / ``ymm`` / ``xmm`` (x86), ``v`` (AArch64)."""
        kinds = set()
        for line in self.fma_lines or [line for line in self.lines if _MULPS.match(line)]:
            operands = line.split("#")[0].replace(",", " ").split()
            dest = operands[-1] if "%" in line else operands[1]
            kinds.add(re.sub(r"^%?([a-z]+?)\d+(\.\w+)?$", r"\1", dest))
        return kinds

    @property
    def vector_width(self) -> int:
        """Bits of the FMAs' destination registers (0 when it has none)."""
        widths = {"zmm": 512, "ymm": 256, "xmm": 128, "v": 128}
        return max((widths.get(k, 0) for k in self.vector_registers), default=0)

    @property
    def stack_accesses(self) -> list[str]:
        """Lines that move a vector register to or from the stack: spilled accumulators or
        operands and their reloads. (A general register saved around a call is not counted.)"""
        arm = any("[" in line for line in self.lines)
        pattern, vector = (_ARM_STACK, _ARM_VECTOR) if arm else (_X86_STACK, _X86_VECTOR)
        code = (line.split("#")[0].split("//")[0] for line in self.lines)
        return [line.strip() for line in code if pattern.search(line) and vector.search(line)]


def _instructions(asm: str) -> list[str]:
    """Code lines and labels, without directives or comment-only lines."""
    out = []
    for line in asm.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "//", ";")):
            continue
        if stripped.startswith(".") and not _LABEL.match(stripped):
            continue  # an assembler directive
        out.append(line.rstrip())
    return out


def innermost_loops(asm: str) -> list[Loop]:
    """Loops (a label and a later branch back to it) that contain no other loop."""
    lines = _instructions(asm)
    labels = {}
    loops = []
    for i, line in enumerate(lines):
        m = _LABEL.match(line.strip())
        if m:
            labels[m.group(1)] = i
            continue
        b = _BRANCH.match(line)
        if b and b.group(2) in labels and labels[b.group(2)] < i:
            loops.append((labels[b.group(2)], i, b.group(2)))
    spans = [(start, end) for start, end, _ in loops]
    inner = [
        (start, end, label)
        for start, end, label in loops
        if not any((s, e) != (start, end) and start <= s and e <= end for s, e in spans)
    ]
    return [Loop(label, tuple(lines[start : end + 1])) for start, end, label in inner]


def hot_loops(asm: str) -> list[Loop]:
    """The innermost loops that hold vector multiply-adds: a kernel's register tiles."""
    return [loop for loop in innermost_loops(asm) if loop.mads]


def fma_instructions(asm: str) -> list[str]:
    """Every packed-single FMA instruction of the assembly."""
    return [line.strip() for line in _instructions(asm) if _FMA.match(line)]
