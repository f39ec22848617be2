"""Loop structure the CPU formulations share: the base of every mad's schedule (:class:`CpuMad`:
register tiles, tile splits that are MetaSchedule samples when tunable, the result written back
inside the mad's tasks), packs computed under a loop, whole tiles and an edge, the write-back of
an ``rfactor``, and a strided dX's phases image by image (the packs' own passes:
:mod:`.elementwise`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from tvm import s_tir, sym, tirx

from ...dsl.compute.stages import DX_PHASE_PREFIXES, DY_PACKS
from ...layout import C0
from ..common import elements, loop_extent, loop_position, stage_blocks

__all__ = [
    "PER_IMAGE_ABOVE", "PHASES_PER_IMAGE", "WRITE_RUN", "CpuMad", "channel_block_task", "channels_innermost", "channels_last_result", "pack_in_source_axes", "pack_under", "phases_image_by_image", "producers_named", "reads_of", "reads_past", "restore_unit_loops", "result_channel_var", "sum_parts", "whole_tiles_and_edge",
]  # fmt: skip

PHASES_PER_IMAGE = True  # strided dX of a batch: the phases image by image (:func:`phases_image_by_image`)
PER_IMAGE_ABOVE = 2 * 1024 * 1024  # ... when the batch's fp32 dy is larger than this (bytes)
WRITE_RUN = 64  # the most elements of a result's contiguous run vectorized in one loop (:meth:`CpuMad._vectorize_contiguous_run`)


@dataclass
class CpuMad(ABC):
    """The schedule of one mad on the CPU: the schedule it works in, the rule's config
    (:class:`~.rule.CpuConfig`: the ISA plan, the cores), whether its tiles are samples, and what
    the rule shares between mads: the packs a mad moved into its own loops (``placed``). A dX
    phase's loops may sit under the result's batch loop (:func:`phases_image_by_image`): its
    schedule unpacks its own loops from the innermost outward, and its batch loop is then the
    image's (extent 1, or the depth of a 3-D image)."""

    sch: s_tir.Schedule
    config: "CpuConfig"  # noqa: F821 - the rule's, defined with it
    tunable: bool
    placed: set = field(default_factory=set)

    @property
    def plan(self):
        return self.config.plan

    @property
    def cores(self) -> int:
        return self.config.cores

    write_back_in_task = False
    """Whether the result stage runs inside the mad's parallel tasks where it can
    (:meth:`write_back_in`)."""

    @abstractmethod
    def schedule(self, block) -> None:
        """Schedule ``block`` (the mad) in place."""

    def under_task(self, block) -> bool:
        """Whether ``block`` already runs inside a parallel task (a live-tap region's mad under its
        result's, :func:`.regions.regions_one_by_one`): its own loops then stay serial."""
        return any(self.sch.get(lp).kind == tirx.ForKind.PARALLEL for lp in self.sch.get_loops(block))

    def sole_consumer(self, block):
        """The stage that reads ``block``'s sums, where the mad is its only producer and it reads
        the sums within their extent (a one-phase dX's result); None otherwise (a strided dX's
        result, which its phases produce together; a result with bias-only rows)."""
        sch = self.sch
        consumers = sch.get_consumers(block)
        if len(consumers) != 1:
            return None
        (consumer,) = consumers
        (sums,) = [w.source for w in sch.get(block).writes]
        if any(not w.source.same_as(sums) for p in sch.get_producers(consumer) for w in sch.get(p).writes):  # (the mad's init and update)
            return None
        if reads_past(sch.get(consumer), sums):  # compute-at would keep only the consumer's iterations inside the sums' extent
            return None
        return consumer

    def write_back_stage(self, block):
        """The stage :meth:`write_back_in` would move: :meth:`sole_consumer`, where
        :attr:`write_back_in_task` is set and the schedule is not a tunable one; else None."""
        if not self.write_back_in_task or self.tunable:
            return None
        return self.sole_consumer(block)

    def pack_at(self, pack, loop):
        """The stage ``pack`` computed under ``loop`` (:func:`pack_under`; its lanes left to LLVM
        in a tunable schedule, whose trace must give the same loops on every replay), placed."""
        pack_under(self.sch, pack, loop, vectorize=not self.tunable)
        self.placed.add(self.sch.get(pack).name_hint)

    def write_back_in(self, block, task) -> bool:
        """The result stage (and the layout stage folded into it) of a mad that is its only
        producer, moved into the mad's parallel ``task`` loop: each task's sums are written out
        (cast, bias, relayout) while they are in cache, instead of the whole mad's output making a
        second pass through memory (a stride-1 dX of a 1x1 projection on a 28x28 map, N=32: 8.7
        -> 4.6 ms). Only where :attr:`write_back_in_task` is set and :meth:`sole_consumer` finds
        the stage. Returns whether it moved."""
        sch = self.sch
        consumer = self.write_back_stage(block)
        if consumer is None:
            return False
        try:  # a consumer whose indices TVM cannot invert over the task (TBE's flat Ho*Wo, a grouped gather) stays where it is
            sch.reverse_compute_at(consumer, task)
        except (s_tir.ScheduleError, ValueError):  # (TVM reports a region it cannot solve as a ValueError, before any change)
            return False
        loops = sch.get_loops(consumer)
        at = loop_position(sch, loops, task)
        inner = loops[at + 1 :]
        if inner and loop_extent(sch, inner[-1]) % 8 == 0:
            lanes = inner[-1]
            _, lanes = sch.split(lanes, [None, 8])
            sch.vectorize(lanes)
        elif inner:
            self._vectorize_contiguous_run(consumer, inner)
        self.placed.add(sch.get(consumer).name_hint)
        return True

    def _vectorize_contiguous_run(self, consumer, inner):
        """A result whose innermost loop is short (a weight gradient in OIX: the ``(kh, kw)`` taps
        of one ``(o, i)``, 9 contiguous floats): the trailing ``inner`` loops that cover whole
        trailing dimensions of the result, at most :data:`WRITE_RUN` elements, fused and
        vectorized. The stores are then contiguous and the loads strided in cache; left to
        itself, LLVM vectorizes the channel loop outside them into scatters at the taps' stride
        (``vscatterqps``, 512 -> 512 on 2x2, N=8: 3.0 -> 1.55 ms)."""
        sch = self.sch
        (written,) = sch.get(consumer).writes
        dims = [int(d) for d in written.source.shape]
        run, lanes = [], 1
        for loop, dim in zip(reversed(inner), reversed(dims)):
            extent = loop_extent(sch, loop)
            if extent != dim or lanes * extent > WRITE_RUN:
                break
            run.insert(0, loop)
            lanes *= extent
        if lanes > 1:
            sch.vectorize(sch.fuse(*run) if len(run) > 1 else run[0])

    def split(self, loop, inner: int, max_inner: int):
        """``(outer, inner)``: ``inner`` fixed, or a MetaSchedule sample (a divisor of the
        extent, at most ``max_inner``) when tunable."""
        if self.tunable:  # the design space's own decision is the default
            extent = loop_extent(self.sch, loop)
            decision = [extent // inner, inner] if extent % inner == 0 and inner <= max_inner else None
            factors = self.sch.sample_perfect_tile(loop, n=2, max_innermost_factor=max_inner, decision=decision)
            return self.sch.split(loop, factors)
        return self.sch.split(loop, [None, inner])

    def split_blocks(self, loop, blocks: int) -> tuple:
        """``(outer, [inner])``: a register tile's ``blocks`` channel blocks split off ``loop``
        (to be placed innermost of the tile, unrolled); ``(loop, [])`` for a tile of one block."""
        if blocks == 1:
            return loop, []
        outer, inner = self.sch.split(loop, [None, blocks])
        return outer, [inner]

    def tile_body(self, block, first_reduce):
        """The 16x16 register tile: C0 rows unrolled, C0 lanes vectorized; init before the reduction."""
        *_, rows, lanes = self.sch.get_loops(block)
        self.register_tile(block, [rows], lanes, first_reduce)

    def register_tile(self, block, unrolled, lanes, first_reduce):
        """A tile's accumulators in registers: its loops unrolled, the lanes vectorized, the
        accumulators set to 0 before ``first_reduce``."""
        for loop in unrolled:
            self.sch.unroll(loop)
        self.sch.vectorize(lanes)
        self.sch.decompose_reduction(block, first_reduce)


def pack_under(sch: s_tir.Schedule, pack, loop, vectorize: bool = True):
    """A pack stage computed under ``loop`` (what the stages there read of it, made there, while
    it is in cache), its innermost loop (its C0 lanes) vectorized."""
    sch.compute_at(pack, loop)
    if vectorize:
        sch.vectorize(sch.get_loops(pack)[-1])


def producers_named(sch: s_tir.Schedule, block, names) -> list:
    """The producers of ``block`` whose stage names are among ``names`` (none of a pack that was
    inlined: an input read in place, converting)."""
    return [p for p in sch.get_producers(block) if sch.get(p).name_hint in names]


def reads_past(stmt, buffer) -> bool:
    """Whether the block ``stmt`` reads ``buffer`` at an index past its extent anywhere in the
    block's domain (a guarded read: a strided dX's one live phase under a result whose other rows
    are bias or zero only). ``reverse_compute_at`` bounds the consumer's loops by the region it
    reads, so such rows would never be written."""
    analyzer = sym.Analyzer()
    for iv in stmt.iter_vars:
        analyzer.bind(iv.var, iv.dom)
    for read in stmt.reads:
        if not read.source.same_as(buffer):
            continue
        for index, extent in zip(read.region, buffer.shape):
            low, high = analyzer.const_int_bound(index.min), analyzer.const_int_bound(index.min + index.extent - 1)
            if low.min_value < 0 or high.max_value >= int(extent):
                return True
    return False


def result_channel_var(stmt, phase: str):
    """The iterator of a dX / forward result block ``stmt`` that indexes the C1 axis of its read of
    ``phase`` (its channel), or None where there is no such read or not exactly one."""
    (read,) = [r for r in stmt.reads if r.source.name == phase] or [None]
    if read is None:
        return None
    channel = [iv.var for iv in stmt.iter_vars if iv.var in set(tirx.analysis.undefined_vars(read.region[1].min))]
    return channel[0] if len(channel) == 1 else None


def channels_last_result(sch: s_tir.Schedule, block, phase: str) -> bool:
    """Whether the result ``block``'s innermost iterator is its channel (an NXC result of ``phase``)."""
    stmt = sch.get(block)
    channel = result_channel_var(stmt, phase)
    return channel is not None and stmt.iter_vars[-1].var.same_as(channel)


def channels_innermost(sch: s_tir.Schedule, pack) -> bool:
    """Whether the pack ``pack`` (C0 lanes its last axis) reads one tensor whose innermost axis its
    lanes index: an NXC input."""
    stmt = sch.get(pack)
    if len(stmt.reads) != 1:
        return False
    return stmt.iter_vars[-1].var in set(tirx.analysis.undefined_vars(stmt.reads[0].region[-1].min))


def pack_in_source_axes(sch: s_tir.Schedule, pack, task):
    """The loops of ``pack`` below ``task`` (its lanes, innermost, left there) reordered to walk the
    one tensor it reads in that tensor's axis order: an NXC input's pixel loops outside its channel
    blocks, so each pixel's channels are read as one contiguous run instead of a line per block.
    (:func:`.elementwise.in_source_order` orders a pack's own loops the same way, by their strides,
    but only loops bound directly to an iterator; a pack under a band task binds its rows through
    the task's. Letting that one read bindings too reorders six of the guard-page calls' other
    packs, a change of its own.)"""
    stmt = sch.get(pack)
    if len(stmt.reads) != 1:
        return
    region = stmt.reads[0].region
    loops = sch.get_loops(pack)
    at = loop_position(sch, loops, task)
    below = loops[at + 1 : -1]
    values = sch.get(loops[-1]).body.iter_values

    def axis(loop) -> int:  # the first axis of the source that the loop's iterators index
        var = sch.get(loop).loop_var
        uses = [d for iv, value in zip(stmt.iter_vars, values) if var in set(tirx.analysis.undefined_vars(value))
                for d, r in enumerate(region) if iv.var in set(tirx.analysis.undefined_vars(r.min))]  # fmt: skip
        return min(uses, default=len(region))

    order = sorted(below, key=axis)
    if len(order) > 1 and any(not sch.get(a).same_as(sch.get(b)) for a, b in zip(order, below)):
        sch.reorder(*order)


def channel_block_task(sch: s_tir.Schedule, block, phase: str, min_tasks: int = 1, images_outer: bool = True, blocks: int = 1,
                       images_inside: bool = False):  # fmt: skip
    """A dX result ``block`` (unscheduled: an image loop, then its channels and two pixel axes in
    the layout's order) as parallel tasks of one image's block of 16 channels (``blocks`` of
    them): the channel loop (:func:`result_channel_var`'s) split by ``16*blocks``, the image and
    channel-block loops fused outermost and parallel (``images_outer=False``: the channel blocks
    outside, so a core's consecutive tasks share a block's weights; ``images_inside``: each task
    the blocks of every image, the image loop first below it); below the task the channel loop
    first for a channels-first result (NCX), last otherwise (NXC). Returns ``(task, the task's
    channel loop, [the pixel loops])``, or None, unchanged, where the block is not of that form or
    makes fewer than ``min_tasks``."""
    stmt = sch.get(block)
    loops = sch.get_loops(block)
    realize = sch.get(loops[-1]).body
    loop_of = {iv.var: lp for iv, lp in zip(stmt.iter_vars, loops)} if len(loops) == len(stmt.iter_vars) else {}
    if len(loops) != 4 or not all(isinstance(v, tirx.Var) for v in realize.iter_values):
        return None
    channel = result_channel_var(stmt, phase)
    if channel is None or channel not in loop_of:
        return None
    n, *spatial = loops
    channel_loop = loop_of[channel]
    tasks = -(-loop_extent(sch, channel_loop) // (C0 * blocks)) * (1 if images_inside else loop_extent(sch, n))
    if sch.get(channel_loop).same_as(sch.get(n)) or tasks < min_tasks:
        return None
    rest = [lp for lp in spatial if not sch.get(lp).same_as(sch.get(channel_loop))]
    channels_first = sch.get(spatial[0]).same_as(sch.get(channel_loop))
    c1, c0 = sch.split(channel_loop, [None, C0 * blocks])
    outer = [c1] if images_inside else [n, c1] if images_outer else [c1, n]
    sch.reorder(*outer, *([n] if images_inside else []), *([c0, *rest] if channels_first else [*rest, c0]))
    task = sch.fuse(*outer) if len(outer) > 1 else c1
    sch.parallel(task)
    return task, c0, rest


def whole_tiles_and_edge(sch: s_tir.Schedule, loop, extent: int, tile: int):
    """Partition ``loop`` (``extent`` iterations) into whole tiles of ``tile`` and one edge of
    ``extent % tile`` (``loop_partition``: a copy of the block under each part, so no iteration
    needs a predicate). Yields per copy ``(block, [the tile loop] or [] on the edge, the loop
    inside a tile, the loops below it)``. Each copy is a scope block of its own, out of reach of
    the loops outside the partition: the whole reduction must be below ``loop``. Where ``tile``
    divides ``extent``: the block itself, split, and no edge."""
    parts = sch.loop_partition(loop, [extent - extent % tile, None]) if extent % tile else (loop,)
    whole = parts[0]
    for part in parts:
        (copy,) = sch.get_child_blocks(part)
        loops = sch.get_loops(copy)
        at = loop_position(sch, loops, part)
        if part is whole:
            tiles, inner = sch.split(part, [None, tile])
            yield copy, [tiles], inner, loops[at + 1 :]
        else:  # the edge: one tile
            yield copy, [], part, loops[at + 1 :]



def phases_image_by_image(sch: s_tir.Schedule) -> set[str]:
    """A strided dX of a batch, image by image: every stride phase reads all of dy, so phases run
    one after another over the whole batch read dy from memory once per phase, and a channel-
    planar pack (``dy_rows``: a tile reads as many rows as there are channels) from memory at
    the latency of one stream per plane. Under the batch loop of the result stage instead, each
    image's dy is packed and read by every phase while it is in cache (and TVM allocates the
    packed dy and the phases' outputs for one image). Returns the stages moved under that loop."""
    blocks = stage_blocks(sch)
    phases = [b for b in blocks if sch.get(b).name_hint.startswith(DX_PHASE_PREFIXES)]
    if len(phases) < 2:
        return set()
    (result,) = {sch.get(c).name_hint for c in sch.get_consumers(phases[0])}
    batch = sch.get_loops(sch.get_sblock(result))[0]
    images = loop_extent(sch, batch)
    dy_elements = max((elements(r.source) for r in sch.get(phases[0]).reads if r.source.name in DY_PACKS), default=0)
    if images < 2 or dy_elements * 4 <= PER_IMAGE_ABOVE:
        return set()
    moved = {result}
    for phase in phases:
        sch.compute_at(phase, batch)
        restore_unit_loops(sch, phase)
        moved.add(sch.get(phase).name_hint)
    for pack in blocks:
        if sch.get(pack).name_hint in DY_PACKS:
            sch.compute_at(pack, batch)
            moved.add(sch.get(pack).name_hint)
    return moved



def restore_unit_loops(sch: s_tir.Schedule, block, shared: int = 1):
    """One loop per iter var below the first ``shared`` loops again after a ``compute_at`` (which
    makes none for an iter the outer loop fixes: a 2-D phase's image, or one of extent 1, e.g. a
    stride phase with a single tap), so the block's own loops unpack the same at every rank (a 3-D
    phase keeps its depth loop under the image's)."""
    loops = list(sch.get_loops(block))[shared:]
    realize = sch.get(loops[-1]).body
    own = {sch.get(lp).loop_var: lp for lp in loops}
    missing = 0
    for value in realize.iter_values:
        used = [own[v] for v in tirx.analysis.undefined_vars(value) if v in own]
        if not used:
            missing += 1
            continue
        for _ in range(missing):
            sch.add_unit_loop(used[0])
        missing = 0
    for _ in range(missing):
        sch.add_unit_loop(block)


def sum_parts(sch: s_tir.Schedule, block):
    """The write-back of an rfactor: ``dW = part_0 + part_1 + ...`` in a fixed order, vectorized."""
    part, *spatial = sch.get_loops(block)
    *outer, lanes = spatial
    sch.reorder(*outer, part, lanes)
    sch.parallel(sch.fuse(*outer))
    sch.vectorize(lanes)
    init = sch.decompose_reduction(block, part)
    sch.vectorize(sch.get_loops(init)[-1])


def reads_of(sch: s_tir.Schedule, buffer: str) -> set[str]:
    """The names of every block of the function that reads ``buffer``, at any depth (a live-tap
    region's mad already partitioned into copies under scope blocks is no consumer
    ``get_consumers`` reports), each without its ``_update`` suffix."""
    readers, todo = set(), list(sch.get_child_blocks(sch.get_sblock("root")))
    while todo:
        block = todo.pop()
        todo.extend(sch.get_child_blocks(block))
        stmt = sch.get(block)
        if any(r.source.name == buffer for r in stmt.reads):
            readers.add(stmt.name_hint.removesuffix("_update"))
    return readers
