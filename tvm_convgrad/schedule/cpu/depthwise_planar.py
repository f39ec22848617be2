"""The planar depthwise forward on the CPU (``conv_dw_px``, :mod:`tvm_convgrad.dsl.compute.depthwise_planar`):
each task a step of whole planes, their padded x packed in the task, its output rows computed
tap by tap with the columns on the lanes, and written back while in cache.
"""

from __future__ import annotations

from ...dsl.compute.stages import PAD_CUTS_H, PAD_CUTS_W, X_PLANE
from ..common import loop_extent
from .loops import CpuMad, producers_named, restore_unit_loops
from .tiles import divisors

__all__ = ["MAX_ROW_VECTOR", "MAX_UNROLLED_TAPS", "PLANES_BYTES", "STACK_BYTES", "TASKS_PER_CORE", "PlanarDepthwiseForward"]

MAX_ROW_VECTOR = 64
"""Output columns in one vector of the row loop (LLVM splits it into the ISA's registers); a longer
row is cut into the largest divisor run of at most this many, or left whole where none is 16 or more."""
PLANES_BYTES = 32 * 1024  # the x_plane of a task step's planes: within any x86 core's L1d
TASKS_PER_CORE = 4  # ... while each core keeps at least this many tasks
STACK_BYTES = 1024  # TVM's kMaxStackAlloca: a buffer this small is on the stack (runtime/device_api.h)
MAX_UNROLLED_TAPS = 25  # a kernel of at most this many taps unrolled (a 3x3, a 5x5)


class PlanarDepthwiseForward(CpuMad):
    """The planar depthwise forward (``conv_dw_px[n, c, j, i]``, reduction ``(kh, kw)``)."""

    write_back_in_task = True

    def schedule(self, block):
        """Tasks: steps of an image's planes (:meth:`_planes_per_task`); in a task its planes'
        ``x_plane`` (their padding and stride phases made in the core's cache, :meth:`_pack_planes`),
        then per plane and output row ``j`` every tap ``(kh, kw)`` over the row's columns as vectors
        (each tap one broadcast weight and one load of consecutive columns of a phase), the row's
        sums in registers; the result (and the NCX layout stage folded into it) written in the task."""
        sch = self.sch
        n, c, j, i, kh, kw = sch.get_loops(block)
        c, planes = sch.split(c, [None, self._planes_per_task(block, loop_extent(sch, n), loop_extent(sch, c))])
        task = sch.fuse(n, c)
        cols = loop_extent(sch, i)
        run = cols if cols <= MAX_ROW_VECTOR else max((d for d in divisors(cols, MAX_ROW_VECTOR) if d >= 16), default=cols)
        i_o, i_i = sch.split(i, [None, run])
        sch.reorder(planes, j, i_o, kh, kw, i_i)
        if loop_extent(sch, kh) * loop_extent(sch, kw) <= MAX_UNROLLED_TAPS:
            sch.unroll(kh)
            sch.unroll(kw)
        sch.vectorize(i_i)
        sch.parallel(task)
        for pack in producers_named(sch, block, (X_PLANE,)):
            self._pack_planes(pack, task)
        sch.decompose_reduction(block, kh)
        self.write_back_in(block, task)

    def _vectorize_contiguous_run(self, consumer, inner):
        """The result written a row at a time, its columns one vector: the sums' rows are whole
        registers (``Wv`` columns, :func:`~tvm_convgrad.dsl.compute.depthwise_planar.row_vector`), so
        a run over several of the result's rows would gather from them (a 7x7 plane as one vector
        of 49 read rows of 8: 2x slower)."""
        self.sch.vectorize(inner[-1])

    def _planes_per_task(self, block, images: int, channels: int) -> int:
        """Planes (of one image's ``channels``) a task step takes: one where a plane's ``x_plane`` and
        sums fit TVM's stack allocations (:data:`STACK_BYTES`, no allocation call), else the most
        whose packs fit :data:`PLANES_BYTES` with :data:`TASKS_PER_CORE` tasks a core left: a task's
        buffers are allocated (``malloc``) once per step, not per plane. 32 images, NCHW: 192
        channels on 14x14 1.38 -> 0.77 ms, 144 on 28x28 2.37 -> 2.10; 384 on 7x7 in steps of 64
        planes 0.26 -> 0.37 (one plane's buffers on the stack)."""
        sch = self.sch
        (x,) = [r.source for r in sch.get(block).reads if r.source.name == X_PLANE]
        (sums,) = [w.source for w in sch.get(block).writes]
        x_bytes = 4 * int(x.shape[2]) * int(x.shape[3]) * int(x.shape[4]) * int(x.shape[5])
        if x_bytes <= STACK_BYTES and 4 * int(sums.shape[2]) * int(sums.shape[3]) <= STACK_BYTES:
            return 1
        fits = [d for d in divisors(channels, channels) if d * x_bytes <= PLANES_BYTES and images * channels // d >= TASKS_PER_CORE * self.cores]
        return max(fits, default=1)

    def _pack_planes(self, pack, task):
        """``x_plane`` computed under ``task``, its unstrided axes cut where the padding starts and
        ends (:func:`~tvm_convgrad.dsl.compute.depthwise_planar.padding_cuts`): each part's padding
        condition is the same for all of it, so inside the image a row part is a vector copy (one
        loop read every column under a per-lane condition; a clamped index instead made a gather)."""
        sch = self.sch
        sch.compute_at(pack, task)
        self.placed.add(sch.get(pack).name_hint)
        if len(sch.get_loops(pack)) == 1:  # (one element a task: no loop of its own)
            return
        restore_unit_loops(sch, pack)  # (a one-row or one-column plane keeps its loops)
        attrs = sch.get(pack).annotations
        cuts_y, cuts_x = list(attrs[PAD_CUTS_H]), list(attrs[PAD_CUTS_W])
        yq = sch.get_loops(pack)[-2]
        row_parts = sch.loop_partition(yq, [*cuts_y, None]) if cuts_y else [yq]
        for part in row_parts:
            for copy in sch.get_child_blocks(part) if cuts_y else [pack]:
                columns = sch.get_loops(copy)[-1]
                for column_part in sch.loop_partition(columns, [*cuts_x, None]) if cuts_x else [columns]:
                    sch.vectorize(column_part)
