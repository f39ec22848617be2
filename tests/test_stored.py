"""Kernels kept on disk between processes (tvm_convgrad.compile.stored): what a second process
loads is the kernel the first one built, a change of code or of workload builds anew, and a store
that cannot be written or read falls back to the kernel built in the process."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tvm_convgrad
from tvm_convgrad.compile import Workload, builder, resolve_target, stored
from tvm_convgrad.frontends.conv2d import Conv2dGradients

CALL = Conv2dGradients((2, 8, 9, 9), (16, 8, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, "float32", "NXC", "OXI")


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A store folder of the test's own, and no kernel built before in the process."""
    monkeypatch.setenv(stored.ENV, str(tmp_path))
    builder._CACHE.clear()
    yield tmp_path
    builder._CACHE.clear()


def _libraries(folder):
    return sorted(p.name for p in folder.iterdir() if p.suffix == ".so")


def _fresh(tensors, **kwargs):
    builder._CACHE.clear()
    return tvm_convgrad.build(tensors, **kwargs)


@pytest.mark.parametrize("which", ["input_grad", "weight_grad", "forward"])
def test_a_stored_kernel_is_loaded_again_and_computes_what_was_built(store, which):
    tensors = {"input_grad": lambda: CALL.input_grad("dx"), "weight_grad": lambda: CALL.weight_grad("dw"),
               "forward": lambda: CALL.forward("y", True)}[which]  # fmt: skip
    built = _fresh(tensors())
    assert built.library is None and _libraries(store) == []  # store=False: nothing written
    first = _fresh(tensors(), store=True)
    assert first.library is not None and len(_libraries(store)) == 1
    assert tvm_convgrad.build(tensors(), store=True) is first  # built once a process, as without the store
    again = _fresh(tensors(), store=True)
    assert again.library is not None and again._executable is None  # loaded: nothing compiled
    assert tvm_convgrad.build(tensors(), store=True) is again
    assert (again.name, again.args, again.formulation, again.flops, again.schedule) == (built.name, built.args, built.formulation, built.flops, built.schedule)  # fmt: skip
    rng = np.random.default_rng(0)
    inputs = [rng.uniform(-1, 1, a.shape).astype(a.dtype) for a in built.inputs]
    np.testing.assert_array_equal(again(*inputs), built(*inputs))  # the same code: bit for bit
    assert again.time(repeat=1, min_repeat_ms=1).median > 0
    assert again._executable is None and f"def {again.name}(" in again.inspect_source("tir")  # scheduled again when asked
    assert again._executable is not None and again.mod is not None and again.name in again.inspect_source("asm")
    assert len(_libraries(store)) == 1


def test_the_key_covers_the_workload_the_target_and_the_code(store, monkeypatch):
    _fresh(CALL.input_grad("dx"), store=True)
    _fresh(CALL.input_grad("dx_named_otherwise"), store=True)  # another symbol
    other = Conv2dGradients((2, 8, 9, 9), (16, 8, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1, "float32", "NXC", "OXI")
    _fresh(other.input_grad("dx"), store=True)
    host = resolve_target("llvm")
    one_core = {"kind": "llvm", "num-cores": 1, **({"mcpu": host.attrs["mcpu"]} if "mcpu" in host.attrs else {})}
    assert _fresh(CALL.input_grad("dx"), target=one_core, store=True).library is not None  # another target
    assert len(_libraries(store)) == 4
    monkeypatch.setattr(stored, "fingerprint", lambda: "the package's code, changed")
    changed = _fresh(CALL.input_grad("dx"), store=True)
    assert changed._executable is not None and len(_libraries(store)) == 5  # built again, not loaded


def test_a_damaged_library_is_replaced(store):
    """(A library is never rewritten in place: a process that has it mapped would fault. This one
    was never loaded.)"""
    from tvm_convgrad.compile.records import SHIPPED

    target = resolve_target("llvm")
    name = stored.key(Workload.of(CALL.weight_grad("dw")).for_target(target), target, SHIPPED)
    damaged = store / f"{name}.default.so"
    damaged.write_bytes(b"\x7fELF, cut short")
    rebuilt = _fresh(CALL.weight_grad("dw"), store=True)
    assert rebuilt._executable is not None and rebuilt.library is not None and damaged.stat().st_size > 1000
    x = np.random.default_rng(1).uniform(-1, 1, rebuilt.inputs[0].shape).astype("float32")
    dy = np.random.default_rng(2).uniform(-1, 1, rebuilt.inputs[1].shape).astype("float32")
    np.testing.assert_array_equal(_fresh(CALL.weight_grad("dw"))(x, dy), rebuilt(x, dy))


def test_without_a_c_compiler_the_kernel_is_the_one_built_in_the_process(store, monkeypatch):
    monkeypatch.setenv("CXX", str(store / "no-such-compiler"))
    stored._warn_once.cache_clear()
    with pytest.warns(RuntimeWarning, match="not kept on disk"):
        kernel = _fresh(CALL.input_grad("dx"), store=True)
    assert kernel.library is None and os.listdir(store) == []  # no library, no temporary left
    dy = np.ones(kernel.inputs[0].shape, "float32")
    w = np.ones(kernel.inputs[1].shape, "float32")
    assert kernel(dy, w).shape == kernel.output.shape


@pytest.mark.parametrize("value", ["off", "0", "", "OFF"])
def test_off_keeps_nothing(tmp_path, monkeypatch, value):
    monkeypatch.setenv(stored.ENV, value)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert stored.folder() is None
    assert _fresh(CALL.input_grad("dx"), store=True).library is None and os.listdir(tmp_path) == []


def test_the_default_folder(monkeypatch, tmp_path):
    monkeypatch.delenv(stored.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert stored.folder() == tmp_path / "tvm_convgrad" / "kernels"


def test_the_folder_is_kept_under_its_limit_least_recently_used_first(tmp_path):
    for i, name in enumerate(("old", "middle", "new")):
        path = tmp_path / f"{name}.default.so"
        path.write_bytes(b"x" * 1000)
        os.utime(path, (1000 + i, 1000 + i))
    stale, fresh = tmp_path / ".building-a.so", tmp_path / ".building-b.so"
    stale.write_bytes(b"x"), fresh.write_bytes(b"x")
    os.utime(stale, (1000, 1000))
    stored._trim(tmp_path, limit=2500)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".building-b.so", "middle.default.so", "new.default.so"]


def test_only_cpu_kernels_this_host_runs_with_shipped_or_no_records_are_stored(store, tmp_path):
    from tvm_convgrad.compile import open_database

    open_database(tmp_path / "my-records", create=True)
    _fresh(CALL.input_grad("dx"), store=True, schedules=str(tmp_path / "my-records"))
    assert _libraries(store) == []  # a user's database may change under the same name
    _fresh(CALL.input_grad("dx"), target="cuda", store=True)
    assert _libraries(store) == []


_TRAIN = textwrap.dedent("""
    import sys, torch
    from tvm_convgrad.compile import builder
    import tvm_convgrad.torch as tt
    compiled = []
    real = builder._compiled
    builder._compiled = lambda *a: compiled.append(1) or real(*a)
    tt.set_backward("ours"), tt.set_forward("ours")
    torch.manual_seed(0)
    model = torch.nn.Sequential(tt.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), tt.Conv2d(8, 16, 3, stride=2, groups=2))
    x = torch.randn(2, 3, 12, 12).contiguous(memory_format=torch.channels_last)
    model(x).square().sum().backward()
    torch.save([p.grad for p in model.parameters()], sys.argv[1])
    print(len(compiled))
""")


def test_a_second_process_trains_on_the_kernels_the_first_stored(tmp_path):
    torch = pytest.importorskip("torch")
    env = dict(os.environ, **{stored.ENV: str(tmp_path / "kernels")})
    counts = []
    for run in ("first", "second"):
        done = subprocess.run([sys.executable, "-c", _TRAIN, str(tmp_path / f"{run}.pt")], env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        counts.append(int(done.stdout.split()[-1]))
    assert counts[0] >= 4 and counts[1] == 0  # the second process compiled nothing
    first, second = (torch.load(tmp_path / f"{run}.pt") for run in ("first", "second"))
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def test_a_folder_shared_read_only_still_serves_its_kernels(store, monkeypatch):
    _fresh(CALL.weight_grad("dw"), store=True)

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(stored.os, "utime", read_only)
    loaded = _fresh(CALL.weight_grad("dw"), store=True)
    assert loaded.library is not None and loaded._executable is None


def test_trimming_passes_over_files_other_processes_take_away(tmp_path, monkeypatch):
    """Found with two pytest-xdist workers storing at once: a temporary renamed between the folder's
    listing and its ``stat`` failed the build."""
    (tmp_path / "kept.default.so").write_bytes(b"x")
    gone = tmp_path / ".building-renamed.so"
    gone.write_bytes(b"x")
    listing = list(os.scandir(tmp_path))
    gone.unlink()
    monkeypatch.setattr(stored.os, "scandir", lambda where: iter(listing))
    stored._trim(tmp_path, limit=0)
    assert os.listdir(tmp_path) == []
