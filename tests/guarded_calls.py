"""Child process of ``tests/test_memory_bounds.py``: run calls on guarded memory, check results.

    python tests/guarded_calls.py LABEL...

A label names one kernel: ``<variant>:<op>:<index>`` for the ``index``-th random valid call of
``op`` (``tests/random_cases.py``, drawn from its own seed) built as ``variant`` says —

* ``build``: :func:`tvm_convgrad.build` for this CPU, alternating with the other ISA plans it runs;
* ``pairs``: the call in bf16, in the bf16-pair form of a ``vdpbf16ps`` target (emulated where
  this CPU lacks the instruction); ``amx``: a dW or dX in an AMX target's tiles (emulated likewise);
* ``cuda``: the CUDA schedule emulated on this CPU (:func:`tvm_convgrad.emulate_cuda`);

or ``fixed:<name>`` for a call of :data:`FIXED`. Each kernel runs with every input and its output
flush against a ``PROT_NONE`` page, after the arrays and then before them
(:class:`guard_pages.GuardedMemory`), and its result is checked against the float64 reference.
Prints ``start <label>`` before each call and ``done`` at the end (:func:`guard_pages.run_in_children`).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from framework_cases import Case  # noqa: E402
from guard_pages import SIDES, GuardedMemory  # noqa: E402
from random_cases import OPERATORS, inputs_and_expected, valid_case, valid_result  # noqa: E402
from conftest import RUNNABLE_ISAS  # noqa: E402
from tvm_convgrad import build, emulate_bf16_dot, emulate_cuda, isa_target  # noqa: E402

SEED = 20261126
VARIANTS = ("build", "pairs", "amx", "cuda", "f32dw")
PAIR_OPERATORS = ("conv", "conv_v2", "deconv", "data", "data_v1", "fwd")  # the operators that take bf16
AMX_OPERATORS = ("conv", "conv_v2", "deconv", "data", "data_v1")  # the gradients AMX tiles run

_PADS1 = dict(pads_begin=(1, 1), pads_end=(1, 1), dilations=(1, 1), effective_pads=(1, 1))
FIXED = {
    # the calls issue 26 found reading past their tensors: 24 channels (not a multiple of 16), NCX and NXC
    "dw-ncx-24": Case("conv_v2", 2, 24, 24, 1, (13, 11), (13, 11), (3, 3), (1, 1), data_format="NCX", weights_format="OIX", **_PADS1),
    "dx-ncx-24": Case("data", 2, 24, 24, 1, (13, 11), (13, 11), (3, 3), (1, 1), data_format="NCX", weights_format="OIX", **_PADS1),
    "dw-nxc-24": Case("conv_v2", 2, 24, 24, 1, (13, 11), (13, 11), (3, 3), (1, 1), **_PADS1),
    "dx-nxc-40-bf16": Case("data", 2, 40, 24, 1, (9, 9), (5, 5), (3, 3), (2, 2), dtype="bfloat16", **_PADS1),
    # a 3-D depthwise dW whose depth padding read before the tensor too
    "dw-3d-depthwise": Case("conv_v2", 1, 24, 24, 24, (8, 28, 28), (8, 28, 28), (5, 1, 1), (1, 1, 1), (2, 0, 0), (2, 0, 0), (1, 1, 1),
                            data_format="NCX", weights_format="OIX", effective_pads=(2, 0, 0)),  # fmt: skip
    # a stem: 3 channels, 7x7 stride 2 (Cout on the lanes)
    "dw-stem": Case("conv_v2", 2, 3, 24, 1, (32, 32), (16, 16), (7, 7), (2, 2), (3, 3), (3, 3), (1, 1), data_format="NCX",
                    weights_format="OIX", effective_pads=(3, 3)),  # fmt: skip
    "dw-stem-f16": Case("conv_v2", 2, 3, 24, 1, (32, 32), (16, 16), (7, 7), (2, 2), (3, 3), (3, 3), (1, 1), dtype="float16",
                        effective_pads=(3, 3)),  # fmt: skip
    # a stem whose dy outgrows one band of rows (schedule.cpu.lanes.DY_BAND_BYTES: 45x45x64 floats)
    "dw-stem-banded": Case("conv_v2", 2, 3, 64, 1, (90, 90), (45, 45), (7, 7), (2, 2), (3, 3), (3, 3), (1, 1), data_format="NCX",
                           weights_format="OIX", effective_pads=(3, 3)),  # fmt: skip
    # a strided depthwise dX whose result rows (40) are ragged: a serial row under the parallel loops
    "dx-depthwise-s2-ragged": Case("data", 2, 32, 32, 32, (40, 40), (20, 20), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1), data_format="NCX",
                                   weights_format="OIX", effective_pads=(1, 1)),  # fmt: skip
    # a stride-1 depthwise dX plane by plane: each task packs its plane of dy, runs its tiles and writes its dx
    # plane (NCX 21x20: at least PLANE_MIN_PIXELS); smaller planes by rows of tiles (13x11); NXC ones by bands of rows
    "dx-depthwise-planes": Case("data", 4, 32, 32, 32, (21, 20), (21, 20), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), data_format="NCX",
                                weights_format="OIX", effective_pads=(1, 1)),  # fmt: skip
    "dx-depthwise-planes-nxc": Case("data", 4, 48, 48, 48, (21, 20), (21, 20), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), effective_pads=(1, 1)),
    "dx-depthwise-rows": Case("data", 4, 32, 32, 32, (13, 11), (13, 11), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), data_format="NCX",
                              weights_format="OIX", effective_pads=(1, 1)),  # fmt: skip
    "dx-depthwise-rows-nxc": Case("data", 4, 48, 48, 48, (9, 7), (9, 7), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), effective_pads=(1, 1)),
    # a strided depthwise dX plane by plane: the dy plane, every stride phase and the result under one task (40 channels:
    # a partial last block; NXC; 13x11 onto 7x6) and NCX (ragged rows)
    "dx-depthwise-s2-planes-nxc": Case("data", 3, 40, 40, 40, (13, 11), (7, 6), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1), effective_pads=(1, 1)),
    # ... NXC with every channel block of an image in one task (48 channels: 3 blocks)
    "dx-depthwise-s2-blocks-nxc": Case("data", 8, 48, 48, 48, (14, 13), (7, 7), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1), effective_pads=(1, 1)),
    # ... every block although an image's dy pack and result outgrow BAND_BYTES (57x55, 1 block would fit; odd sizes)
    "dx-depthwise-s2-image-nxc": Case("data", 8, 48, 48, 48, (57, 55), (29, 28), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1), effective_pads=(1, 1)),
    "dx-depthwise-s2-planes": Case("data", 4, 32, 32, 32, (15, 14), (8, 7), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1), data_format="NCX",
                                   weights_format="OIX", effective_pads=(1, 1)),  # fmt: skip
    # depthwise dW with x and dy packed image by image inside the tasks (24 channels: a partial block); a 3x1
    # kernel of 40 channels, strided (AVX2: a tile takes a whole 16-lane row, three tasks: rfactor parts of the rows)
    "dw-depthwise-per-image": Case("conv_v2", 3, 24, 24, 24, (13, 11), (13, 11), (3, 3), (1, 1), data_format="NCX", weights_format="OIX",
                                   **_PADS1),  # fmt: skip
    "dw-depthwise-per-image-rfactor": Case("conv_v2", 3, 40, 40, 40, (9, 10), (5, 10), (3, 1), (2, 1), (1, 0), (1, 0), (1, 1),
                                           data_format="NCX", weights_format="OIX", effective_pads=(1, 0)),  # fmt: skip
    # ... an even batch on NXC, strided: each core sums its own images, every channel block (40: a partial one) of each
    "dw-depthwise-images-per-core-nxc": Case("conv_v2", 4, 40, 40, 40, (13, 11), (7, 6), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1),
                                             effective_pads=(1, 1)),  # fmt: skip
    # NXC depthwise by bands of an image's rows, every channel block of a band in its task (dX, forward) or packed at once
    # (dW, on maps of PLANE_MIN_PIXELS or more; 40 channels: a partial block); 48 x 64x60 makes several bands an image
    "dx-depthwise-bands-nxc": Case("data", 4, 48, 48, 48, (64, 60), (64, 60), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), effective_pads=(1, 1)),
    "fwd-depthwise-bands-nxc": Case("fwd", 4, 40, 40, 40, (64, 60), (64, 60), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), effective_pads=(1, 1)),
    "dw-depthwise-bands-nxc": Case("conv_v2", 4, 40, 40, 40, (64, 60), (64, 60), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), effective_pads=(1, 1)),
    # bf16 dW on AMX tiles (emulated where the host lacks them) with its pairs along the images: 4x4 maps, 40 -> 24
    # channels (partial blocks), NCX; a strided NXC one (12 images: 6-pair tiles)
    "amx-dw-images-ncx": Case("conv_v2", 8, 40, 24, 1, (4, 4), (4, 4), (3, 3), (1, 1), dtype="bfloat16", data_format="NCX",
                              weights_format="OIX", **_PADS1),  # fmt: skip
    "amx-dw-images-nxc-s2": Case("conv_v2", 12, 32, 48, 1, (7, 7), (4, 4), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1),
                                 dtype="bfloat16", effective_pads=(1, 1)),  # fmt: skip
    # bf16 dX on AMX tiles with the images inside the channel blocks (2x2 maps; 72 channels: a partial last block)
    "amx-dx-images-inside-ncx": Case("data", 4, 72, 64, 1, (2, 2), (2, 2), (3, 3), (1, 1), dtype="bfloat16", data_format="NCX",
                                     weights_format="OIX", **_PADS1),  # fmt: skip
    # a 1x1 dW in OIX: its unit tap loops join the input-channel loop, written 16 lanes at a time
    "dw-1x1-oix": Case("conv_v2", 2, 40, 24, 1, (7, 7), (7, 7), (1, 1), (1, 1), (0, 0), (0, 0), (1, 1), data_format="NCX",
                       weights_format="OIX", effective_pads=(0, 0)),  # fmt: skip
    # the forward: 24 channels NCX with a bias (a partial block, padded and packed)
    "fwd-ncx-24-bias": Case("fwd", 2, 24, 24, 1, (13, 11), (13, 11), (3, 3), (1, 1), data_format="NCX", weights_format="OIX", bias=True,
                            **_PADS1),  # fmt: skip
    # ... an NCX depthwise plane by plane: its padded plane packed in parts (the image part a vector copy), rows of 11
    # computed as 16 (40 channels, bias); stride 2 (the phases packed); dilation 2 and asymmetric pads (17 channels)
    "fwd-depthwise-planes": Case("fwd", 2, 40, 40, 40, (13, 11), (13, 11), (3, 3), (1, 1), data_format="NCX", weights_format="OIX",
                                 bias=True, **_PADS1),  # fmt: skip
    "fwd-depthwise-planes-s2": Case("fwd", 2, 24, 24, 24, (15, 14), (8, 7), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1), data_format="NCX",
                                    weights_format="OIX", effective_pads=(1, 1)),  # fmt: skip
    "fwd-depthwise-planes-dilated": Case("fwd", 1, 17, 17, 17, (12, 12), (11, 10), (3, 3), (1, 1), (2, 0), (1, 2), (2, 2), data_format="NCX",
                                         weights_format="OIX", bias=True, effective_pads=(2, 0)),  # fmt: skip
    # ... an NXC one with its channels on the lanes (conv_dw): plane by plane, x's plane packed in its task (40 channels, bias);
    # by rows of tiles (smaller planes): stride 2 (the phases packed); dilation 2 and asymmetric pads (17 channels); bf16 read
    # widened; one plane
    "fwd-depthwise-nxc": Case("fwd", 4, 40, 40, 40, (21, 20), (21, 20), (3, 3), (1, 1), bias=True, **_PADS1),
    "fwd-depthwise-nxc-s2": Case("fwd", 2, 24, 24, 24, (15, 14), (8, 7), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1), effective_pads=(1, 1)),
    "fwd-depthwise-nxc-dilated": Case("fwd", 1, 17, 17, 17, (12, 12), (11, 10), (3, 3), (1, 1), (2, 0), (1, 2), (2, 2), bias=True,
                                      effective_pads=(2, 0)),  # fmt: skip
    "fwd-depthwise-nxc-bf16": Case("fwd", 2, 24, 24, 24, (9, 7), (9, 7), (3, 3), (1, 1), dtype="bfloat16", **_PADS1),
    "fwd-depthwise-nxc-one-plane": Case("fwd", 1, 16, 16, 16, (10, 9), (10, 9), (3, 3), (1, 1), **_PADS1),
    # a stride-1 NCX depthwise dX with dilation 2 and asymmetric pads (17 channels: a partial block)
    "dx-depthwise-planes-dilated": Case("data", 2, 17, 17, 17, (12, 12), (11, 10), (3, 3), (1, 1), (2, 0), (1, 2), (2, 2), data_format="NCX",
                                        weights_format="OIX", effective_pads=(2, 0)),  # fmt: skip
    # ... an fp32 NXC 1x1 without padding: no pack, the mad reads src (40 channels: a partial last block) in place
    "fwd-nxc-1x1-in-place": Case("fwd", 2, 40, 24, 1, (7, 9), (7, 9), (1, 1), (1, 1), (0, 0), (0, 0), (1, 1), effective_pads=(0, 0)),
    # ... the dX of one: dy's 24 channels read in place in runs of 8 (real_channel_run), its last pixel's ending the tensor
    "dx-nxc-1x1-in-place-runs": Case("data", 2, 40, 24, 1, (7, 9), (7, 9), (1, 1), (1, 1), (0, 0), (0, 0), (1, 1), effective_pads=(0, 0)),
    # ... a stem (3 channels: the reduction over the real channels only), 7x7 stride 2
    # ... with 1024 channels: each pixel's row 4 KB after the last, tiles of at most ALIASED_TILE_PIXELS pixels (an edge tile too)
    "fwd-nxc-1x1-aliased": Case("fwd", 2, 1024, 40, 1, (7, 9), (7, 9), (1, 1), (1, 1), (0, 0), (0, 0), (1, 1), effective_pads=(0, 0)),
    "fwd-stem": Case("fwd", 2, 3, 24, 1, (32, 32), (16, 16), (7, 7), (2, 2), (3, 3), (3, 3), (1, 1), data_format="NCX",
                     weights_format="OIX", effective_pads=(3, 3)),  # fmt: skip
    # ... grouped, two extended groups of 80 input lanes (10 groups of 10 channels: blocks past the channels)
    "fwd-grouped-extended": Case("fwd", 1, 100, 100, 10, (8, 8), (8, 8), (3, 3), (1, 1), **_PADS1),
    # ... strided NXC whose dst is written inside the mad's tasks (each task's sums while in cache), images outside the groups
    "fwd-nxc-strided-in-task": Case("fwd", 2, 32, 48, 1, (13, 11), (7, 6), (3, 3), (2, 2), **_PADS1),
    # ... post-ops read inside the tasks' write-back: a residual (dst's shape), a per-channel scale (40: a partial block), ReLU
    "fwd-nxc-post-ops": Case("fwd", 2, 24, 40, 1, (9, 11), (9, 11), (3, 3), (1, 1), bias=True,
                             post_ops=(("add", 0.0, 0.0, "full"), ("mul", 0.0, 0.0, "channel"), ("relu", 0.0, 0.0, None)), **_PADS1),
    # ... NCX: a per-image and a scalar operand broadcast, ReLU6
    "fwd-ncx-post-ops": Case("fwd", 2, 24, 20, 1, (9, 7), (9, 7), (3, 3), (1, 1), data_format="NCX", weights_format="OIX",
                             post_ops=(("sub", 0.0, 0.0, "image"), ("max", 0.0, 0.0, "scalar"), ("clip", 0.0, 6.0, None)), **_PADS1),
    # ... short rows in pixel tiles that run on across the rows (AVX2: 14 columns), a strided x of ~900 KB per image read in
    # four chunks of input channels over all the tiles, a partial block, bias and a residual
    "fwd-nxc-flat-pixels": Case("fwd", 8, 256, 40, 1, (27, 27), (14, 14), (3, 3), (2, 2), bias=True,
                                post_ops=(("add", 0.0, 0.0, "full"), ("relu", 0.0, 0.0, None)), **_PADS1),
    # ... and the data gradient of a 7x7 map (a partial block of dx channels)
    "dx-nxc-flat-pixels": Case("data", 8, 40, 24, 1, (7, 7), (7, 7), (3, 3), (1, 1), **_PADS1),
    # a 1x1 on short rows, each tile pixels x 2 result blocks (AVX-512): 7x7 (an edge tile of 10), 4x11 (tiles of 11, no edge)
    "dx-ncx-1x1-flat-blocks": Case("data", 8, 64, 64, 1, (7, 7), (7, 7), (1, 1), (1, 1), (0, 0), (0, 0), (1, 1), data_format="NCX",
                                   weights_format="OIX", effective_pads=(0, 0)),  # fmt: skip
    "fwd-nxc-1x1-flat-blocks-whole": Case("fwd", 8, 64, 64, 1, (4, 11), (4, 11), (1, 1), (1, 1), (0, 0), (0, 0), (1, 1), effective_pads=(0, 0)),
    # OXI weights (PyTorch's channels-last weights, read and written in place): partial channel blocks on both sides, groups
    "dx-nxc-oxi": Case("data", 2, 40, 24, 1, (9, 7), (5, 4), (3, 3), (2, 2), weights_format="OXI", **_PADS1),
    "dw-nxc-oxi": Case("conv_v2", 2, 40, 24, 2, (9, 7), (9, 7), (3, 3), (1, 1), weights_format="OXI", **_PADS1),
    "dw-ncx-oxi-bf16": Case("conv_v2", 2, 24, 40, 1, (9, 7), (5, 4), (3, 3), (2, 2), data_format="NCX", weights_format="OXI",
                            dtype="bfloat16", **_PADS1),
    # a dW of one chunk (7x7, one image): its result written per (Cout blocks, Cin block) inside the tasks (AVX-512)
    # an OIX dW written back along each (o, i)'s run of 9 taps; an NCX 1x1 forward / dX whose rows of 28 are the run
    "dw-oix-tap-run": Case("conv_v2", 8, 48, 32, 1, (2, 2), (2, 2), (3, 3), (1, 1), data_format="NCX", weights_format="OIX", **_PADS1),
    "fwd-ncx-1x1-rows-28": Case("fwd", 2, 32, 48, 1, (28, 28), (28, 28), (1, 1), (1, 1), (0, 0), (0, 0), (1, 1), data_format="NCX",
                                weights_format="OIX", effective_pads=(0, 0)),  # fmt: skip
    "dx-ncx-1x1-rows-28": Case("data", 2, 32, 48, 1, (28, 28), (28, 28), (1, 1), (1, 1), (0, 0), (0, 0), (1, 1), data_format="NCX",
                               weights_format="OIX", effective_pads=(0, 0)),  # fmt: skip
    "dw-one-chunk-write-back": Case("conv_v2", 1, 64, 32, 1, (7, 7), (7, 7), (3, 3), (1, 1), data_format="NCX", weights_format="OIX", **_PADS1),
    "dw-one-chunk-write-back-oxi-bf16": Case("conv_v2", 1, 48, 32, 1, (7, 7), (7, 7), (3, 3), (1, 1), weights_format="OXI", dtype="bfloat16",
                                             **_PADS1),
    "fwd-nxc-oxi": Case("fwd", 2, 40, 24, 1, (9, 7), (9, 7), (3, 3), (1, 1), weights_format="OXI", bias=True, **_PADS1),
    # live-tap regions (dX): an atrous NXC layer (rate 6 on 14x14, 40 channels: a partial block in the result's tasks), and an
    # NCX layer whose windows never read some rows and columns (parts of the result no region holds)
    "dx-nxc-atrous-regions": Case("data", 2, 40, 24, 1, (14, 14), (14, 14), (3, 3), (1, 1), (6, 6), (6, 6), (6, 6), effective_pads=(6, 6)),
    "dx-ncx-dead-rows": Case("data", 1, 24, 16, 1, (10, 10), (2, 2), (3, 3), (1, 1), (0, 0), (0, 0), (4, 4), data_format="NCX",
                             weights_format="OIX", effective_pads=(0, 0)),  # fmt: skip
    # tiny maps: a 1x1 map's centre tap alone (the forward's weight pack of one tap), a 2x2 map's one-pixel regions, each mad's
    # tiles across the images (40 channels: a partial block)
    # x packed per band of output rows inside the band's task (a batch, images outside the groups): stride phases, a partial block;
    # the bf16 pair form's words
    "fwd-nxc-row-bands": Case("fwd", 4, 40, 48, 1, (30, 30), (15, 15), (3, 3), (2, 2), bias=True, **_PADS1),
    "fwd-ncx-row-bands-bf16": Case("fwd", 4, 40, 48, 1, (28, 28), (28, 28), (3, 3), (1, 1), data_format="NCX", weights_format="OIX",
                                   dtype="bfloat16", **_PADS1),  # fmt: skip
    # dW by live-tap regions: an atrous NXC layer (rate 6 on 14x14, a mad per tap over its live outputs; 40 channels: a partial block)
    "dw-nxc-atrous-regions": Case("conv_v2", 2, 40, 24, 1, (14, 14), (14, 14), (3, 3), (1, 1), (6, 6), (6, 6), (6, 6), effective_pads=(6, 6)),
    # ... NCX, its OIX result read from the regions' sums tap by tap (40 input channels: a partial last run of 16)
    "dw-ncx-atrous-regions": Case("conv_v2", 2, 40, 24, 1, (14, 14), (14, 14), (3, 3), (1, 1), (6, 6), (6, 6), (6, 6), data_format="NCX",
                                  weights_format="OIX", effective_pads=(6, 6)),  # fmt: skip
    "fwd-nxc-1x1-map": Case("fwd", 12, 40, 24, 1, (1, 1), (1, 1), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), effective_pads=(1, 1)),
    "dx-ncx-2x2-map": Case("data", 8, 40, 24, 1, (2, 2), (2, 2), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), data_format="NCX",
                           weights_format="OIX", effective_pads=(1, 1)),  # fmt: skip
    # register tiles over two channel blocks (AVX-512): a 1x1 dX's 14 pixels x 2 result blocks (56 channels: a partial last block;
    # 80 reduction channels), NXC and NCX; a dW's 8 Cout rows x 2 Cin blocks (56 Cin: a partial last block)
    "dx-1x1-block-tiles": Case("data", 2, 56, 80, 1, (14, 14), (14, 14), (1, 1), (1, 1), (0, 0), (0, 0), (1, 1), effective_pads=(0, 0)),
    "dx-ncx-1x1-block-tiles": Case("data", 2, 56, 80, 1, (14, 14), (14, 14), (1, 1), (1, 1), (0, 0), (0, 0), (1, 1), data_format="NCX",
                                   weights_format="OIX", effective_pads=(0, 0)),  # fmt: skip
    "dw-paired-cin-blocks": Case("conv_v2", 2, 56, 40, 1, (9, 9), (9, 9), (3, 3), (1, 1), **_PADS1),
    # ... a 3x3 dX's tap phases too: stride 2 NCX (56 result channels: a partial block), stride 1 NXC; 512 x 512 at stride 2 (on a
    # 2 MB L2 a channel group of two blocks, weights_in_cache, and tiles of both)
    "dx-ncx-3x3-s2-block-tiles": Case("data", 2, 56, 80, 1, (13, 11), (7, 6), (3, 3), (2, 2), data_format="NCX", weights_format="OIX",
                                      **_PADS1),  # fmt: skip
    "dx-nxc-3x3-block-tiles": Case("data", 2, 56, 80, 1, (9, 7), (9, 7), (3, 3), (1, 1), **_PADS1),
    "dx-ncx-512-s2": Case("data", 1, 512, 512, 1, (14, 14), (7, 7), (3, 3), (2, 2), data_format="NCX", weights_format="OIX", **_PADS1),
    # a batch of 4x4 maps (8 images: 128 pixels): each live-tap region of the dX and the forward its own mad, tiled across the images
    "dx-4x4-regions-across-images": Case("data", 8, 40, 24, 1, (4, 4), (4, 4), (3, 3), (1, 1), data_format="NCX", weights_format="OIX",
                                         **_PADS1),  # fmt: skip
    "fwd-4x4-regions-across-images": Case("fwd", 8, 40, 24, 1, (4, 4), (4, 4), (3, 3), (1, 1), **_PADS1),
    # ... with 16 channel blocks (on 2 cores): tasks of two blocks over the batch, each packing its weights and running every
    # region (the dX's result a partial block)
    "dx-4x4-regions-batch-tasks": Case("data", 4, 250, 256, 1, (4, 4), (4, 4), (3, 3), (1, 1), data_format="NCX",
                                       weights_format="OIX", **_PADS1),
    "fwd-4x4-regions-batch-tasks": Case("fwd", 4, 256, 250, 1, (4, 4), (4, 4), (3, 3), (1, 1), **_PADS1),
    # dX reading dy where it lies (a 1x1 without padding): 40 dy channels (a partial block read in place), a stride-2 phase on
    # NCX, extended groups
    "dx-nxc-1x1-dy-in-place": Case("data", 2, 24, 40, 1, (7, 9), (7, 9), (1, 1), (1, 1), (0, 0), (0, 0), (1, 1), effective_pads=(0, 0)),
    "dx-ncx-1x1-s2-dy-in-place": Case("data", 2, 24, 40, 1, (13, 11), (7, 6), (1, 1), (2, 2), (0, 0), (0, 0), (1, 1), data_format="NCX",
                                      weights_format="OIX", effective_pads=(0, 0)),  # fmt: skip
    # an NCX 1x1 dX with the pixels on the lanes: dy read where it lies, result rows written back per task; one image's channels
    # in several tasks, its plane's last vectors a narrower tile (7x16 on AVX-512: 7 vectors in tiles of 4)
    "dx-ncx-1x1-pixel-lanes": Case("data", 2, 40, 24, 1, (8, 6), (8, 6), (1, 1), (1, 1), (0, 0), (0, 0), (1, 1), data_format="NCX",
                                   weights_format="OIX", effective_pads=(0, 0)),  # fmt: skip
    "dx-ncx-1x1-pixel-lanes-groups": Case("data", 1, 64, 24, 1, (7, 16), (7, 16), (1, 1), (1, 1), (0, 0), (0, 0), (1, 1), data_format="NCX",
                                          weights_format="OIX", effective_pads=(0, 0)),  # fmt: skip
    # the NCX 1x1 forward likewise: 40 output channels (a partial block, its lanes masked) with a bias; one image in several tasks
    "fwd-ncx-1x1-pixel-lanes": Case("fwd", 2, 24, 40, 1, (8, 6), (8, 6), (1, 1), (1, 1), (0, 0), (0, 0), (1, 1), data_format="NCX",
                                    weights_format="OIX", bias=True, effective_pads=(0, 0)),  # fmt: skip
    "fwd-ncx-1x1-pixel-lanes-groups": Case("fwd", 1, 24, 64, 1, (7, 16), (7, 16), (1, 1), (1, 1), (0, 0), (0, 0), (1, 1), data_format="NCX",
                                           weights_format="OIX", effective_pads=(0, 0)),  # fmt: skip
    # an NCX 1x1 dW with Cout on the lanes (x's planes read where they lie): a plane of 16 x 17, two Cout columns, a partial x
    # tile of rows; and a few-channel 1x1 (Cin <= 8) whose x is read where it lies likewise, NCX and NXC
    "dw-ncx-1x1-cout-lanes": Case("conv_v2", 3, 160, 128, 1, (16, 17), (16, 17), (1, 1), (1, 1), (0, 0), (0, 0), (1, 1), data_format="NCX",
                                  weights_format="OIX", effective_pads=(0, 0)),  # fmt: skip
    "dw-ncx-1x1-few-channels": Case("conv_v2", 2, 6, 16, 1, (9, 7), (9, 7), (1, 1), (1, 1), (0, 0), (0, 0), (1, 1), data_format="NCX",
                                    weights_format="OIX", effective_pads=(0, 0)),  # fmt: skip
    "dw-nxc-1x1-few-channels": Case("conv_v2", 2, 6, 16, 1, (9, 7), (9, 7), (1, 1), (1, 1), (0, 0), (0, 0), (1, 1), effective_pads=(0, 0)),
    # a 1x1 dW whose cores sum their own images (rfactor over the batch, dy and x packed per chunk in the task): 24 -> 144 with
    # x's partial Cin block, NXC; NCX in chunks of row bands (48 x 36 pixels), 32 -> 64
    "dw-nxc-1x1-images-per-core": Case("conv_v2", 4, 24, 144, 1, (12, 11), (12, 11), (1, 1), (1, 1), (0, 0), (0, 0), (1, 1),
                                       effective_pads=(0, 0)),  # fmt: skip
    "dw-ncx-1x1-images-per-core-bands": Case("conv_v2", 2, 32, 64, 1, (48, 36), (48, 36), (1, 1), (1, 1), (0, 0), (0, 0), (1, 1),
                                             data_format="NCX", weights_format="OIX", effective_pads=(0, 0)),  # fmt: skip
    # an fp32 NXC dW reading its 16-channel rows where they lie: a strided 1x1 (x's rows read at every second pixel up to the
    # edge), a 3x3 whose dy is read in place (x packed: padding)
    "dw-nxc-1x1-rows-in-place-s2": Case("conv_v2", 2, 32, 48, 1, (9, 7), (5, 4), (1, 1), (2, 2), (0, 0), (0, 0), (1, 1), effective_pads=(0, 0)),
    "dw-nxc-3x3-dy-in-place": Case("conv_v2", 2, 24, 32, 1, (7, 6), (7, 6), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), effective_pads=(1, 1)),
    # a dW chunk cut to what the cache holds (cube_dw.CHUNK_IN_CACHE: 8 images' dy and x, 2.6 MB, in chunks of 2): the sums kept
    # in memory between chunks, a stride 2 with x's padded pack
    "dw-nxc-chunk-cut": Case("conv_v2", 8, 64, 128, 1, (28, 28), (14, 14), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1), effective_pads=(1, 1)),
    "dx-nxc-1x1-dy-in-place-grouped": Case("data", 2, 48, 40, 2, (5, 6), (5, 6), (1, 1), (1, 1), (0, 0), (0, 0), (1, 1), effective_pads=(0, 0)),
    # streams read in place with prefetches (schedule.cpu.prefetch: tensors of 2 MB or more, the addresses clamped to the tensor's
    # end): a 1x1 dX's NXC dy and a 1x1 forward's NXC src, 9.6 MB each; an NCX 1x1 dX on 7x7 planes (PLANAR_IN_PLACE_BYTES:
    # packed for narrow tiles, read in place on AVX-512, WIDE_TILES_IN_PLACE)
    "dx-nxc-1x1-prefetch": Case("data", 32, 16, 96, 1, (28, 28), (28, 28), (1, 1), (1, 1), (0, 0), (0, 0), (1, 1), effective_pads=(0, 0)),
    "fwd-nxc-1x1-prefetch": Case("fwd", 32, 96, 24, 1, (28, 28), (28, 28), (1, 1), (1, 1), (0, 0), (0, 0), (1, 1), effective_pads=(0, 0)),
    # ... a 1x1 dW's strided runs (16 of dy's 96 channels a step and x's 32, both streams, cores owning Cout blocks; 144 -> 24:
    # x's 144-channel rows, paired Cin blocks, each core its own images)
    "dw-nxc-1x1-prefetch": Case("conv_v2", 32, 32, 96, 1, (28, 28), (28, 28), (1, 1), (1, 1), (0, 0), (0, 0), (1, 1), effective_pads=(0, 0)),
    "dw-nxc-1x1-prefetch-images": Case("conv_v2", 32, 144, 24, 1, (28, 28), (28, 28), (1, 1), (1, 1), (0, 0), (0, 0), (1, 1),
                                       effective_pads=(0, 0)),  # fmt: skip
    "dx-ncx-1x1-small-planes": Case("data", 2, 40, 64, 1, (7, 7), (7, 7), (1, 1), (1, 1), (0, 0), (0, 0), (1, 1), data_format="NCX",
                                    weights_format="OIX", effective_pads=(0, 0)),  # fmt: skip
    # Winograd F(2x2, 3x3): the input windows of the edge tiles (padding read as 0), a bias, OXI weights copied lanes-last tap by
    # tap (wino_wt); a row of 5 tiles (a narrower last register tile) on NCX (its rows copied to channel vectors: wino_x); the dX
    # with its own pads 2 and 0 (uneven), whole images per task; an XIO dX (its weights copied lanes-last too)
    "fwd-nxc-winograd": Case("fwd", 2, 32, 48, 1, (8, 10), (8, 10), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), weights_format="OXI", bias=True,
                             effective_pads=(1, 1), algorithm="winograd"),  # fmt: skip
    "fwd-ncx-winograd-ragged": Case("fwd", 1, 16, 32, 1, (6, 10), (6, 10), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), data_format="NCX",
                                    weights_format="OIX", effective_pads=(1, 1), algorithm="winograd"),  # fmt: skip
    "fwd-nxc-winograd-odd": Case("fwd", 2, 16, 32, 1, (7, 9), (7, 9), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), effective_pads=(1, 1),
                                 algorithm="winograd"),  # (an odd output: the tiles' last row and column left out, a pass of its own)
    # ... its dW: the parts of the tiles summed per core (rfactor), dy's odd edge tiles read as 0, OIX written from the taps
    "dw-ncx-winograd-odd": Case("conv_v2", 3, 32, 16, 1, (7, 9), (7, 9), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), data_format="NCX",
                                weights_format="OIX", effective_pads=(1, 1), algorithm="winograd"),  # fmt: skip
    "dw-nxc-winograd": Case("conv_v2", 1, 16, 48, 1, (10, 8), (10, 8), (3, 3), (1, 1), (2, 0), (0, 2), (1, 1), weights_format="OXI",
                            effective_pads=(2, 0), algorithm="winograd"),  # fmt: skip
    "dx-ncx-winograd-pads": Case("data", 3, 48, 32, 1, (8, 10), (8, 10), (3, 3), (1, 1), (0, 2), (2, 0), (1, 1), data_format="NCX",
                                 weights_format="OIX", effective_pads=(0, 2), algorithm="winograd"),  # fmt: skip
    "dx-nxc-winograd-xio": Case("data", 2, 32, 48, 1, (6, 8), (6, 8), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), weights_format="XIO",
                                effective_pads=(1, 1), algorithm="winograd"),  # fmt: skip
    # ... bf16 through F(2x2, 3x3) (read widened to fp32, the result rounded once): a forward with a bias, a dX, dWs over odd and
    # even outputs; and a dW of 256 x 256 weights a tap (AVX-512's "auto" takes it on enough tiles)
    "fwd-ncx-winograd-bf16": Case("fwd", 2, 32, 48, 1, (8, 10), (8, 10), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), data_format="NCX",
                                  weights_format="OIX", bias=True, dtype="bfloat16", effective_pads=(1, 1), algorithm="winograd"),  # fmt: skip
    "dx-nxc-winograd-bf16": Case("data", 2, 32, 48, 1, (7, 9), (7, 9), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), dtype="bfloat16",
                                 effective_pads=(1, 1), algorithm="winograd"),  # fmt: skip
    "dw-ncx-winograd-bf16-odd": Case("conv_v2", 3, 32, 16, 1, (7, 9), (7, 9), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), data_format="NCX",
                                     weights_format="OIX", dtype="bfloat16", effective_pads=(1, 1), algorithm="winograd"),  # fmt: skip
    "dw-nxc-winograd-bf16": Case("conv_v2", 2, 16, 48, 1, (8, 10), (8, 10), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), weights_format="OXI",
                                 dtype="bfloat16", effective_pads=(1, 1), algorithm="winograd"),  # fmt: skip
    "dw-ncx-winograd-256": Case("conv_v2", 2, 256, 256, 1, (14, 14), (14, 14), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), data_format="NCX",
                                weights_format="OIX", effective_pads=(1, 1), algorithm="winograd"),  # fmt: skip
    # (2 MB of sums or more: on 2 or 4 cores each sums every tile at its share of the 16 positions, no rfactor)
    "dw-nxc-winograd-positions": Case("conv_v2", 1, 256, 128, 1, (6, 10), (6, 10), (3, 3), (1, 1), (0, 1), (2, 1), (1, 1),
                                      weights_format="XIO", effective_pads=(0, 1), algorithm="winograd"),  # fmt: skip
    # 512 x 512 weights on few whole tiles (AVX-512's "auto" takes the forward and dX from 128 of them): 8x8 NXC, 4x4 NCX
    "fwd-nxc-winograd-512": Case("fwd", 2, 512, 512, 1, (8, 8), (8, 8), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), weights_format="OXI",
                                 effective_pads=(1, 1), algorithm="winograd"),  # fmt: skip
    "dx-ncx-winograd-512": Case("data", 4, 512, 512, 1, (4, 4), (4, 4), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), data_format="NCX",
                                weights_format="OIX", effective_pads=(1, 1), algorithm="winograd"),  # fmt: skip
    # the bf16 pair form by live-tap regions across the images (4x4 maps of 4 images: each region's tiles span them), NCX and NXC
    "pairs-fwd-ncx-4x4-regions": Case("fwd", 4, 32, 48, 1, (4, 4), (4, 4), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), data_format="NCX",
                                      weights_format="OIX", dtype="bfloat16", effective_pads=(1, 1)),  # fmt: skip
    "pairs-dx-nxc-4x4-regions": Case("data", 4, 48, 32, 1, (4, 4), (4, 4), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), dtype="bfloat16",
                                     effective_pads=(1, 1)),  # fmt: skip
    # "auto"'s bf16 F(2x2, 3x3) on pairs: an odd NCX forward (its 4 x 4 tiles' last row and column past the output) with a bias,
    # an NXC dX whose register tile spans 16 images' tiles (2 a row), a dX of XIO weights (copied lanes last) with pads 0..2
    "pairs-fwd-ncx-winograd-odd": Case("fwd", 4, 64, 64, 1, (7, 7), (7, 7), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), data_format="NCX",
                                       weights_format="OIX", bias=True, dtype="bfloat16", effective_pads=(1, 1), algorithm="auto"),  # fmt: skip
    "pairs-dx-nxc-winograd-4x4": Case("data", 16, 64, 64, 1, (4, 4), (4, 4), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), weights_format="OIX",
                                      dtype="bfloat16", effective_pads=(1, 1), algorithm="auto"),  # fmt: skip
    "pairs-dx-nxc-winograd-xio": Case("data", 4, 64, 80, 1, (8, 10), (8, 10), (3, 3), (1, 1), (2, 0), (0, 2), (1, 1), weights_format="XIO",
                                      dtype="bfloat16", effective_pads=(2, 0), algorithm="auto"),  # fmt: skip
    # ... and its dW on pairs of tiles: an NCX dy of 5 tiles a row (the last pair's second tile 0), one NXC image in parts of its
    # tile rows with pads 0..2 and OXI weights
    "pairs-dw-ncx-winograd-odd": Case("conv_v2", 4, 64, 80, 1, (7, 10), (7, 10), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), data_format="NCX",
                                      weights_format="OIX", dtype="bfloat16", effective_pads=(1, 1), algorithm="auto"),  # fmt: skip
    "pairs-dw-nxc-winograd-pads": Case("conv_v2", 1, 64, 64, 1, (16, 18), (16, 18), (3, 3), (1, 1), (2, 0), (0, 2), (1, 1), weights_format="OXI",
                                       dtype="bfloat16", effective_pads=(2, 0), algorithm="auto"),  # fmt: skip
}
"""Named calls every run includes (framework operator cases of ``tests/framework_cases.py``); a
``pairs-`` one in the bf16-pair form (emulated where this CPU lacks ``vdpbf16ps``)."""


def labels(per_variant: dict[str, int]) -> list[str]:
    """Every fixed call, then ``per_variant[v]`` random calls of each operator variant ``v`` takes."""
    ops = {"build": OPERATORS, "pairs": PAIR_OPERATORS, "amx": AMX_OPERATORS, "cuda": OPERATORS, "f32dw": ("conv_v2",)}
    out = [f"fixed:{name}" for name in FIXED]
    for variant, count in per_variant.items():
        out += [f"{variant}:{op}:{i}" for i in range(count) for op in ops[variant]]
    return out


def _kernel(label: str):
    """``(op, case, kernel)`` of a label."""
    variant, op, *index = label.split(":")
    if variant == "fixed":
        case = FIXED[op]
        result = valid_result(case.op, case)
        paired = op.startswith(("pairs-", "amx-"))
        return case.op, case, emulate_bf16_dot(result, amx=op.startswith("amx-")) if paired else build(result)
    i = int(index[0])
    case = valid_case(op, np.random.default_rng([SEED, VARIANTS.index(variant), OPERATORS.index(op), i]))
    if variant in ("pairs", "amx"):
        case = dataclasses.replace(case, dtype="bfloat16")
        return op, case, emulate_bf16_dot(valid_result(op, case), amx=variant == "amx")
    if variant == "cuda":
        return op, case, emulate_cuda(valid_result(op, case), {"kind": "cuda", "arch": "sm_80"})
    if variant == "f32dw":  # a float32 weight gradient of bf16 inputs (pairs, AMX tiles) or f16 ones (this CPU's build)
        case = dataclasses.replace(case, dtype=("bfloat16", "float16")[i % 2])
        result = valid_result(op, case, diff_weights_dtype="float32")
        return op, case, emulate_bf16_dot(result, amx=i % 4 == 2) if i % 2 == 0 else build(result)
    return op, case, build(valid_result(op, case), target=isa_target(RUNNABLE_ISAS[i % len(RUNNABLE_ISAS)]))


def main(names: list[str]) -> None:
    memory = GuardedMemory()
    for label in names:
        print("start", label, flush=True)
        op, case, kernel = _kernel(label)
        inputs, expected, bound = inputs_and_expected(op, case, kernel, seed=7)
        for side in SIDES:
            result = memory.run(kernel, inputs, side)
            assert result.shape == expected.shape, f"{label}: shape {result.shape} != {expected.shape}"
            ratio = float((np.abs(result.astype(np.float64) - expected) / bound).max())
            assert ratio <= 1.0, f"{label} ({side}): error {ratio:.3g} x the bound: {case!r}"
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
