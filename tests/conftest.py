"""Shared test helpers: the PyTorch oracle (when torch is installed) and closeness checks."""

from __future__ import annotations

import ctypes
import os
import sys


def worker_cores() -> int:
    """This test process's share of the cores: all of them, or under pytest-xdist the cores
    divided among the workers (a test that starts a process per core starts this many)."""
    return max(1, len(os.sched_getaffinity(0)) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


USER_SET_THREADS = "TVM_CONVGRAD_TESTS_USER_THREADS"
"""Whether the user of this run set ``TVM_NUM_THREADS`` or ``OMP_NUM_THREADS`` ("1" or ""), as the
run's first process saw it: importing the package sets ``TVM_NUM_THREADS`` to every core, and
pytest-xdist's workers inherit the controller's environment after its conftest imported it."""


def _share_the_cores_among_workers():
    """Under pytest-xdist, each worker's thread pools (TVM's, PyTorch's OpenMP) get its share of
    the cores, unless the user set them: pools of every core in every worker spin against each
    other (a notebook's training loop took 10x as long), before anything starts them."""
    if USER_SET_THREADS not in os.environ:  # the run's first process (xdist's controller, or pytest without it)
        os.environ[USER_SET_THREADS] = "1" if {"TVM_NUM_THREADS", "OMP_NUM_THREADS"} & set(os.environ) else ""
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1 and not os.environ[USER_SET_THREADS]:
        os.environ["TVM_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = str(worker_cores())


_share_the_cores_among_workers()
# The PyTorch drop-in's tests check the package's dX and dW kernels: "auto" (the default) would run
# PyTorch's in their place where it times faster (tests/test_torch_backward_mode.py tests it).
os.environ.setdefault("TVM_CONVGRAD_BACKWARD", "ours")
# The drop-in keeps its kernels and "auto"'s choices on disk (tvm_convgrad.compile.stored,
# tvm_convgrad.torch.remembered): the tests build and time in the process, writing nothing to the
# user's cache, and "auto"'s tests time their own signatures rather than recall another run's
# choices (tests/test_stored.py and tests/test_torch_remembered.py test the store, in folders of their own).
os.environ["TVM_CONVGRAD_KERNEL_CACHE"] = "off"

DROP_IN_NODES = frozenset({"Conv2dFunctionBackward", "CppFunction"})
"""The drop-in's autograd nodes: the Python one (``ops.Conv2dFunction``) and the C++ one a call
whose gradients are settled as the package's takes (``tvm_convgrad.torch.native``)."""

import numpy as np  # noqa: E402
import psutil  # noqa: E402
import pytest  # noqa: E402

from tvm_convgrad import isa_target  # noqa: E402
from tvm_convgrad.isa import host_can_run, isa_plan  # noqa: E402
from tvm_convgrad.params import ConvGeometry, ConvGradParams  # noqa: E402
from tvm_convgrad.tools.verify import error_bound  # noqa: E402

try:
    import torch
except ImportError:  # the oracle tests skip without it
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed (pip install torch==2.13.0)")


@pytest.fixture
def python_path(monkeypatch):
    """``tvm_convgrad.torch.ops.conv2d`` (the Python path behind ``tvm_convgrad.torch.conv2d``, which
    a settled call skips: ``tvm_convgrad.torch.native.fast``) counted: the list of calls that reached it."""
    from tvm_convgrad.torch import ops

    seen, original = [], ops.conv2d

    def counted(*args):
        seen.append(args)
        return original(*args)

    monkeypatch.setattr(ops, "conv2d", counted)
    return seen


def _runnable_isas() -> list[str]:
    """``"native"`` (this CPU's plan) and every other x86 plan this host can execute: AVX2 and
    SSE code run on an AVX-512 machine, SSE code on an AVX2 one. Correctness tests run them all."""
    native = isa_plan(isa_target("native")).name
    others = [isa for isa in ("avx2", "sse") if isa != native and host_can_run(isa_target(isa))]
    return ["native", *others] if native in ("avx512", "avx2", "sse") else ["native"]


RUNNABLE_ISAS = _runnable_isas()


# --- no child process outlives its test -----------------------------------------------------------

_PR_SET_CHILD_SUBREAPER = 36
LINGER_S = 10.0
"""How long a test's child processes may take to exit after it returned."""


def _become_subreaper() -> bool:
    """On Linux, make this process the reaper of its orphaned descendants: a worker whose parent
    (a CLI run, an RPC server) died is re-parented here instead of to init, so the check below
    sees it. Elsewhere only direct descendants are checked."""
    if not sys.platform.startswith("linux"):
        return False
    return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


SUBREAPER = _become_subreaper()


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def stop_process_tree(pid: int, timeout: float = 10.0):
    """End process ``pid`` and every process under it (terminate, then kill what is left)."""
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in tree:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(tree, timeout=timeout)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=timeout)


@pytest.fixture(autouse=True)
def no_child_process_outlives_its_test():
    """Fail a test whose child processes (MetaSchedule workers, RPC servers, kernels of notebooks,
    CLI runs and what they started) are still running :data:`LINGER_S` after it returned; they
    are killed, so that the next tests start clean. Zombies are reaped."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    started = [p for p in me.children(recursive=True) if p.pid not in before]
    _, alive = psutil.wait_procs(started, timeout=LINGER_S)
    alive = [p for p in alive if _alive(p)]
    for p in me.children():  # reap this process's zombies (orphans it adopted as the subreaper)
        if p.pid not in before and not _alive(p):
            try:
                p.wait(timeout=0)
            except (psutil.TimeoutExpired, psutil.NoSuchProcess, psutil.AccessDenied):
                pass
    if alive:
        described = []
        for p in alive:
            try:
                described.append(f"pid {p.pid}: {' '.join(p.cmdline())[:160]}")
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=5)
        pytest.fail(f"{len(described)} child process(es) outlived the test: " + "; ".join(described), pytrace=False)


# --- the longest tests first ------------------------------------------------------------------------

LONGEST_FIRST = (
    "test_memory_bounds.py::test_random_calls_",  # 108 s on the 2-core Zen 3 (2026-12-02, in a 2-worker run)
    "test_cuda.py::test_tune_for_cuda_",  # 93
    "test_relax.py::test_the_exported_step_bench_runs",  # 89
    "test_memory_bounds.py::test_the_calls_issue_26_",  # 84
    "test_benchdnn.py::test_every_small_problem_",  # 4 x 57-84
    "test_notebooks.py::test_notebook_runs",  # 6: 73, 71, 46, ...
    "test_torch_step.py::test_stock_beside_",  # 62
    "test_tune.py::test_tune_over_an_rpc_tracker",  # 51
    "test_soak.py::",  # 45
    "test_build.py::test_index_width",  # 41
    "test_training.py::test_train_command_writes_",  # 41
    "test_tune.py::test_tune_locally_",  # 39
    "test_relax.py::test_a_pytorch_module_exported_",  # 37
    "test_bench.py::test_a_bf16_bench_",  # 35
    "test_torch_step.py::test_a_converted_network_",  # 4: 22-35
    "test_tune.py::test_shipped_records_",  # 34
)
"""Node ids (their starts, under ``tests/``) of the tests that take longest, longest first: they are
collected first, so that xdist's workers start them first and share them, and the suite ends on
short tests (collected in file order, the long ones of the last files made the last 4% of the tests
7 of the 40 minutes of a run on the 2-core Zen 3)."""


def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        node = item.nodeid.removeprefix("tests/")
        return next((i for i, start in enumerate(LONGEST_FIRST) if node.startswith(start)), len(LONGEST_FIRST))

    items.sort(key=rank)  # stable: the rest keep their order


slow = pytest.mark.slow

NEON = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-n1", "num-cores": 2}
"""The AArch64 target the tests cross-compile for (NEON, two cores): code checked for an ISA the host may lack."""


def tiered(values, fast, ids=None, unpack: bool = False) -> list:
    """``values`` as pytest parameters, each marked ``slow`` unless ``fast(index, value)`` holds: the
    full suite runs them all, the fast tier (``-m "not slow"``) the chosen few. ``unpack``: each
    value is a tuple of several parameters."""
    return [pytest.param(*(v if unpack else (v,)), marks=() if fast(i, v) else (slow,), id=ids(v) if callable(ids) else None)
            for i, v in enumerate(values)]  # fmt: skip


def native_first(isas) -> list:
    """The ISA plans as parameters: this CPU's in the fast tier, the others (AVX2, SSE) in the full suite."""
    return tiered(isas, lambda i, isa: isa == "native")


def torch_filter_grad(x: np.ndarray, dy: np.ndarray, geom: ConvGeometry) -> np.ndarray:
    """dW OIHW in float64 from ``torch.nn.grad.conv2d_weight`` (asymmetric pads: pad x first)."""
    pt, pb, pl, pr = geom.pads
    xpad = torch.nn.functional.pad(torch.from_numpy(x.astype(np.float64)), (pl, pr, pt, pb))
    return torch.nn.grad.conv2d_weight(
        xpad, geom.filter_sizes, torch.from_numpy(dy.astype(np.float64)),
        stride=geom.strides, padding=0, dilation=geom.dilations, groups=geom.groups,
    ).numpy()  # fmt: skip


def torch_input_grad(w: np.ndarray, dy: np.ndarray, geom: ConvGeometry) -> np.ndarray:
    """dX NCHW in float64 from ``torch.nn.grad.conv2d_input`` on the padded input, then cropped."""
    pt, pb, pl, pr = geom.pads
    padded = (geom.batch, geom.cin, geom.h + pt + pb, geom.w + pl + pr)
    dx = torch.nn.grad.conv2d_input(
        padded, torch.from_numpy(w.astype(np.float64)), torch.from_numpy(dy.astype(np.float64)),
        stride=geom.strides, padding=0, dilation=geom.dilations, groups=geom.groups,
    ).numpy()  # fmt: skip
    return dx[:, :, pt : pt + geom.h, pl : pl + geom.w]


def assert_within_bound(actual: np.ndarray, expected: np.ndarray, params: ConvGradParams, what: str = ""):
    """Every element within :func:`tvm_convgrad.tools.verify.error_bound` of ``expected``."""
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    error = np.abs(actual.astype(np.float64) - expected)
    ratio = error / error_bound(params, expected)
    worst = np.unravel_index(np.argmax(ratio), ratio.shape)
    assert ratio.max() <= 1.0, (
        f"{what}: max error {error.max():.3g} is {ratio.max():.3g}x the bound, "
        f"worst at {worst}: {actual[worst]} vs {expected[worst]}"
    )


@pytest.fixture
def fresh_plans():
    """Plans and kernels made while a test lowers the weight-bound rule's limits are not left to later tests."""
    from tvm_convgrad.torch import kernels

    yield
    for cached in (kernels.call_plan, kernels.streamed_input_grad_kernel, kernels.streamed_forward_kernel):
        cached.cache_clear()
