"""``tvm_convgrad.torch.pages``: the drop-in's large outputs advised onto transparent huge pages
(the advice read back from the kernel's own record of the mapping, ``/proc/self/smaps``), small
ones left as ``torch.empty`` makes them, and the gradients unchanged."""

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
def test_a_tensor_glibc_always_maps_is_advised_onto_huge_pages():
    t = pages.empty((1, 96, 320, 320), torch.float32, torch.channels_last)  # 39.3 MB
    assert t.is_contiguous(memory_format=torch.channels_last) and t.shape == (1, 96, 320, 320)
    assert _advised(_middle(t))


def test_a_smaller_tensor_is_left_as_torch_makes_it(monkeypatch):
    advised = []
    monkeypatch.setattr(pages, "_MADVISE", lambda start, length, advice: advised.append((start, length, advice)) or 0)
    pages.empty((4, 1024, 1024), torch.float32)  # 16 MB: maybe a reused piece of the heap
    assert advised == []
    t = pages.empty((9, 1024, 1024), torch.float32)  # 36 MB: its whole 2 MB extents
    ((start, length, advice),) = advised
    assert advice == pages.MADV_HUGEPAGE and start % pages.HUGE_PAGE == 0 and length % pages.HUGE_PAGE == 0
    assert t.data_ptr() <= start < t.data_ptr() + pages.HUGE_PAGE and start + length + pages.HUGE_PAGE > t.data_ptr() + 36 * 2**20


@needs_thp
def test_the_drop_ins_input_gradient_is_written_on_advised_pages(monkeypatch):
    """dX of a 1x1 convolution: its output on advised pages once it is as large as the bound
    (lowered here to 4 MB), and equal to PyTorch's."""
    monkeypatch.setattr(pages, "ALWAYS_MAPPED_BYTES", 4 << 20)
    torch.manual_seed(0)
    x = torch.randn(1, 16, 256, 256)
    w = torch.randn(8, 16, 1, 1)
    dy = torch.randn(1, 8, 256, 256)
    dx = input_grad(dy, w, list(x.shape), [1, 1], [0, 0, 0, 0], [1, 1], 1, False)
    assert _advised(_middle(dx))
    expected = torch.nn.grad.conv2d_input(x.shape, w.double(), dy.double())
    torch.testing.assert_close(dx.double(), expected, rtol=1e-5, atol=1e-4)


def test_without_transparent_huge_pages_empty_is_torch_empty(monkeypatch):
    monkeypatch.setattr(pages, "_MADVISE", None)
    t = pages.empty((1, 96, 320, 320), torch.float32)
    assert t.shape == (1, 96, 320, 320) and not pages.advise_huge_pages(t)
