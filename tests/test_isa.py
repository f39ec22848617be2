"""The CPU rule sizes its register tiles for the *target's* vector ISA, whatever the host.

Every assembly check here is cross-compiled (AVX-512, AVX2, SSE and AArch64 NEON targets) and
asserts what that ISA must produce in the hot loops: FMAs on its registers (broadcast operands
on AVX-512), and no spill store or reload inside the innermost reduction loop. Correctness of
each plan the host can run is checked by the sweep (``RUNNABLE_ISAS``); here only the plans'
structure and the target parsing.
"""

from __future__ import annotations

import re

import pytest
import tvm
from tvm.target import Target

from tvm_convgrad import ConvGradError, build, isa_target
from tvm_convgrad.tools.asm import hot_loops, innermost_loops
from tvm_convgrad.tools.peak import build_fma_peak
from tvm_convgrad.schedule.cpu import dx_tile
from tvm_convgrad.schedule.cpu.tiles import block_tile, dw_blocks, flat_block_tile, tap_rows, tap_tile
from tvm_convgrad.isa import PLANS, host_can_run, isa_plan
from tvm_convgrad.tools.verify import check_kernel

from conftest import NEON, RUNNABLE_ISAS
from test_schedule import _dw, _dx

TARGETS = {
    "avx512": {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "skylake-avx512", "num-cores": 2},
    "avx2": {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "haswell", "num-cores": 2},
    "sse": {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "x86-64", "num-cores": 2},
    "neon": NEON,
}
REGISTER_KIND = {"avx512": "zmm", "avx2": "ymm", "sse": "xmm", "neon": "v"}

# One shape per formulation and tile kind: (make, args) with args (n, cin, h, w, cout, k, s, p).
SHAPES = {
    "dw-cube-3x3": (_dw, (2, 64, 14, 14, 64, 3, 1, 1)),
    "dw-cube-1x1-direct": (_dw, (1, 64, 28, 28, 64, 1)),
    "dw-one-tile-rfactor": (_dw, (1, 16, 9, 9, 16, 1)),
    "dw-cout-lanes": (_dw, (1, 3, 64, 64, 64, 7, 2, 3)),
    "dx-cube-3x3": (_dx, (2, 64, 14, 14, 64, 3, 1, 1)),
    "dx-cube-7x7": (_dx, (1, 256, 7, 7, 256, 3, 1, 1)),
    "dx-cube-1x1-blocks": (_dx, (1, 64, 14, 14, 256, 1)),
    "dx-phases-s2": (_dx, (1, 32, 14, 14, 32, 3, 2, 1)),
    "dx-pixel-lanes": (_dx, (1, 3, 64, 64, 64, 7, 2, 3)),
    "dw-depthwise": (_dw, (2, 144, 28, 28, 144, 3, 1, 1, 144)),
    "dx-depthwise": (_dx, (2, 144, 28, 28, 144, 3, 1, 1, 144)),
    "dx-depthwise-s2": (_dx, (1, 96, 28, 28, 96, 3, 2, 1, 96)),
}
BROADCAST_TILES = [s for s in SHAPES if "lanes" not in s and "depthwise" not in s]  # the 16x16 cube
# the cube tiles over 2 or more channel blocks (AVX-512)
BLOCK_TILES = ["dx-cube-3x3", "dx-cube-7x7", "dx-cube-1x1-blocks", "dw-cube-3x3", "dw-cube-1x1-direct"]
PARTLY_BLOCK_TILES = ["dx-cube-3x3"]  # ... but not every loop: a padded 3x3's inner rows in 16-pixel tiles of one block


@pytest.mark.parametrize(
    "target, plan",
    [
        ({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "haswell"}, "avx2"),
        ({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver1"}, "avx2"),
        ({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "skylake-avx512"}, "avx512"),
        ({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver4"}, "avx512"),
        ({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "sapphirerapids"}, "avx512"),
        ({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver4", "mattr": ["-avx512f"]}, "avx2"),
        ({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mattr": ["+avx2", "+fma"]}, "avx2"),
        ({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "x86-64"}, "sse"),
        ({"kind": "llvm", "mtriple": "x86_64-linux-gnu"}, "sse"),
        ({"kind": "llvm", "mtriple": "aarch64-linux-gnu"}, "neon"),
        ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-n1"}, "neon"),
    ],
)
def test_plan_comes_from_the_target_not_the_host(target, plan):
    assert isa_plan(Target(target)).name == plan


def test_plans_fit_their_register_files():
    for plan in PLANS.values():
        assert plan.lanes * plan.registers_per_row == 16
        assert plan.accumulators + plan.registers_per_row + 1 <= plan.registers  # accumulators, a row, a broadcast
    assert PLANS["avx512"].rows() == 16 and PLANS["avx2"].rows(divides=16) == 4 and PLANS["sse"].rows(divides=16) == 2
    assert not isa_plan(Target(TARGETS["sse"])).converts_fp16 and isa_plan(Target(TARGETS["avx2"])).converts_fp16


@pytest.mark.parametrize("plan", list(PLANS))
def test_dx_tiles_fit_the_budget_and_cover_the_phase(plan):
    plan = PLANS[plan]
    for rows, cols in [(56, 56), (28, 28), (14, 14), (7, 7), (112, 112), (13, 11), (1, 1), (3, 40)]:
        th, tw, v = dx_tile(rows, cols, plan)
        assert th * tw * v <= plan.accumulators and plan.registers_per_row % v == 0
        assert rows % th == 0 and tw <= cols  # rows in whole bands; an edge tile takes cols % tw


def test_dx_tiles_per_isa():
    avx2, avx512 = PLANS["avx2"], PLANS["avx512"]
    assert dx_tile(56, 56, avx512)[0] * dx_tile(56, 56, avx512)[1] >= 14  # 14-16 zmm rows
    assert dx_tile(56, 56, avx2) == (1, 6, 2)  # 6 pixels x 2 ymm, a 2-pixel edge tile per row
    assert dx_tile(7, 7, avx2) == (1, 5, 2)  # not 7 x 2 = 14 accumulators: they would spill


def test_block_tiles_per_isa():
    """A 1x1 dX's tile takes several result channel blocks where one register holds a 16-lane row
    (AVX-512: 14 pixels x 2 blocks, 16 loads for 28 FMAs instead of 15 for 14), as many as the
    accumulators, the blocks' weight rows and a broadcast leave room for and the blocks divide;
    AVX2's and the other plans' tiles one block (their row parts already share a broadcast)."""
    avx2, avx512 = PLANS["avx2"], PLANS["avx512"]
    assert block_tile(14, 1, 16, avx512) == 2
    assert block_tile(16, 1, 16, avx512) == 1  # 32 accumulators: no room
    assert block_tile(7, 1, 6, avx512) == 3 and block_tile(7, 1, 4, avx512) == 2 and block_tile(7, 1, 1, avx512) == 1
    assert block_tile(6, 2, 16, avx2) == 1 and block_tile(3, 1, 16, avx2) == 1
    for plan in PLANS.values():
        for pixels, blocks in [(14, 16), (7, 32), (1, 64), (16, 3), (5, 12)]:
            v = plan.registers_per_row
            b = block_tile(pixels, v, blocks, plan)
            assert blocks % b == 0 and (b == 1 or pixels * v * b <= plan.accumulators and pixels * v * b + v * b + 1 <= plan.registers)


def test_flat_block_tiles_per_isa():
    """A 1x1's tile over an image's pixels as one axis (a short-rowed map) takes result blocks
    too: AVX-512 on 7x7 13 pixels x 2 blocks (the edge 10 x 2; 7 x 4 would need a 33rd register
    for the broadcast, measured spilling), 14 x 2 on 14x14; the 16-lane row of two registers
    (AVX2) one block of 5 or 6 pixels; every plan's tile within its registers, its blocks a divisor."""
    avx2, avx512 = PLANS["avx2"], PLANS["avx512"]
    assert flat_block_tile(49, 1, 4, avx512) == (13, 2) and flat_block_tile(196, 1, 8, avx512) == (14, 2)
    assert flat_block_tile(49, 1, 1, avx512)[1] == 1 and flat_block_tile(49, 2, 4, avx2) == (5, 1)
    for plan in PLANS.values():
        v = plan.registers_per_row
        for pixels, blocks in [(49, 4), (44, 8), (9, 3), (196, 16), (25, 1)]:
            tw, b = flat_block_tile(pixels, v, blocks, plan)
            assert blocks % b == 0 and tw * v * b <= plan.accumulators and (tw + 1) * v * b + 1 <= plan.registers


def test_dw_tiles_pair_cin_blocks_on_avx512():
    """AVX-512's dW tile: 8 Cout rows x 2 Cin blocks where a task's Cin blocks pair up (10 loads a
    step for 16 FMAs), else 16 rows x 1; the plans whose 16-lane row takes several registers keep
    one block."""
    avx512 = PLANS["avx512"]
    assert dw_blocks(4, avx512) == 2 and dw_blocks(8, avx512) == 2
    assert dw_blocks(3, avx512) == 1 and dw_blocks(1, avx512) == 1
    assert all(dw_blocks(4, PLANS[name]) == 1 for name in ("avx2", "sse", "neon", "generic"))


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
def test_a_dw_summed_per_core_pairs_cin_blocks_on_avx512(isa):
    """A 1x1 dW whose Cout blocks the cores cannot share (3 of them) sums each core's images; its
    tile (the rfactor block's) pairs the 2 Cin blocks on AVX-512 (8 Cout rows x 2 blocks x 16
    lanes), keeps one on AVX2 (4 rows x 2 ymm); exact where the host runs the target."""
    from tvm import tirx

    from tvm_convgrad.compile.target import resolve_target
    from tvm_convgrad.compile.workload import Workload
    from tvm_convgrad.schedule import rule_for

    target = resolve_target(TARGETS[isa])
    dw = _dw(4, 32, 14, 14, 48, 1, name=f"pair_rf_{isa}")
    sch = rule_for(target).apply(Workload.of(dw).prim_func(target), target)
    tile = [sch.get(lp) for lp in sch.get_loops(sch.get_sblock("dw_cc_rf_update"))[-3:]]
    unrolled = [int(lp.extent) for lp in tile if lp.kind == tirx.ForKind.UNROLLED]
    assert unrolled == ([8, 2] if isa == "avx512" else [4]), [(lp.loop_var.name, lp.extent, lp.kind) for lp in tile]
    if host_can_run(target):
        assert check_kernel(build(dw, target=target)).ok


def test_stem_dw_tiles_per_isa():
    """A 7x7 stem's dW, 64 Cout on the lanes: AVX2 takes a kernel row's 7 taps on one ymm (half a
    Cout row; 1 tap on 8 ymm reads 32 bytes of dy from L2 per FMA, which the FMAs outrun), AVX-512
    the 7 taps on 2 zmm; every ISA's tile divides the kernel row and the Cout blocks and fits."""
    assert tap_tile(7, 4, PLANS["avx2"]) == (7, 1, 1)
    assert tap_tile(7, 4, PLANS["avx512"]) == (7, 2, 1)
    assert tap_tile(3, 2, PLANS["avx2"]) == (3, 1, 2)  # a 3x3 stem of 32 channels: 3 taps x one 16-lane row
    for plan in PLANS.values():
        for kernel_w, blocks in [(7, 4), (3, 2), (5, 1), (1, 8), (11, 2)]:
            taps, vectors, registers = tap_tile(kernel_w, blocks, plan)
            assert kernel_w % taps == 0 and blocks % vectors == 0 and plan.registers_per_row % registers == 0
            assert vectors == 1 or registers == plan.registers_per_row  # whole rows, or a part of one
            assert taps * vectors * registers <= plan.accumulators
            rows = tap_rows(kernel_w, taps, vectors * registers, plan)  # (a square kernel: as many rows as columns)
            assert kernel_w % rows == 0 and rows * taps * vectors * registers <= plan.accumulators


def test_a_stems_dw_tile_takes_kernel_rows_where_its_taps_are_few():
    """A 3x3 stem of 32 channels on AVX-512 (3 taps x 2 zmm: six accumulators, fewer than the FMA
    latency hides) takes the kernel's 3 rows (18 accumulators); a 7x7 stem's 7 x 2 and AVX2's
    3 taps x one 16-lane row (two ymm) stay one row."""
    assert tap_rows(3, 3, 2, PLANS["avx512"]) == 3
    assert tap_rows(7, 7, 2, PLANS["avx512"]) == 1
    assert tap_rows(3, 3, 2, PLANS["avx2"]) == 1


def test_isa_target_names_an_isa():
    assert isa_plan(isa_target("avx2")).name == "avx2"
    assert isa_plan(isa_target("sse")).name == "sse"
    assert isa_plan(isa_target("avx512")).name == "avx512"
    with pytest.raises(ConvGradError, match="isa"):
        isa_target("avx3")


def test_the_host_runs_what_it_can():
    """Whatever the host: its own plan runs; x86 plans run on an x86-64 host only (every x86
    target names its triple, so on an AArch64 host they are cross-compiled, not run), NEON on an
    AArch64 one only."""
    import tvm

    host = tvm.target.codegen.llvm_get_system_triple()
    assert host_can_run(isa_target("native"))
    assert all(Target(TARGETS[isa]).attrs["mtriple"] == "x86_64-linux-gnu" for isa in ("avx512", "avx2", "sse"))
    assert str(isa_target("sse").attrs["mtriple"]).startswith("x86_64")
    assert host_can_run(isa_target("sse")) == host.startswith("x86_64")
    assert host_can_run(Target(TARGETS["neon"])) == (host.startswith("aarch64") and isa_plan(isa_target("native")).name == "neon")
    assert "native" in RUNNABLE_ISAS


def test_kernel_says_which_plan_it_used():
    kernel = build(_dw(1, 32, 8, 8, 32, 3, 1, 1, name="plan_dw"), target={"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "haswell", "num-cores": 2})
    assert kernel.isa.name == "avx2" and kernel.formulation == "cube"
    assert "[avx2, cube]" in repr(kernel)
    dx = build(_dx(1, 3, 32, 32, 16, 7, 2, 3, name="plan_dx"), target={"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "skylake-avx512", "num-cores": 2})
    assert dx.isa.name == "avx512" and dx.formulation == "pixel-lanes"


@pytest.mark.parametrize("isa", list(TARGETS))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_hot_loops_use_the_isa_registers_and_never_spill(isa, shape):
    make, args = SHAPES[shape]
    kernel = build(make(*args, name=f"asm_{shape.replace('-', '_')}"), target=TARGETS[isa])
    assert ("depthwise" in shape) == (kernel.formulation == "depthwise")
    assert kernel.isa.name == isa
    loops = hot_loops(kernel.source)
    assert loops, "no loop with vector multiply-adds"
    for loop in loops:
        assert loop.vector_registers == {REGISTER_KIND[isa]}, f"{loop.label}: {loop.vector_registers}"
        assert not loop.stack_accesses, f"{loop.label} spills: {loop.stack_accesses[:4]}"
    if isa == "avx512" and shape in BROADCAST_TILES:  # the 16x16 cube: every FMA takes a broadcast, {1to16} or a register 2 blocks share
        shares = []
        for loop in loops:
            shared = "\n".join(loop.lines).count("vbroadcastss")
            assert loop.broadcast_fmas + 2 * shared == loop.fmas, loop.lines
            shares.append(shared > 0)
        assert any(shares) == (shape in BLOCK_TILES), shares  # (dX 14 pixels x 2 blocks, dW 8 Cout rows x 2 Cin blocks)
        if shape in BLOCK_TILES and shape not in PARTLY_BLOCK_TILES:
            assert all(shares), shares
        assert max(loop.fmas for loop in loops) >= 7
    if isa == "avx2":
        assert "zmm" not in kernel.source and "{1to" not in kernel.source
        if shape in BROADCAST_TILES:
            assert all("vbroadcastss" in "\n".join(loop.lines) for loop in loops)
    if isa == "sse":
        assert not any(loop.fmas for loop in loops), "SSE has no FMA: mulps + addps"


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
def test_cube_tile_holds_the_plans_accumulators(isa):
    """3x3 dW: a tile of R Cout rows x 16 lanes: 16 zmm rows (AVX-512); on AVX2 6 rows x 2 ymm, the
    block's 16 rows as 6 + 6 + 4 (the last tile predicated and unswitched by LLVM into a loop of
    its own; no 4 x 4 tiles of 8 accumulators)."""
    kernel = build(_dw(2, 64, 14, 14, 64, 3, 1, 1, name=f"acc_dw_{isa}"), target=TARGETS[isa])
    loops = hot_loops(kernel.source)
    steps = {16} if isa == "avx512" else {12, 8}  # FMAs per reduction step of a tile
    assert {f for loop in loops for f in steps if loop.fmas % f == 0} == steps, [loop.fmas for loop in loops]
    for loop in loops:
        accumulators = set(re.findall(r"vfmadd231ps\s+\S+, %[yz]mm\d+, %([yz]mm\d+)", "\n".join(loop.lines)))
        assert len(accumulators) in steps, accumulators


@pytest.mark.parametrize("isa", [i for i in RUNNABLE_ISAS if i != "native"])
def test_each_runnable_plan_is_exact(isa):
    """A quick check per plan (the sweep runs them all on every case)."""
    for make, args in (SHAPES["dw-cube-3x3"], SHAPES["dx-cube-7x7"], SHAPES["dx-cube-1x1-blocks"], SHAPES["dx-pixel-lanes"]):
        kernel = build(make(*args, name=f"exact_{isa}"), target=isa_target(isa))
        assert kernel.isa.name == isa
        assert check_kernel(kernel).ok


@pytest.mark.parametrize("isa", RUNNABLE_ISAS)
def test_dw_reduction_in_chunks_is_exact(isa):
    """dW whose reduction runs in several chunks around the register tiles (2 images x 48 rows of
    72 in bands of 16 rows): the accumulators are zeroed once, before the first chunk, on every
    plan (on AVX2 the 6 + 6 + 4 row tiles once zeroed them per chunk, keeping the last band only)."""
    from tvm_convgrad.schedule.cpu.tiles import chunk

    assert chunk(2, 48, 72) == (1, 16)  # 6 chunks
    kernel = build(_dw(2, 25, 48, 72, 25, 3, 1, 1, name=f"chunks_dw_{isa}"), target=isa_target(isa))
    assert check_kernel(kernel).ok, str(check_kernel(kernel))


@pytest.mark.parametrize("isa", list(TARGETS))
def test_fma_peak_kernel_is_register_only(isa):
    executable, plan, cores = build_fma_peak(Target(TARGETS[isa]))
    asm = executable.mod.inspect_source("asm")
    (loop,) = [lp for lp in innermost_loops(asm) if lp.mads]
    assert loop.vector_registers == {REGISTER_KIND[isa]}
    assert not loop.stack_accesses
    memory = [line for line in loop.lines if re.search(r"\(%r\w+\)|\[x\d+", line) and re.search(r"fmadd|fmla|mulps|addps", line)]
    assert not memory, f"the peak loop reads memory: {memory[:3]}"
    assert plan.name == isa and cores == 2


def _model_features(mcpu: str) -> set[str]:
    return set(tvm.target.codegen.llvm_get_cpu_features(Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": mcpu})))


@pytest.mark.parametrize(
    "mcpu, host, mattr",
    [
        # a KVM guest on Sapphire Rapids that says model 167: LLVM's rocketlake, the host's BF16 and AMX
        ("rocketlake", _model_features("rocketlake") | {"avx512bf16", "amx-tile", "amx-bf16"}, ["+avx512bf16", "+amx-tile", "+amx-bf16"]),
        # a guest that hides AMX from a sapphirerapids model
        ("sapphirerapids", _model_features("sapphirerapids") - {"amx-tile", "amx-bf16"}, ["-amx-tile", "-amx-bf16"]),
        ("znver3", _model_features("znver3"), []),
    ],
)
def test_this_cpu_is_its_model_with_the_features_the_host_has(monkeypatch, mcpu, host, mattr):
    """``"llvm"`` builds for what the host's ``/proc/cpuinfo`` says it has, not only what LLVM's CPU
    model of it has: a bf16 gradient on a guest that LLVM calls rocketlake still runs on AMX."""
    from tvm_convgrad import isa, resolve_target

    if "x86" not in tvm.target.codegen.llvm_get_system_triple():
        pytest.skip("the host's target is made from x86 features; this host is not x86")
    monkeypatch.setattr(isa, "host_features", lambda: host | {"sse2"})
    monkeypatch.setattr(tvm.target.codegen, "llvm_get_system_cpu", lambda: mcpu)
    monkeypatch.delenv("TVM_CONVGRAD_MCPU", raising=False)
    assert isa.host_mattr(mcpu) == mattr
    target = resolve_target("llvm")
    assert str(target.attrs["mcpu"]) == mcpu and list(target.attrs.get("mattr", [])) == mattr
    plan = isa_plan(target)
    assert plan.amx_bf16 == ({"amx-tile", "amx-bf16"} <= host) and plan.bf16_dot == ("avx512bf16" in host)
    assert isa_target("native") == target or str(isa_target("native")) == str(target)


def test_this_cpu_target_has_the_hosts_bf16_and_amx():
    from tvm_convgrad import resolve_target
    from tvm_convgrad.isa import host_features

    plan, host = isa_plan(resolve_target("llvm")), host_features()
    if plan.name != "avx512":
        pytest.skip(f"this host's plan is {plan.name}")
    assert plan.bf16_dot == ("avx512bf16" in host) and plan.amx_bf16 == ({"amx-tile", "amx-bf16"} <= host)
    assert host_can_run(resolve_target("llvm"))
