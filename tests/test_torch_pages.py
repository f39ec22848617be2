"""``tvm_convgrad.torch.pages``: the drop-in's large fresh outputs advised onto transparent huge
pages (the advice read back from the kernel's own record of the mapping, ``/proc/self/smaps``),
touched or small ones left as ``torch.empty`` makes them, and the gradients unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import torch

pytestmark = pytest.mark.skipif(torch is None, reason="PyTorch is not installed (pip install torch==2.13.0)")

if torch is not None:
    from tvm_convgrad.torch import pages
    from tvm_convgrad.torch.ops import input_grad

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
needs_thp = pytest.mark.skipif(not THP.exists() or "[never]" in THP.read_text(), reason="no transparent huge pages on this system")


def _advised(address: int) -> bool:
    """Whether the mapping holding ``address`` carries ``madvise(MADV_HUGEPAGE)`` (VmFlags ``hg``)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start <= address < end
        elif inside and head == "VmFlags:":
            return "hg" in line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def _middle(t: "torch.Tensor") -> int:
    return t.data_ptr() + t.untyped_storage().nbytes() // 2


@needs_thp
def test_a_fresh_tensor_is_advised_onto_huge_pages():
    t = pages.empty((4, 96, 640, 640), torch.float32, torch.channels_last)  # 629 MB, never written: no heap piece is that large
    assert t.is_contiguous(memory_format=torch.channels_last) and t.shape == (4, 96, 640, 640)
    assert _advised(_middle(t))


@needs_thp
def test_memory_already_touched_is_left_alone():
    t = torch.empty(10 << 20, dtype=torch.uint8)
    t.fill_(1)  # resident: no faults left to save
    assert not pages.advise_if_fresh(t) and not _advised(_middle(t))
    u = torch.empty(10 << 20, dtype=torch.uint8)
    assert pages.advise_if_fresh(u) == (not pages._resident(-(-u.data_ptr() // pages.HUGE_PAGE) * pages.HUGE_PAGE))


def test_only_large_tensors_are_looked_at_and_only_their_whole_extents_advised(monkeypatch):
    advised = []
    monkeypatch.setattr(pages, "_LIBC", (lambda start, length, advice: advised.append((start, length, advice)) or 0, lambda *a: 0))
    pages.empty((1, 1024, 1023), torch.float32)  # just under 4 MB
    assert advised == []
    t = pages.empty((9, 1024, 1024), torch.float32)  # 36 MB
    ((start, length, advice),) = advised
    assert advice == pages.MADV_HUGEPAGE and start % pages.HUGE_PAGE == 0 and length % pages.HUGE_PAGE == 0
    assert t.data_ptr() <= start < t.data_ptr() + pages.HUGE_PAGE and start + length + pages.HUGE_PAGE > t.data_ptr() + 36 * 2**20


def test_the_drop_ins_input_gradient_is_allocated_by_pages(monkeypatch):
    """dX of a 1x1 convolution into a 64 MB output: made by :func:`pages.empty` (on advised pages
    where it was fresh), and equal to PyTorch's."""
    looked_at = []
    advise = pages.advise_if_fresh
    monkeypatch.setattr(pages, "advise_if_fresh", lambda t: looked_at.append((t.data_ptr(), advise(t))) or looked_at[-1][1])
    torch.manual_seed(0)
    x = torch.randn(1, 16, 1024, 1024)
    w = torch.randn(8, 16, 1, 1)
    dy = torch.randn(1, 8, 1024, 1024)
    dx = input_grad(dy, w, list(x.shape), [1, 1], [0, 0, 0, 0], [1, 1], 1, False)
    ((address, advised),) = looked_at
    assert address == dx.data_ptr()
    if advised:
        assert _advised(_middle(dx))
    expected = torch.nn.grad.conv2d_input(x.shape, w.double(), dy.double())
    torch.testing.assert_close(dx.double(), expected, rtol=1e-5, atol=1e-4)


def test_without_transparent_huge_pages_empty_is_torch_empty(monkeypatch):
    monkeypatch.setattr(pages, "_LIBC", None)
    t = pages.empty((1, 96, 320, 320), torch.float32)
    assert t.shape == (1, 96, 320, 320) and not pages.advise_if_fresh(t)
