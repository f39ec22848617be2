"""The result of a dX split into live-tap regions: written region by region, without a select.

A 2-D cube dX whose taps read dy's zero padding in enough of its (output, tap) pairs (an atrous
layer, a 3x3 on a small map) computes each region of its output — the interior and the borders,
each with only the taps that reach real dy — as a mad of its own, ``dx_cc_<first row>_<first
column>`` of shape ``(N, C1, rows, columns, 16)`` (:mod:`tvm_convgrad.dsl.compute.phases`). The
result stage picks each pixel from its region: a chain of selects over the regions, per element.
Here it runs as tasks of an image's block of 16 channels (:func:`.loops.channel_block_task`), the
regions' mads computed under the task (their sums stay in cache), the row loop partitioned at the
regions' edges (``loop_partition``) and each row part's column loop at the edges of its own
regions (a band of one row keeps its columns whole): each part reads one region, its select chain
folded away by the bounds of its loops. On the ASPP layer at rate 6 (2048 -> 256 channels, 3x3
on 14x14, N=4, NCHW, AVX-512) the result as one elementwise pass of selects took more time than
the mads saved by skipping the padding.

Where the regions run across the images (a small batch of small maps,
:func:`~tvm_convgrad.dsl.compute.phases.across_images`), a task is instead a group of channel
blocks over the whole batch (:func:`batch_task_blocks`): it packs its blocks' weights (``w_col`` /
``w_conv``, into the core's cache) and runs every region's mad over the batch's pixels as one
iterator, tiled across the images (:meth:`.cube.CubeInputGrad._batch_tiles`), then writes its
channels of the result. Each region's mad as a parallel pass of its own streamed the whole weight
pack from memory once per region (five on a 7x7 map) after a pass that packed it. The Sapphire
Rapids-class guest (2 cores), ms, batch tasks / a pass per region, each built twice: the 3x3 dX of
512 channels on 7x7, N=8, 6.6-6.8 / 8.7-9.1 (PyTorch's 7.8-8.0; channels-last 7.1 / 8.8-9.1), N=4
3.7 / 5.3-5.4; 32 x 512 on 4x4 9.1-9.6 / 11.5-14.7; 256 on 7x7 1.5-1.6 / 1.6-1.9; the forwards and
2x2 maps level.
"""

from __future__ import annotations

from tvm import s_tir, tirx

from ...dsl.compute.phases import ACROSS_IMAGES_MIN, ACROSS_IMAGES_PIXELS, across_images
from ...dsl.compute.stages import CONV_CC, DX_CC, PHASE_AXES, W_COL, W_CONV, phase_firsts
from ...isa import IsaPlan
from ...layout import C0
from ..common import buffer_bytes, loop_extent, stage_blocks
from .cube import weights_in_cache
from .elementwise import in_source_order
from .loops import channel_block_task, channels_last_result, pack_under, producers_named, restore_unit_loops
from .tiles import divisors, most_blocks_a_task

__all__ = ["ACROSS_IMAGES_MIN", "ACROSS_IMAGES_PIXELS", "BATCH_TILE_BLOCKS", "NXC_TASK_BLOCKS", "TASKS_PER_CORE",
           "batch_task_blocks", "region_cuts", "regions_one_by_one"]

NXC_TASK_BLOCKS = 16
"""Channel blocks per task of a channels-last result: each pixel's 1 KB of a task's channels is
one run of lines (16 channels, 64 bytes, a pixel's row of 2048 fp32 channels apart, defeat the
prefetchers: the ASPP layer at rate 6, N=4, 28.0 ms against 20.7 for NCHW)."""
TASKS_PER_CORE = 4  # ... while the tasks stay at least this many per core
BATCH_TILE_BLOCKS = 2  # a batch task's fewest channel blocks: a tile's two on AVX-512 (:func:`batch_task_blocks`)


def batch_task_blocks(blocks: int, block_bytes: int, budget: int, cores: int) -> int:
    """Channel blocks per task where the regions run across the images (:func:`regions_one_by_one`):
    the most (a divisor of ``blocks``) whose packed weights (``block_bytes`` a block) fit ``budget``
    (:func:`.cube.weights_in_cache`), or :data:`BATCH_TILE_BLOCKS` if more, while the tasks stay
    :data:`TASKS_PER_CORE` per core; 1 at least. 512 channels on a 2 MB L2: 2 (295 KB a block)."""
    fits = [g for g in divisors(blocks, blocks)
            if (g <= BATCH_TILE_BLOCKS or g * block_bytes <= budget) and blocks // g >= TASKS_PER_CORE * cores]
    return max(fits, default=1)


def region_cuts(spans: list, extent: int) -> list[int]:
    """Where an axis of ``extent`` outputs changes region: the inner edges of the regions'
    ``(first, count)`` spans; none where a span is None (stride phases, which interleave) or two
    spans overlap without being equal."""
    if None in spans:
        return []
    distinct = sorted(set(spans))
    for (first, count), (after, _) in zip(distinct, distinct[1:]):
        if after < first + count:
            return []
    return sorted({edge for first, count in distinct for edge in (first, first + count) if 0 < edge < extent})


def regions_one_by_one(sch: s_tir.Schedule, cores: int, plan: IsaPlan | None = None) -> set[str]:
    """The result of a cube dX or forward of live-tap regions (more than one ``dx_cc`` / ``conv_cc``
    mad, each holding a contiguous range of rows and of columns) as tasks of an image's 16 channels, its pixel loops
    partitioned at the regions' edges, the regions' mads computed under the task (see the module
    docstring); where its regions run across the images (:func:`.phases.across_images`: a map of
    at most ``TINY_MAP`` pixels, a small batch of small maps), tasks of a group of channel blocks
    over the batch, their weight packs in them, given the target's ``plan`` and channel blocks for
    :data:`BATCH_TILE_BLOCKS` a task (else each region's mad runs on its own). Tried on a copy
    first. Returns the stages it placed (the result and its copies, the weight pack), none where
    it does not apply (stride phases, 3-D, a layout without separate row and column loops)."""
    blocks = stage_blocks(sch)
    phases = [b for b in blocks if sch.get(b).name_hint.startswith((DX_CC, CONV_CC)) and PHASE_AXES in sch.get(b).annotations]
    if len(phases) < 2 or any(len(phase_firsts(sch.get(b).name_hint)) != 2 for b in phases):
        return set()
    consumers = {sch.get(c).name_hint for p in phases for c in sch.get_consumers(p)}
    if len(consumers) != 1:
        return set()
    (result,) = consumers
    spans, grids = [], set()
    for b in phases:  # (first, count) per axis; an axis of stride phases has no contiguous spans: it is not cut
        shape = [int(d) for d in sch.get(b).writes[0].source.shape]
        sh, sw, *size = [int(v) for v in sch.get(b).annotations[PHASE_AXES]]
        spans.append(tuple((first, count) if stride == 1 else None for first, count, stride in zip(phase_firsts(sch.get(b).name_hint), shape[2:4], (sh, sw))))
        grids.add(tuple(size))
    names = [sch.get(b).name_hint for b in phases]
    if len(grids) != 1:
        return set()
    (grid,) = grids
    images = int(sch.get(phases[0]).writes[0].source.shape[0])
    across = across_images(images, grid[0] * grid[1])
    if across and plan is None:
        return set()  # (no plan, no cache to size the tasks by: each region's mad on its own, tiled across the images)
    batch = plan if across else None
    probe = sch.copy()
    try:
        if not _partition(probe, result, names, spans, grid, cores, batch):
            return set()
    except (s_tir.ScheduleError, ValueError):
        return set()
    return {result} | _partition(sch, result, names, spans, grid, cores, batch)


def _partition(sch: s_tir.Schedule, result: str, phases: list[str], spans, grid: tuple[int, int], cores: int,
               batch: IsaPlan | None = None) -> set[str]:  # fmt: skip
    """:func:`regions_one_by_one` on ``sch``: the names of the result's blocks under the task
    (its copies and their scopes; empty where it does not apply: the result's pixels not a row
    loop and a column loop of the regions' ``grid``, e.g. TBE's flat ``H*W`` result); ``batch``:
    the target's plan where the tasks are channel groups over the batch."""
    block = sch.get_sblock(result)
    channels_last = channels_last_result(sch, block, phases[0])
    blocks = int(sch.get(sch.get_sblock(phases[0])).writes[0].source.shape[1])
    group = 1
    packs = producers_named(sch, sch.get_sblock(phases[0]), (W_COL, W_CONV))
    if batch is not None:  # (the budget of a mad of the first region's taps, its iterators' 7th and 8th)
        weight_bytes = buffer_bytes(sch, sch.get(packs[0]).name_hint) if packs else 0
        taps = [int(iv.dom.extent) for iv in sch.get(sch.get_sblock(phases[0])).iter_vars][6:8]
        group = batch_task_blocks(blocks, weight_bytes // blocks, weights_in_cache(batch, taps[0] * taps[1]), cores)
        if group < BATCH_TILE_BLOCKS:  # too few blocks for every core's tasks: each region's mad on its own, across the images
            return set()
    elif channels_last:  # as many blocks as keep TASKS_PER_CORE tasks per core, up to NXC_TASK_BLOCKS
        images = loop_extent(sch, sch.get_loops(block)[0])
        group = most_blocks_a_task(blocks, images, TASKS_PER_CORE * cores, NXC_TASK_BLOCKS)
    found = channel_block_task(sch, block, phases[0], cores, images_outer=False, blocks=group, images_inside=batch is not None)
    if found is None:
        return set()
    task, channels, (rows, cols) = found
    if (loop_extent(sch, rows), loop_extent(sch, cols)) != grid:
        return set()
    width = loop_extent(sch, cols)
    row_cuts = region_cuts([h for h, _ in spans], loop_extent(sch, rows))
    row_edges = _edges(row_cuts, loop_extent(sch, rows))
    band_spans = [[w for h, w in spans if _holds(h, top)] for top, _ in row_edges]  # the column spans of each row part's regions
    col_cuts = [region_cuts(band, width) for band in band_spans]
    if not row_cuts and not any(col_cuts):
        return set()
    for name in phases:  # each region's mad for the task's image and channels, in cache for the result
        if batch is not None:  # the batch's pixels of a region one iterator, tiled across the images under the task
            _flat_batch(sch, sch.get_sblock(name))
        sch.compute_at(sch.get_sblock(name), task)
        restore_unit_loops(sch, sch.get_sblock(name))
    packed = set()
    if batch is not None:  # the task's weights packed in it, into the core's cache, for every region
        for pack in packs:
            packed.add(sch.get(pack).name_hint)
            pack_under(sch, pack, task)
            in_source_order(sch, pack, sch.get_loops(pack)[1:-1])  # (below the task, above the lanes)
    if channels_last:
        channels, _ = sch.split(channels, [None, C0])
    for row_part, (top, _), cuts, band in zip(_split_at(sch, rows, row_cuts), row_edges, col_cuts, band_spans):
        (copy,) = sch.get_child_blocks(row_part) if row_cuts else (block,)
        col_loop = sch.get_loops(copy)[-3 if channels_last else -1]
        for col_part, (left, _) in zip(_split_at(sch, col_loop, cuts), _edges(cuts, width)):
            (part,) = sch.get_child_blocks(col_part) if cuts else (copy,)
            live = any(_holds(span, left) for span in band)
            if channels_last and live:  # (a part no region holds is a constant: a vectorized bf16 constant does not legalize)
                sch.vectorize(sch.get_loops(part)[-1])
            # (NCX: each part's columns gather from the region's 16-lane rows; LLVM vectorizes what it can)
    under = [b for b in stage_blocks(sch) if any(sch.get(lp).same_as(sch.get(task)) for lp in sch.get_loops(b))]
    return {sch.get(b).name_hint for b in under} - set(phases) | packed


def _flat_batch(sch: s_tir.Schedule, block):
    """A region's mad ``(n, c1, j, i, c0 | reduction)`` and its sums ``(N, C1, rows, cols, 16)``
    made ``(c1, p, c0 | ...)`` and ``(C1, N*rows*cols, 16)``, ``p = (n*rows + j)*cols + i``: the
    batch's pixels one iterator, whose tiles a task's loop bounds as a box."""
    _, _, rows, cols, *_ = [int(iv.dom.extent) for iv in sch.get(block).iter_vars]

    def flat(n, c1, j, i, *rest):
        return (c1, (n * rows + j) * cols + i, *rest)

    sch.transform_layout(block, ("write", 0), tirx.IndexMap.from_func(flat, ndim=5))
    sch.transform_block_layout(block, tirx.IndexMap.from_func(flat, ndim=9))


def _edges(cuts: list[int], extent: int) -> list[tuple[int, int]]:
    """The ``[start, end)`` of each part of an axis of ``extent`` cut at ``cuts``."""
    edges = [0, *cuts, extent]
    return list(zip(edges, edges[1:]))


def _holds(span, position: int) -> bool:
    """Whether a region's ``(first, count)`` span (None: a stride phase's, every position) holds ``position``."""
    return span is None or span[0] <= position < span[0] + span[1]


def _split_at(sch: s_tir.Schedule, loop, cuts: list[int]) -> list:
    """``loop`` partitioned at ``cuts`` (its parts, in order), or ``[loop]`` without cuts."""
    if not cuts:
        return [loop]
    edges = [0, *cuts]
    return list(sch.loop_partition(loop, [b - a for a, b in zip(edges, edges[1:])] + [None]))
