"""The LLVM IR of the AMX tile helpers: ``ma x nb`` 16x16 fp32 accumulator tiles over a whole reduction.

``tvm_convgrad_amx_<ma>x<nb>(c, a, b, n, ho, kblocks, k, a_n, a_ho, a_row, b_n, b_ho, b_row, c_row,
a_next, b_next, c_m, c_n, mm, a_mm, c_mm)`` (pointers, then ``i64`` counts and byte strides)
computes, for ``mm`` steps ``m`` along ``A`` and ``C``, each of its ``ma x nb`` blocks ``(i, j)``::

    C_mij[r, l] = sum over (n, ho, kb, kk < k) of pair_dot(A_mi[n, ho, r, kb*k + kk], B_j[n, ho, kb*k + kk, l])

with ``A_mi`` at ``a + m*a_mm + i*a_next``, ``B_j`` at ``b + j*b_next`` and ``C_mij`` at
``c + m*c_mm + i*c_m + j*c_n``: one call (one tile configuration, ``ldtilecfg``) for a task's
whole run of blocks. Each ``C`` is written whole (``tilezero`` first): its stage's init is dropped
(:func:`drop_overwritten_inits`).
For dW (:mod:`.amx`) ``A`` is dy's pairs (16 rows of ``k`` words: Cout lane ``r``'s pairs along
``wo``, :mod:`.dw_pairs` of the compute), ``B`` x's pairs (``k`` rows of 16 words, one per Cin lane);
for dX (:mod:`.amx_dx`) ``A`` is 16 flat pixels of dy at one tap, ``B`` that tap's weights, and the
two outer loops walk the taps. ``C`` is a tile (16 rows of 64 bytes). Several blocks share their
``A`` and ``B`` tiles (2 x 2: four loads for four tile multiplies, where one block takes two) and
keep four multiplies in flight instead of a chain of one accumulator's.

The loops and the addressing are one skeleton (:func:`_helper`) with two bodies: the tiles
(``tilezero``, ``tileloadd`` of ``A`` (16 x 4k bytes) and ``B`` (k x 64 bytes), ``tdpbf16ps``,
``tilestored``: LLVM's ``.internal`` intrinsics, whose tile configuration (``ldtilecfg``) LLVM
writes itself; at most 2 x 2 blocks: their four accumulators and two ``A`` and two ``B`` tiles are
the eight tile registers), and their emulation (the same arithmetic on 16-lane vectors in portable
IR: each pair's even product, then its odd one, as ``TDPBF16PS``; denormal inputs read as zero,
denormal results flushed), so that the tile plans are checked on any machine.
"""

from __future__ import annotations

from .bf16 import emulated_pairs_llvm

__all__ = ["AMX_BLOCKS", "amx_helper", "amx_llvm"]

AMX_BLOCKS = (1, 2)
"""The blocks a helper may hold along each of its two axes (2 x 2 fills the eight tile registers)."""

_TILE_DECLARATIONS = """declare x86_amx @llvm.x86.tilezero.internal(i16, i16)
declare x86_amx @llvm.x86.tileloadd64.internal(i16, i16, ptr, i64)
declare x86_amx @llvm.x86.tdpbf16ps.internal(i16, i16, i16, x86_amx, x86_amx, x86_amx)
declare void @llvm.x86.tilestored64.internal(i16, i16, ptr, i64, x86_amx)
"""


def amx_helper(ma: int = 1, nb: int = 1, accumulate: bool = False) -> str:
    """The symbol of the ``ma x nb`` helper (``accumulate``: it adds to each ``C`` instead of
    writing it: the tiles start from ``C``, ``tileloadd``, not from ``tilezero``)."""
    if ma not in AMX_BLOCKS or nb not in AMX_BLOCKS:
        raise ValueError(f"an AMX helper holds 1 or 2 blocks along each axis, not {ma} x {nb}")
    return f"tvm_convgrad_amx_{ma}x{nb}" + ("_acc" if accumulate else "")


def _helper(ma: int, nb: int, native: bool, accumulate: bool) -> str:
    """The helper's LLVM IR: loops ``n`` x ``ho`` x ``kblocks`` carrying the accumulators (tiles, or
    a token where the emulation keeps them in memory)."""
    blocks = [(i, j) for i in range(ma) for j in range(nb)]
    carried = [f"{i}_{j}" for i, j in blocks] if native else ["t"]
    kind = "x86_amx" if native else "i1"

    def phis(name: str, incoming) -> str:
        return "\n".join(f"  %{name}{x} = phi {kind} " + ", ".join(f"[%{src}{x}, %{label}]" for src, label in incoming) for x in carried)

    if native:
        start = "call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 64, ptr %pc{x}, i64 %c_row)" if accumulate else \
            "call x86_amx @llvm.x86.tilezero.internal(i16 16, i16 64)"  # fmt: skip
        zero = "\n".join(f"  %acc0{x} = " + start.format(x=x) for x in carried)
        loads = [f"  %ta{i} = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 %kbytes16, ptr %pa{i}, i64 %a_row)" for i in range(ma)]
        loads += [f"  %tb{j} = call x86_amx @llvm.x86.tileloadd64.internal(i16 %k16, i16 64, ptr %pb{j}, i64 %b_row)" for j in range(nb)]
        muls = [f"  %acc1{i}_{j} = call x86_amx @llvm.x86.tdpbf16ps.internal(i16 16, i16 64, i16 %kbytes16, x86_amx %acc{i}_{j}, x86_amx %ta{i}, x86_amx %tb{j})"
                for i, j in blocks]  # fmt: skip
        step = "\n".join(loads + muls)
        store = "\n".join(f"  call void @llvm.x86.tilestored64.internal(i16 16, i16 64, ptr %pc{i}_{j}, i64 %c_row, x86_amx %acc_end{i}_{j})" for i, j in blocks)
        declarations, setup = _TILE_DECLARATIONS, ""
    else:
        setup = "\n".join(f"  %tile{i}_{j} = alloca [16 x <16 x float>], align 64" for i, j in blocks)
        start = "call void @tvm_convgrad_amx_rows(ptr %tile{i}_{j}, i64 64, ptr %pc{i}_{j}, i64 %c_row)" if accumulate else \
            "store [16 x <16 x float>] zeroinitializer, ptr %tile{i}_{j}, align 64"  # fmt: skip
        zero = "\n".join("  " + start.format(i=i, j=j) for i, j in blocks) + "\n  %acc0t = add i1 0, 0"
        step = "\n".join(f"  call void @tvm_convgrad_amx_step(ptr %tile{i}_{j}, ptr %pa{i}, i64 %a_row, ptr %pb{j}, i64 %b_row, i64 %k)" for i, j in blocks)
        step += "\n  %acc1t = add i1 %acct, 0"
        store = "\n".join(f"  call void @tvm_convgrad_amx_rows(ptr %pc{i}_{j}, i64 %c_row, ptr %tile{i}_{j}, i64 64)" for i, j in blocks)
        declarations = ""
    a_tiles = "\n".join(f"  %aoff{i}_ = mul i64 {i}, %a_next\n  %aoff{i} = add i64 %aoff, %aoff{i}_\n  %pa{i} = getelementptr i8, ptr %a, i64 %aoff{i}" for i in range(ma))
    b_tiles = "\n".join(f"  %boff{j}_ = mul i64 {j}, %b_next\n  %boff{j} = add i64 %boff, %boff{j}_\n  %pb{j} = getelementptr i8, ptr %b, i64 %boff{j}" for j in range(nb))
    c_tiles = "\n".join(f"  %coff{i}_{j}_m = mul i64 {i}, %c_m\n  %coff{i}_{j}_n = mul i64 {j}, %c_n\n  %coff{i}_{j} = add i64 %coff{i}_{j}_m, %coff{i}_{j}_n\n"
                         f"  %pc{i}_{j} = getelementptr i8, ptr %c, i64 %coff{i}_{j}" for i, j in blocks)  # fmt: skip
    return f"""
{declarations}
define internal i32 @{amx_helper(ma, nb, accumulate)}(ptr %c0, ptr %a0, ptr %b, i64 %nn, i64 %hh, i64 %kbs, i64 %k, i64 %a_n, i64 %a_ho, i64 %a_row,
                             i64 %b_n, i64 %b_ho, i64 %b_row, i64 %c_row, i64 %a_next, i64 %b_next, i64 %c_m, i64 %c_n,
                             i64 %mm, i64 %a_mm, i64 %c_mm) alwaysinline {{
entry:
  %kbytes = shl i64 %k, 2
  %kbytes16 = trunc i64 %kbytes to i16
  %k16 = trunc i64 %k to i16
  %bstep = mul i64 %k, %b_row
{setup}
  br label %m_loop
m_loop:
  %m = phi i64 [0, %entry], [%m1, %m_next]
  %am = mul i64 %m, %a_mm
  %a = getelementptr i8, ptr %a0, i64 %am
  %cm = mul i64 %m, %c_mm
  %c = getelementptr i8, ptr %c0, i64 %cm
{c_tiles}
{zero}
  br label %n_loop
n_loop:
  %n = phi i64 [0, %m_loop], [%n1, %n_next]
{phis("accn", [("acc0", "m_loop"), ("acch_out", "n_next")])}
  %an = mul i64 %n, %a_n
  %bn = mul i64 %n, %b_n
  br label %h_loop
h_loop:
  %h = phi i64 [0, %n_loop], [%h1, %h_next]
{phis("acch", [("accn", "n_loop"), ("acck_out", "h_next")])}
  %ah0 = mul i64 %h, %a_ho
  %ah = add i64 %an, %ah0
  %bh0 = mul i64 %h, %b_ho
  %bh = add i64 %bn, %bh0
  br label %k_loop
k_loop:
  %kb = phi i64 [0, %h_loop], [%kb1, %k_loop]
{phis("acc", [("acch", "h_loop"), ("acc1", "k_loop")])}
  %ak = mul i64 %kb, %kbytes
  %aoff = add i64 %ah, %ak
  %bk = mul i64 %kb, %bstep
  %boff = add i64 %bh, %bk
{a_tiles}
{b_tiles}
{step}
  %kb1 = add i64 %kb, 1
  %kdone = icmp eq i64 %kb1, %kbs
  br i1 %kdone, label %h_next, label %k_loop
h_next:
{phis("acck_out", [("acc1", "k_loop")])}
  %h1 = add i64 %h, 1
  %hdone = icmp eq i64 %h1, %hh
  br i1 %hdone, label %n_next, label %h_loop
n_next:
{phis("acch_out", [("acck_out", "h_next")])}
  %n1 = add i64 %n, 1
  %ndone = icmp eq i64 %n1, %nn
  br i1 %ndone, label %done, label %n_loop
done:
{phis("acc_end", [("acch_out", "n_next")])}
{store}
  br label %m_next
m_next:
  %m1 = add i64 %m, 1
  %mdone = icmp eq i64 %m1, %mm
  br i1 %mdone, label %exit, label %m_loop
exit:
  ret i32 0
}}
"""


_EMULATED_TILE = emulated_pairs_llvm("tvm_convgrad_amx_pair", odd_first=False) + """define internal void @tvm_convgrad_amx_step(ptr %tile, ptr %pa, i64 %a_row, ptr %pb, i64 %b_row, i64 %k) alwaysinline {
entry:
  br label %i_loop
i_loop:
  %i = phi i64 [0, %entry], [%i1, %i_next]
  %row = getelementptr <16 x float>, ptr %tile, i64 %i
  %acc_i = load <16 x float>, ptr %row, align 64
  %a_at = mul i64 %i, %a_row
  %arow = getelementptr i8, ptr %pa, i64 %a_at
  br label %k_loop
k_loop:
  %kk = phi i64 [0, %i_loop], [%kk1, %k_loop]
  %acc = phi <16 x float> [%acc_i, %i_loop], [%acc2, %k_loop]
  %aw_at = getelementptr i32, ptr %arow, i64 %kk
  %aw = load i32, ptr %aw_at, align 4
  %a_one = insertelement <16 x i32> poison, i32 %aw, i64 0
  %a_all = shufflevector <16 x i32> %a_one, <16 x i32> poison, <16 x i32> zeroinitializer
  %b_at = mul i64 %kk, %b_row
  %brow = getelementptr i8, ptr %pb, i64 %b_at
  %bw = load <16 x i32>, ptr %brow, align 4
  %acc2 = call <16 x float> @tvm_convgrad_amx_pair(<16 x float> %acc, <16 x i32> %a_all, <16 x i32> %bw)
  %kk1 = add i64 %kk, 1
  %kdone = icmp eq i64 %kk1, %k
  br i1 %kdone, label %i_next, label %k_loop
i_next:
  %acc_out = phi <16 x float> [%acc2, %k_loop]
  store <16 x float> %acc_out, ptr %row, align 64
  %i1 = add i64 %i, 1
  %idone = icmp eq i64 %i1, 16
  br i1 %idone, label %done, label %i_loop
done:
  ret void
}
define internal void @tvm_convgrad_amx_rows(ptr %dst, i64 %dst_row, ptr %src, i64 %src_row) alwaysinline {
entry:
  br label %i_loop
i_loop:
  %i = phi i64 [0, %entry], [%i1, %i_loop]
  %s_at = mul i64 %i, %src_row
  %srow = getelementptr i8, ptr %src, i64 %s_at
  %v = load <16 x float>, ptr %srow, align 4
  %d_at = mul i64 %i, %dst_row
  %drow = getelementptr i8, ptr %dst, i64 %d_at
  store <16 x float> %v, ptr %drow, align 4
  %i1 = add i64 %i, 1
  %idone = icmp eq i64 %i1, 16
  br i1 %idone, label %done, label %i_loop
done:
  ret void
}"""


def amx_llvm(amx_bf16: bool, ma: int = 1, nb: int = 1, accumulate: bool = False) -> str:
    """The LLVM IR a kernel imports for its ``ma x nb`` helper (:func:`amx_helper`): the tiles where the
    target has AMX-BF16, else their emulation (any CPU)."""
    return _helper(ma, nb, True, accumulate) if amx_bf16 else _EMULATED_TILE + _helper(ma, nb, False, accumulate)
