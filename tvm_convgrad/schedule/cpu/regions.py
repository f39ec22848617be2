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
"""

from __future__ import annotations

from tvm import s_tir

from ...dsl.compute.phases import ACROSS_IMAGES_MIN, ACROSS_IMAGES_PIXELS, across_images
from ...dsl.compute.stages import CONV_CC, DX_CC, PHASE_AXES, phase_firsts
from ...layout import C0
from ..common import loop_extent, stage_blocks
from .loops import channel_block_task, channels_last_result, restore_unit_loops
from .tiles import most_blocks_a_task

__all__ = ["ACROSS_IMAGES_MIN", "ACROSS_IMAGES_PIXELS", "NXC_TASK_BLOCKS", "TASKS_PER_CORE", "region_cuts", "regions_one_by_one"]

NXC_TASK_BLOCKS = 16
"""Channel blocks per task of a channels-last result: each pixel's 1 KB of a task's channels is
one run of lines (16 channels, 64 bytes, a pixel's row of 2048 fp32 channels apart, defeat the
prefetchers: the ASPP layer at rate 6, N=4, 28.0 ms against 20.7 for NCHW)."""
TASKS_PER_CORE = 4  # ... while the tasks stay at least this many per core


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


def regions_one_by_one(sch: s_tir.Schedule, cores: int) -> set[str]:
    """The result of a cube dX or forward of live-tap regions (more than one ``dx_cc`` / ``conv_cc``
    mad, each holding a contiguous range of rows and of columns) as tasks of an image's 16 channels, its pixel loops
    partitioned at the regions' edges, the regions' mads computed under the task (see the module
    docstring), except where its regions run across the images (:func:`.phases.across_images`: a
    map of at most ``TINY_MAP`` pixels, a small batch of small maps). Tried on a copy first. Returns the stages it placed (the result and its copies),
    none where it does not apply (stride phases, 3-D, a layout without separate row and column
    loops)."""
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
    if across_images(images, grid[0] * grid[1]):
        return set()  # each region's mad on its own, tiled across the images
    probe = sch.copy()
    try:
        if not _partition(probe, result, names, spans, grid, cores):
            return set()
    except (s_tir.ScheduleError, ValueError):
        return set()
    return {result} | _partition(sch, result, names, spans, grid, cores)


def _partition(sch: s_tir.Schedule, result: str, phases: list[str], spans, grid: tuple[int, int], cores: int) -> set[str]:
    """:func:`regions_one_by_one` on ``sch``: the names of the result's blocks under the task
    (its copies and their scopes; empty where it does not apply: the result's pixels not a row
    loop and a column loop of the regions' ``grid``, e.g. TBE's flat ``H*W`` result)."""
    block = sch.get_sblock(result)
    channels_last = channels_last_result(sch, block, phases[0])
    blocks = int(sch.get(sch.get_sblock(phases[0])).writes[0].source.shape[1])
    group = 1
    if channels_last:  # as many blocks as keep TASKS_PER_CORE tasks per core, up to NXC_TASK_BLOCKS
        images = loop_extent(sch, sch.get_loops(block)[0])
        group = most_blocks_a_task(blocks, images, TASKS_PER_CORE * cores, NXC_TASK_BLOCKS)
    found = channel_block_task(sch, block, phases[0], cores, images_outer=False, blocks=group)
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
        sch.compute_at(sch.get_sblock(name), task)
        restore_unit_loops(sch, sch.get_sblock(name))
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
    return {sch.get(b).name_hint for b in under} - set(phases)


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
