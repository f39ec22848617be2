"""The drop-in's large results -- the forward's output and dX -- over mappings kept between calls
(``tvm_convgrad.torch.outputs``): laid out as ``torch.empty`` lays them, never sharing memory with a
live tensor, re-used once PyTorch frees them (and not before: views keep a mapping lent), exact,
and released when asked. (Why: a step's fresh tensors fault on every page; timing is not a test.)"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading

import pytest

from conftest import torch

pytestmark = pytest.mark.skipif(torch is None, reason="PyTorch is not installed (pip install torch==2.13.0)")


@pytest.fixture(params=["python", "native"])
def kept(request):
    """The ``"kept"`` policy with nothing idle at the start, and nothing left idle after; the
    mappings this module's (``python``: the Python node throughout) or the C++ extension's
    (``native``, :func:`outputs.use_native`: its node's dX too)."""
    from tvm_convgrad.torch import native, outputs

    holder, mode = outputs._NATIVE[0] if outputs._NATIVE else None, native.get_native()
    if request.param == "native" and native.module() is None:
        pytest.skip(f"the C++ extension cannot be built here: {native.build_error()}")
    outputs.use_native(native.module() if request.param == "native" else None)
    native.set_native("on" if request.param == "native" else "off")
    policy = outputs.get_outputs()
    outputs.set_outputs("kept")
    outputs.release_outputs()
    yield outputs
    gc.collect()
    outputs.set_outputs(policy)
    outputs.release_outputs()
    # (the package's state after the test: the extension, once loaded, holds the mappings -- a native
    # test may be the one that loaded it, whose holder was None)
    outputs.use_native(native.module() if request.param == "native" else holder)
    native.set_native(mode)


def _lent(t: "torch.Tensor") -> bool:
    """Whether ``t``'s storage is one of the kept mappings, page-aligned and not resizable."""
    from tvm_convgrad.torch import outputs

    return outputs.is_kept(t) and t.data_ptr() % outputs.PAGE == 0 and not t.untyped_storage().resizable()


@pytest.mark.parametrize("shape", [(2, 64, 64, 64), (1, 1, 1024, 520), (600, 1000, 1, 1), (4, 300, 30, 30), (700, 800)])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_a_kept_result_lies_as_torch_empty_lays_it(kept, shape, channels_last, dtype):
    """Shape, strides, type, contiguity and memory format equal ``torch.empty``'s (channels-last
    for 4-D tensors where asked), a tensor of its own (no view), writable to its last element."""
    dtype = getattr(torch, dtype)
    t = kept.empty(shape, dtype, channels_last)
    layout = torch.channels_last if channels_last and len(shape) == 4 else torch.contiguous_format
    reference = torch.empty(shape, dtype=dtype, memory_format=layout)
    assert (t.shape, t.stride(), t.dtype) == (reference.shape, reference.stride(), reference.dtype)
    assert t._base is None and t.is_contiguous(memory_format=layout) and _lent(t)
    t.fill_(1.5)
    assert float(t.float().sum()) == 1.5 * t.numel()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_a_kept_mapping_is_private_to_the_process(kept):
    """Copy-on-write across ``fork`` (a DataLoader's workers), not shared: ``/proc/self/maps``
    lists the result's mapping ``rw-p``."""
    t = kept.empty((4, 300, 30, 30), torch.float32, False)
    start = t.data_ptr()
    with open("/proc/self/maps") as maps:
        (permissions,) = [line.split()[1] for line in maps if int(line.split("-")[0], 16) == start]
    assert permissions == "rw-p", permissions


def test_small_results_and_the_malloc_policy_are_torch_empty(kept):
    small = kept.empty((2, 8, 16, 16), torch.float32, True)
    assert not kept.is_kept(small) and small.is_contiguous(memory_format=torch.channels_last)
    kept.set_outputs("malloc")
    large = kept.empty((4, 300, 30, 30), torch.float32, False)
    assert not kept.is_kept(large) and kept.kept_outputs()["held"] == 0


def test_a_mapping_is_re_used_once_freed_and_never_while_a_tensor_or_view_holds_it(kept):
    """Two live results of one size: two mappings. Freed, the next result takes the latest one
    back (no new mapping); a view of a result keeps its mapping lent after the result is gone."""
    maps = kept.kept_outputs()["maps"]
    first = kept.empty((4, 300, 30, 30), torch.float32, False)
    second = kept.empty((4, 300, 30, 30), torch.float32, False)
    assert first.data_ptr() != second.data_ptr() and kept.kept_outputs()["maps"] == maps + 2
    address = second.data_ptr()
    del second
    assert kept.kept_outputs()["held"] == 1
    third = kept.empty((4, 300, 30, 30), torch.float32, False)
    assert third.data_ptr() == address and kept.kept_outputs() == {"maps": maps + 2, "held": 0, "bytes": 0}
    view = first[1:3].transpose(1, 2)
    address = first.data_ptr()
    del first
    assert kept.kept_outputs()["held"] == 0
    fourth = kept.empty((4, 300, 30, 30), torch.float32, False)
    assert fourth.data_ptr() not in (address, third.data_ptr()) and kept.kept_outputs()["maps"] == maps + 3
    del view
    assert kept.kept_outputs()["held"] == 1
    assert kept.release_outputs() == -(-4 * 300 * 30 * 30 * 4 // kept.PAGE) * kept.PAGE
    assert kept.kept_outputs()["held"] == 0


def test_idle_mappings_stop_at_the_budget(kept, monkeypatch):
    """At most :data:`KEPT_BYTES` lie idle: a mapping returned beyond it takes the place of those
    returned longest ago (a second network's results are kept, not the first one's), and one larger
    than the budget is unmapped."""
    monkeypatch.setattr(kept, "KEPT_BYTES", 5 << 20)
    kept.set_outputs("kept")  # (the budget the extension keeps: read when the policy is set)
    results = [kept.empty((1 << 20,), torch.float32, False) for _ in range(3)]  # 4 MiB each
    del results
    assert kept.kept_outputs()["held"] == 1 and kept.kept_outputs()["bytes"] == 4 << 20
    maps = kept.kept_outputs()["maps"]
    for _ in range(3):  # "the second network": a size of its own, step after step
        result = kept.empty((3 << 18,), torch.float32, False)  # 3 MiB
        assert _lent(result)
        del result
        assert kept.kept_outputs()["held"] == 1 and kept.kept_outputs()["bytes"] == 3 << 20
    assert kept.kept_outputs()["maps"] == maps + 1  # mapped once, then kept
    kept.empty((6 << 18,), torch.float32, False)  # 6 MiB: beyond the budget alone
    assert kept.kept_outputs()["held"] == 1 and kept.kept_outputs()["bytes"] == 3 << 20


def test_leaving_kept_unmaps_the_idle_and_lent_mappings_as_they_return(kept):
    maps = kept.kept_outputs()["maps"]
    lent = kept.empty((4, 300, 30, 30), torch.float32, False)
    kept.empty((4, 300, 30, 30), torch.float32, False)  # freed at once: idle
    assert kept.kept_outputs()["held"] == 1
    kept.set_outputs("malloc")
    assert kept.kept_outputs()["held"] == 0
    del lent
    assert kept.kept_outputs() == {"maps": maps + 2, "held": 0, "bytes": 0}


def test_threads_taking_and_freeing_results_balance(kept):
    """Four threads, 200 results each of three sizes, written and checked while held: every
    result its own memory, and every mapping idle at the end, its bytes counted once."""
    failures, maps = [], kept.kept_outputs()["maps"]

    def work(seed: int):
        try:
            for i in range(200):
                t = kept.empty((1 << 18 << (i % 3),), torch.float32, False)
                t.fill_(seed)
                if float(t[-1]) != seed or float(t[0]) != seed:
                    failures.append((seed, i))
        except Exception as failure:  # noqa: BLE001 - reported by the main thread
            failures.append(failure)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures[:3]
    held = kept.kept_outputs()
    assert 3 <= held["held"] == held["maps"] - maps <= 24 and (1 << 20) * held["held"] <= held["bytes"] <= (4 << 20) * held["held"], held


@pytest.fixture
def ours():
    """The package's forward and backward for every call."""
    import tvm_convgrad.torch as tt

    modes = tt.get_forward(), tt.get_backward()
    tt.set_forward("ours")
    tt.set_backward("ours")
    yield tt
    tt.set_forward(modes[0])
    tt.set_backward(modes[1])


@pytest.mark.parametrize("channels_last", [False, True])
def test_the_drop_ins_results_are_kept_and_exact_step_after_step(kept, ours, channels_last):
    """A 3x3 layer and a 1x1 layer trained three steps on the package's kernels: the forward's
    outputs and dX are kept mappings from the first step on, the later steps map nothing new,
    and the gradients equal float64 PyTorch's."""
    generator = torch.Generator().manual_seed(5)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    convs = [ours.Conv2d(48, 64, 3, padding=1, bias=False), ours.Conv2d(64, 96, 1, bias=True)]
    x = torch.randn(4, 48, 40, 40, generator=generator).to(memory_format=layout).requires_grad_()  # 1.2 MB: kept
    maps = []
    for _ in range(3):
        x.grad = None
        hidden = convs[0](x)
        y = convs[1](hidden)
        assert _lent(hidden) and _lent(y) and y.is_contiguous(memory_format=layout)
        g = torch.randn(y.shape, generator=generator).to(memory_format=layout)
        y.backward(g)
        assert _lent(x.grad) and x.grad.is_contiguous(memory_format=layout)
        del hidden, y
        maps.append(kept.kept_outputs()["maps"])
    assert maps[1] == maps[2], maps
    x64 = x.detach().double().requires_grad_()
    w0, w1, b1 = (p.detach().double() for p in (convs[0].weight, convs[1].weight, convs[1].bias))
    torch.nn.functional.conv2d(torch.nn.functional.conv2d(x64, w0, padding=1), w1, b1).backward(g.double())
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("channels_last", [False, True])
def test_the_blas_ways_results_are_kept_and_exact(kept, channels_last):
    """A 1x1 layer's forward and dX by PyTorch's BLAS GEMMs (:mod:`tvm_convgrad.torch.blas`, written
    into kept mappings): equal to PyTorch's convolution's, in the input's layout."""
    from tvm_convgrad.torch import blas

    generator = torch.Generator().manual_seed(6)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(4, 64, 40, 40, generator=generator).to(memory_format=layout)
    w, b = torch.randn(96, 64, 1, 1, generator=generator), torch.randn(96, generator=generator)
    dy = torch.randn(4, 96, 40, 40, generator=generator).to(memory_format=layout)
    y = blas.forward(x, w, b, channels_last)
    dx, dw = blas.gradients(dy, x, w, channels_last)(True, True)
    assert _lent(y) and _lent(dx) and y.is_contiguous(memory_format=layout) and dx.is_contiguous(memory_format=layout)
    dx_ref, dw_ref, _ = torch.ops.aten.convolution_backward(dy, x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [True, True, False])
    torch.testing.assert_close(y, torch.nn.functional.conv2d(x, w, b), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dx, dx_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dw, dw_ref, rtol=1e-4, atol=1e-3)


def test_a_policy_not_offered_is_refused_by_name_here_and_at_import():
    import tvm_convgrad.torch as tt
    from tvm_convgrad import ConvGradError

    with pytest.raises(ConvGradError, match=r"policy.*'pool'.*\['kept', 'malloc'\]"):
        tt.set_outputs("pool")
    code = "import tvm_convgrad.torch as tt; print(tt.get_outputs())"
    for value, works in (("malloc", True), ("pool", False)):
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env={**os.environ, "TVM_CONVGRAD_OUTPUTS": value})
        if works:
            assert run.returncode == 0 and run.stdout.split()[-1] == value, run.stderr[-3000:]
        else:
            assert run.returncode != 0 and "TVM_CONVGRAD_OUTPUTS" in run.stderr and "'pool'" in run.stderr, run.stderr[-3000:]
