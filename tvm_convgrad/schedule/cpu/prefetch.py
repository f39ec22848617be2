"""Software prefetch of an operand a loop streams from memory.

A mad that reads a framework tensor in place (a 1x1 dX's NXC dy, rows of ``Cout`` channels) walks
it once, tile after tile, each tile's rows a few KB past the last. The hardware prefetchers do not
run far enough ahead of that pattern (a tile's broadcasts touch its rows' lines in turn, 6-14
streams at once): on a 38 MB dy the Zen 3 kernel ran at 9 GB/s where a plain read of the same
tensor runs at 35, and with every line asked for :data:`PREFETCH_AHEAD_BYTES` ahead at 1.4-1.7x
the speed (N=32, channels-last: the 16 -> 96 1x1 dX on 56x56 4.8 -> 2.8 ms, the forward of 96 -> 24
7.0 -> 5.0 ms).

A 1x1 dW walks its operands likewise, a step's run of 16 channels (a tile's Cout rows, or its Cin
blocks) a whole row of channels apart: both cores' strided streams from memory, 16 -> 96 on 56x56
(N=32, channels-last) 5.4 -> 3.1 ms with each run asked for ahead.

The rule marks such a loop (:func:`prefetch_stream`: an annotation, so it is part of the schedule's
trace and replayed by tuning); :func:`lower_prefetches`, run on the scheduled module before
``tvm.compile``, puts at the top of each iteration ``i`` one prefetch per cache line of the region
iteration ``i + ahead`` reads, where ``ahead`` iterations read about :data:`PREFETCH_AHEAD_BYTES`.
The region is the streamed buffer's read region of the mad block under the loop, bounded over the
loops inside it; it must advance by a constant number of elements per iteration and be one run
no longer than that step (a stream, contiguous or strided), else the loop is left as it is. Each
address is clamped into the buffer: a prefetch never names memory outside its tensor. The
prefetch is :data:`PREFETCH_LLVM`'s helper, not ``llvm.prefetch`` as LLVM declares it (see
there). The CUDA rule marks nothing.
"""

from __future__ import annotations

import math
import re

import tvm
from tvm import s_tir, tirx
from tvm.ir import StringImm
from tvm.sym import Analyzer
from tvm.sym.int_set import IntervalSet
from tvm.tirx.script import builder as T

from ..common import rewrite_prim_funcs

__all__ = ["CACHE_LINE", "PREFETCH", "PREFETCH_AHEAD_BYTES", "PREFETCH_LOCALITY", "PREFETCH_STREAMS", "STREAM_BYTES", "is_stream",
           "lower_prefetches", "prefetch_run", "prefetch_stream", "prefetched_buffers", "read_in_place"]

PREFETCH_STREAMS = True
"""Whether the rules mark the streams they read in place (:func:`prefetch_stream`)."""
STREAM_BYTES = 2 * 1024 * 1024
"""The smallest tensor marked as a stream. Inside a training step at batch 32 a layer's operands
come from memory, not from the last-level cache (a kernel there ran as fast as after 700 MB of
other writes, 2-3x slower than called again on the same tensors): MobileNetV2's 14x14 1x1 layers
(dy of 4.8 MB, x of 0.8 MB), streamed from memory, 32 -> 192 dW 0.94 -> 0.68 ms, 144 -> 32 dW 0.94
-> 0.49, 32 -> 192 dX 0.83 -> 0.60 with their runs prefetched, as fast as before when in cache.
(Zen 3, called again on tensors in its L3: the 1x1 dX's dy of 4.8 MB 1.03x, of 2-3.6 MB
0.93-0.98x.)"""
PREFETCH = "convgrad.prefetch"
"""Loop annotation: the names (comma-separated) of the buffers the loop's iterations stream (read in place)."""
PREFETCH_AHEAD_BYTES = 8 * 1024
"""About how many bytes of its runs a stream is asked for ahead of the iteration being computed
(Zen 3, the 1x1 dX, contiguous: 2.3 KB tiles, 1, 2, 4, 8 and 16 tiles ahead ran 3.1, 3.1, 2.5,
2.6, 3.2 ms; the Sapphire Rapids-class Xeon, the 16 -> 96 1x1 dW's runs of 64 bytes 384 apart,
from memory: 4, 8, 16, 32 and 64 KB of the tensor ahead 3.9, 3.4-3.5, 3.2, 3.1, 3.2 ms, and 8 KB
of runs, 48 KB of the tensor, 3.1-3.2)."""
CACHE_LINE = 64
PREFETCH_HELPER = "tvm_convgrad_prefetch"
PREFETCH_LOCALITY = 2
"""``llvm.prefetch``'s locality: 2 asks for the line into L2 (x86 ``prefetcht1``, AArch64
``prfm pldl2keep``), not into L1 (3, ``prefetcht0``). A tile asks for all its lines at once (an
AVX-512 1x1 dX's 14 pixel rows of 96 channels: 84 lines), likely more than L1 can track misses
for at once; into L2, they leave L1's to the tile's own loads, and the tile they are for finds
them in L2.
Zen 4, N=32 channels-last, from memory (64 MB written between calls), medians of 9, into L1 ->
into L2: the 16 -> 96 dX on 56x56 4.70 -> 2.65 ms and its dW 2.96 -> 2.70, 24 -> 144 dX on 28x28
2.54 -> 1.95, the forward of 144 -> 24 on 28x28 2.51 -> 1.76, of 96 -> 24 1.71 -> 1.17, of
32 -> 16 on 56x56 1.48 -> 1.12; the 14x14 layers' between 0.12 ms faster and 0.06 slower (8 KB
ahead; 16 KB ahead into L2 read the same). The Zen 3 and Sapphire Rapids-class figures above were asked into
L1, and not measured into L2."""
PREFETCH_LLVM = rf"""
declare void @llvm.prefetch.p0(ptr, i32, i32, i32)
define internal void @tvm_convgrad_prefetch(ptr %p) alwaysinline {{
  call void @llvm.prefetch.p0(ptr %p, i32 0, i32 {PREFETCH_LOCALITY}, i32 1) #0
  ret void
}}
attributes #0 = {{ nounwind willreturn memory(inaccessiblemem: readwrite) }}
"""
"""The prefetch a kernel imports (``pragma_import_llvm``) and calls: ``llvm.prefetch`` (a read,
into L2: :data:`PREFETCH_LOCALITY`), the call marked as touching no memory the kernel reaches. As LLVM declares it
(``memory(argmem: readwrite)``) it could write where it points: in a tile's steps, the sums
reached through a pointer (a dW's, which live across chunks) were then stored and loaded again
at every step instead of held in registers."""
PREFETCH_WRITE_HELPER = "tvm_convgrad_prefetch_write"
PREFETCH_WRITE_LLVM = PREFETCH_LLVM.replace(f"@{PREFETCH_HELPER}(", f"@{PREFETCH_WRITE_HELPER}(").replace("ptr %p, i32 0,", "ptr %p, i32 1,")
"""The helper :func:`prefetch_run` calls for lines to be written: ``llvm.prefetch`` with rw 1 (x86
``prefetchw``, which asks for the line owned, as a store must; AArch64 ``prfm pstl2keep``), as
:data:`PREFETCH_LLVM` otherwise."""
_PREFETCH_OF = re.compile(r'"tvm_convgrad_prefetch", T\.tvm_access_ptr\(T\.type_annotation\("\w+"\), (\w+)\.data')


def is_stream(nbytes: int) -> bool:
    """Whether a tensor of ``nbytes`` is a stream a kernel asks for ahead: :data:`PREFETCH_STREAMS`
    set and at least :data:`STREAM_BYTES`."""
    return PREFETCH_STREAMS and nbytes >= STREAM_BYTES


def prefetch_stream(sch: s_tir.Schedule, loop, buffer_name: str) -> None:
    """Mark ``loop``: each iteration reads the next part of ``buffer_name`` (a run of it, the
    runs a constant step apart), where :data:`PREFETCH_STREAMS` is set and the buffer (a parameter
    of the function) holds at least :data:`STREAM_BYTES`. A loop marked for several buffers
    prefetches each of them."""
    (buffer,) = [b for func in sch.mod.functions.values() for b in func.params if b.name == buffer_name]
    size = math.prod(int(d) for d in buffer.shape) * tvm.DataType(str(buffer.dtype)).bits // 8
    if is_stream(size):
        names = [buffer_name]
        marked = sch.get(loop).annotations.get(PREFETCH)
        if marked is not None:
            names = [*str(marked).split(","), buffer_name]
            sch.unannotate(loop, PREFETCH)
        sch.annotate(loop, PREFETCH, ",".join(dict.fromkeys(names)))


def read_in_place(sch: s_tir.Schedule, block) -> list[str]:
    """The names of the function parameters (framework tensors) ``block`` reads where they lie,
    in the order of its reads: the streams a rule may mark."""
    params = {buf.name for func in sch.mod.functions.values() for buf in func.params}
    return [read.source.name for read in sch.get(block).reads if read.source.name in params]


def lower_prefetches(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with the prefetches of every marked loop (see the module docstring); a module
    without marks is returned as it is."""
    return rewrite_prim_funcs(mod, lambda stmt, func: _with_prefetch(stmt, func) if isinstance(stmt, tirx.For) else stmt)


def prefetched_buffers(func: tirx.PrimFunc) -> list[str]:
    """The names of the buffers ``func``'s lowered prefetches read (in order of appearance)."""
    return _PREFETCH_OF.findall(func.script())


def _with_prefetch(loop: tirx.For, func: tirx.PrimFunc) -> tirx.For:
    """A marked ``loop`` of ``func`` without its mark, its body led by the prefetch of the stream of
    the parameter it names (as it is where no prefetch is found); an unmarked one as it is."""
    annotations = dict(loop.annotations or {})
    names = annotations.pop(PREFETCH, None)
    if names is None:
        return loop
    params = {buf.name: buf for buf in func.params}
    prefetches = [p for p in (_prefetch(loop, params[name]) for name in str(names).split(",")) if p is not None]
    body = tirx.SeqStmt([*prefetches, loop.body]) if prefetches else loop.body
    return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, body, loop.thread_binding, annotations, loop.step, loop.span)


def _read_span(loop: tirx.For, buffer):
    """``(first, last)``: the flat element indices bounding what one iteration of ``loop`` reads
    of ``buffer`` (its iterator free, the loops inside it over their ranges), from the first
    block under ``loop`` that reads ``buffer``; None where no block does."""
    found = _reading_block(loop.body, buffer, [])
    if found is None:
        return None
    realize, region, inner = found
    bound = Analyzer()
    for iv, value in zip(realize.block.iter_vars, realize.iter_values):
        bound.bind(iv.var, value)
    first = last = 0
    for extent, rng in zip(buffer.shape, region):
        first, last = first * extent + rng.min, last * extent + rng.min + rng.extent - 1
    dom = {lp.loop_var: IntervalSet(lp.min, lp.min + lp.extent - 1) for lp in inner}
    analyzer = Analyzer()
    return analyzer.int_set(bound.simplify(first), dom).min_value, analyzer.int_set(bound.simplify(last), dom).max_value


def _reading_block(stmt, buffer, inner: list):
    """``(the first SBlockRealize under stmt whose block reads buffer, its read region of buffer,
    the loops above it)``."""
    if isinstance(stmt, tirx.For):
        return _reading_block(stmt.body, buffer, inner + [stmt])
    if isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            found = _reading_block(s, buffer, inner)
            if found is not None:
                return found
        return None
    if isinstance(stmt, s_tir.SBlockRealize):
        for read in stmt.block.reads:
            if read.source.same_as(buffer):
                return stmt, read.region, inner
        return _reading_block(stmt.block.body, buffer, inner)
    if isinstance(stmt, s_tir.SBlock):
        return _reading_block(stmt.body, buffer, inner)
    if isinstance(stmt, tirx.IfThenElse):
        return _reading_block(stmt.then_case, buffer, inner)
    return None


def _substituted(expr, var, value):
    """``expr`` with ``var`` replaced by ``value`` (simplified)."""
    analyzer = Analyzer()
    analyzer.bind(var, value)
    return analyzer.simplify(expr)


def _never_negative(expr) -> bool:
    """Whether ``expr`` is at least 0 for every value its variables (loop iterators: 0 and up) take."""
    dom = {v: IntervalSet(tirx.IntImm(v.ty, 0), tirx.IntImm(v.ty, 2**30)) for v in tirx.analysis.undefined_vars(expr)}
    return Analyzer().int_set(expr, dom).min_value.value >= 0 if dom else Analyzer().can_prove(expr >= 0)


def _prefetch(loop: tirx.For, buffer):
    """The prefetch loop at the top of ``loop``'s body (see the module docstring), or None."""
    span = _read_span(loop, buffer)
    if span is None:
        return None
    start, end = span
    var, index = loop.loop_var, str(loop.loop_var.ty)
    at = [_substituted(start, var, tirx.IntImm(index, k)) for k in range(3)]
    step = Analyzer().simplify(at[1] - at[0])
    if not isinstance(step, tirx.IntImm) or step.value <= 0 or not Analyzer().can_prove_equal(at[2] - at[1], step):
        return None  # (not a stream advancing by a constant number of elements per iteration)
    run = Analyzer().simplify(end - start + 1)
    if not isinstance(run, tirx.IntImm) or run.value > step.value:
        return None  # (an iteration's reads not one run within its step: rows of several pixels, planes)
    itemsize = tvm.DataType(str(buffer.dtype)).bits // 8
    ahead = max(1, math.ceil(PREFETCH_AHEAD_BYTES / (run.value * itemsize)))
    lines = math.ceil(run.value * itemsize / CACHE_LINE)
    size = math.prod(int(d) for d in buffer.shape)
    line = tirx.Var("line", index)
    flat = start + (ahead * step.value) + line * (CACHE_LINE // itemsize)
    if not _never_negative(flat):  # (a padded read's region starts before the tensor: rows above the image)
        flat = tirx.max(flat, tirx.IntImm(index, 0))
    flat = tirx.min(flat, tirx.IntImm(index, size - 1))
    loop = tirx.For(line, tirx.IntImm(index, 0), tirx.IntImm(index, lines), tirx.ForKind.SERIAL, tirx.Evaluate(_call(buffer, flat)))
    return tirx.AttrStmt(tirx.IntImm("int32", 0), "pragma_import_llvm", StringImm(PREFETCH_LLVM), loop)


def _call(buffer, flat, write: bool = False):
    """The helper's call on the address of ``buffer``'s flat element ``flat`` (:data:`PREFETCH_WRITE_LLVM`'s where ``write``)."""
    return tirx.call_extern("void", PREFETCH_WRITE_HELPER if write else PREFETCH_HELPER, buffer.access_ptr("r", offset=flat))


def prefetch_run(buffer, first, count: int, write: bool = False) -> None:
    """Inside an open ``IRBuilder`` frame (a kernel whose loops are written out): ask for the cache
    lines of ``buffer``'s flat elements ``[first, first + count)`` (``first`` >= 0, the lines from
    the one holding ``first``; each address clamped to the buffer's last element), as the marked
    loops do (:data:`PREFETCH_LLVM`'s helper, into L2); ``write``: to be written
    (:data:`PREFETCH_WRITE_LLVM`'s)."""
    itemsize = tvm.DataType(str(buffer.dtype)).bits // 8
    last = math.prod(int(d) for d in buffer.shape) - 1
    lines = math.ceil((count * itemsize + CACHE_LINE - itemsize) / CACHE_LINE)  # (the most a run starting mid-line spans)
    with T.attr(tirx.IntImm("int32", 0), "pragma_import_llvm", StringImm(PREFETCH_WRITE_LLVM if write else PREFETCH_LLVM)):
        for line in range(lines):
            T.evaluate(_call(buffer, T.min(first + line * (CACHE_LINE // itemsize), last), write))
