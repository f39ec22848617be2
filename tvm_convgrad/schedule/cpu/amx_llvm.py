"""The LLVM IR of the AMX dW tile: one 16x16 fp32 accumulator tile over a whole reduction.

``tvm_convgrad_amx_dw(c, a, b, n, ho, kblocks, k, a_n, a_ho, a_row, b_n, b_ho, b_row, c_row)``
(pointers, then ``i64`` counts and byte strides) computes, for one 16 Cout x 16 Cin block::

    C[i, j] = sum over (n, ho, kb, kk < k) of pair_dot(A[n, ho, i, kb*k + kk], B[n, ho, kb*k + kk, j])

``A`` is dy's pairs (16 rows of ``k`` words: Cout lane ``i``'s pairs along ``wo``, :mod:`.dw_pairs`
of the compute), ``B`` x's pairs (``k`` rows of 16 words, one per Cin lane), ``C`` the tile
(16 rows of 64 bytes). dX on tiles (:mod:`.amx_dx`) calls the same helper for a block of 16 flat
pixels x 16 Cin: its two outer loops walk the taps (``A`` 16 pixels of dy, ``B`` the tap's weights). The loops and the addressing are one skeleton (:func:`_skeleton`) with two
bodies: :data:`AMX_LLVM` (``tilezero``, ``tileloadd`` of ``A`` (16 x 4k bytes) and ``B`` (k x 64
bytes), ``tdpbf16ps``, one ``tilestored``: LLVM's ``.internal`` intrinsics, whose tile
configuration (``ldtilecfg``) LLVM writes itself), and :data:`AMX_EMULATED_LLVM` (the same
arithmetic on 16-lane vectors in portable IR: each pair's even product, then its odd one, as
``TDPBF16PS``; denormal inputs read as zero, denormal results flushed), so that the tile plan is
checked on any machine.
"""

from __future__ import annotations

from .bf16 import emulated_pairs_llvm

__all__ = ["AMX_DW", "AMX_EMULATED_LLVM", "AMX_LLVM", "amx_llvm"]

AMX_DW = "tvm_convgrad_amx_dw"
"""The helper's symbol."""


def _skeleton(declarations: str, accumulator: str, zero: str, step: str, store: str) -> str:
    """The helper: ``n`` x ``ho`` x ``kblocks`` steps carrying the accumulator (of type
    ``accumulator``) from ``zero``; each ``step`` reads ``%pa`` / ``%pb`` (the step's ``A`` and
    ``B``) and makes ``%acc1`` from ``%acc``; ``store`` writes ``%acc_end`` to ``%c``."""
    return f"""
{declarations}
define internal i32 @{AMX_DW}(ptr %c, ptr %a, ptr %b, i64 %nn, i64 %hh, i64 %kbs, i64 %k, i64 %a_n, i64 %a_ho, i64 %a_row,
                             i64 %b_n, i64 %b_ho, i64 %b_row, i64 %c_row) alwaysinline {{
entry:
  %kbytes = shl i64 %k, 2
  %kbytes16 = trunc i64 %kbytes to i16
  %k16 = trunc i64 %k to i16
  %bstep = mul i64 %k, %b_row
{zero}
  br label %n_loop
n_loop:
  %n = phi i64 [0, %entry], [%n1, %n_next]
  %acc_n = phi {accumulator} [%acc0, %entry], [%acc_h_out, %n_next]
  %an = mul i64 %n, %a_n
  %bn = mul i64 %n, %b_n
  br label %h_loop
h_loop:
  %h = phi i64 [0, %n_loop], [%h1, %h_next]
  %acc_h = phi {accumulator} [%acc_n, %n_loop], [%acc_k_out, %h_next]
  %ah0 = mul i64 %h, %a_ho
  %ah = add i64 %an, %ah0
  %bh0 = mul i64 %h, %b_ho
  %bh = add i64 %bn, %bh0
  br label %k_loop
k_loop:
  %kb = phi i64 [0, %h_loop], [%kb1, %k_loop]
  %acc = phi {accumulator} [%acc_h, %h_loop], [%acc1, %k_loop]
  %ak = mul i64 %kb, %kbytes
  %aoff = add i64 %ah, %ak
  %bk = mul i64 %kb, %bstep
  %boff = add i64 %bh, %bk
  %pa = getelementptr i8, ptr %a, i64 %aoff
  %pb = getelementptr i8, ptr %b, i64 %boff
{step}
  %kb1 = add i64 %kb, 1
  %kdone = icmp eq i64 %kb1, %kbs
  br i1 %kdone, label %h_next, label %k_loop
h_next:
  %acc_k_out = phi {accumulator} [%acc1, %k_loop]
  %h1 = add i64 %h, 1
  %hdone = icmp eq i64 %h1, %hh
  br i1 %hdone, label %n_next, label %h_loop
n_next:
  %acc_h_out = phi {accumulator} [%acc_k_out, %h_next]
  %n1 = add i64 %n, 1
  %ndone = icmp eq i64 %n1, %nn
  br i1 %ndone, label %done, label %n_loop
done:
  %acc_end = phi {accumulator} [%acc_h_out, %n_next]
{store}
  ret i32 0
}}
"""


AMX_LLVM = _skeleton(
    """declare x86_amx @llvm.x86.tilezero.internal(i16, i16)
declare x86_amx @llvm.x86.tileloadd64.internal(i16, i16, ptr, i64)
declare x86_amx @llvm.x86.tdpbf16ps.internal(i16, i16, i16, x86_amx, x86_amx, x86_amx)
declare void @llvm.x86.tilestored64.internal(i16, i16, ptr, i64, x86_amx)""",
    "x86_amx",
    "  %acc0 = call x86_amx @llvm.x86.tilezero.internal(i16 16, i16 64)",
    """  %ta = call x86_amx @llvm.x86.tileloadd64.internal(i16 16, i16 %kbytes16, ptr %pa, i64 %a_row)
  %tb = call x86_amx @llvm.x86.tileloadd64.internal(i16 %k16, i16 64, ptr %pb, i64 %b_row)
  %acc1 = call x86_amx @llvm.x86.tdpbf16ps.internal(i16 16, i16 64, i16 %kbytes16, x86_amx %acc, x86_amx %ta, x86_amx %tb)""",
    "  call void @llvm.x86.tilestored64.internal(i16 16, i16 64, ptr %c, i64 %c_row, x86_amx %acc_end)",
)
"""The tile plan on AMX-BF16 (``tdpbf16ps``)."""


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
define internal void @tvm_convgrad_amx_store(ptr %c, i64 %c_row, ptr %tile) alwaysinline {
entry:
  br label %i_loop
i_loop:
  %i = phi i64 [0, %entry], [%i1, %i_loop]
  %row = getelementptr <16 x float>, ptr %tile, i64 %i
  %v = load <16 x float>, ptr %row, align 64
  %c_at = mul i64 %i, %c_row
  %crow = getelementptr i8, ptr %c, i64 %c_at
  store <16 x float> %v, ptr %crow, align 4
  %i1 = add i64 %i, 1
  %idone = icmp eq i64 %i1, 16
  br i1 %idone, label %done, label %i_loop
done:
  ret void
}"""

AMX_EMULATED_LLVM = _skeleton(
    _EMULATED_TILE,
    "i1",  # the tile lives in memory (%tile); the carried value is a token
    """  %tile = alloca [16 x <16 x float>], align 64
  store [16 x <16 x float>] zeroinitializer, ptr %tile, align 64
  %acc0 = add i1 0, 0""",
    """  call void @tvm_convgrad_amx_step(ptr %tile, ptr %pa, i64 %a_row, ptr %pb, i64 %b_row, i64 %k)
  %acc1 = add i1 %acc, 0""",
    "  call void @tvm_convgrad_amx_store(ptr %c, i64 %c_row, ptr %tile)",
)
"""``tdpbf16ps``'s arithmetic on the same loops in portable LLVM IR (any CPU)."""


def amx_llvm(amx_bf16: bool) -> str:
    """The helper a kernel imports: the tiles where the target has AMX-BF16, else their emulation."""
    return AMX_LLVM if amx_bf16 else AMX_EMULATED_LLVM
