"""The "auto" modes' choices kept beside the stored kernels (tvm_convgrad.torch.remembered): a later
process takes them without timing, the same choices; another thread count, or off, times again."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from tvm_convgrad.compile import stored  # noqa: E402
from tvm_convgrad.torch import remembered  # noqa: E402

_TRAIN = textwrap.dedent("""
    import sys, torch
    import tvm_convgrad.torch as tt
    from tvm_convgrad.torch import backward, forward
    timed = []
    for module, name in ((forward, "wins"), (backward, "wins"), (backward, "_timings")):
        real = getattr(module, name)
        setattr(module, name, lambda *a, real=real: timed.append(1) or real(*a))
    torch.set_num_threads(int(sys.argv[1]))
    tt.set_backward("auto"), tt.set_forward("auto")
    torch.manual_seed(0)
    model = torch.nn.Sequential(tt.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU(), tt.Conv2d(16, 32, 1))
    x = torch.randn(4, 16, 10, 10).contiguous(memory_format=torch.channels_last)
    for _ in range(2):
        model(x).square().sum().backward()
    choices = sorted(map(repr, tt.forward_choices().items())) + sorted(map(repr, tt.backward_choices().items()))
    print(len(timed), len(choices), hash(tuple(choices)))
""")


def _run(folder, threads=1):
    env = dict(os.environ, **{stored.ENV: str(folder), "PYTHONHASHSEED": "0"})
    done = subprocess.run([sys.executable, "-c", _TRAIN, str(threads)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    timed, count, choices = map(int, done.stdout.split()[-3:])
    return timed, count, choices


def test_a_later_process_takes_the_choices_without_timing(tmp_path):
    first = _run(tmp_path)
    assert first[0] > 0 and first[1] == 5  # two forwards; the first layer's dW (x needs no gradient), the second's dX and dW
    second = _run(tmp_path)
    assert second == (0, *first[1:])  # nothing timed, the same choices
    assert _run(tmp_path, threads=2)[0] > 0  # another thread count: another timing
    files = sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".json")
    assert len(files) == 2 and all(len(json.loads((tmp_path / f).read_text())) == 4 for f in files)  # 2 forwards, 2 backwards


def test_remember_recall_and_forget(tmp_path, monkeypatch):
    monkeypatch.setenv(stored.ENV, str(tmp_path))
    remembered._recalled.clear()
    assert remembered.recall("forward", ("call", True)) is None
    remembered.remember("forward", ("call", True), "blas")
    remembered._recalled.clear()  # as a new process would read it
    assert remembered.recall("forward", ("call", True)) == "blas" and remembered.path().is_file()
    remembered.path().write_text("{damaged")
    remembered._recalled.clear()
    assert remembered.recall("forward", ("call", True)) is None  # timed again
    remembered.remember("backward", ("call", (True, True)), {"pytorch": ["dw"], "blas": False})
    remembered.forget()
    assert not remembered.path().exists() and remembered.recall("backward", ("call", (True, True))) is None
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".building-")] == []


def test_off_remembers_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(stored.ENV, "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    remembered.remember("forward", ("call", False), "ours")
    assert remembered.path() is None and remembered.recall("forward", ("call", False)) is None and os.listdir(tmp_path) == []


def test_each_kernel_algorithm_has_its_own_choices(tmp_path, monkeypatch):
    """``kernels.ALGORITHM = "direct"`` (the cube where F(2x2, 3x3) would run): other kernels, other timings."""
    from tvm_convgrad.torch import kernels

    monkeypatch.setenv(stored.ENV, str(tmp_path))
    first = remembered.path()
    monkeypatch.setattr(kernels, "ALGORITHM", "direct")
    assert remembered.path() != first and remembered.path().parent == first.parent


def test_a_remembered_choice_of_another_form_is_timed_again(tmp_path):
    """A file another version wrote, or edited by hand: its entries are passed over, not trusted."""
    _run(tmp_path)
    (file,) = (p for p in tmp_path.iterdir() if p.suffix == ".json")
    choices = json.loads(file.read_text())
    file.write_text(json.dumps({key: ({"pytorch": "dx"} if key.startswith("backward") else 3) for key in choices}))
    timed, count, _ = _run(tmp_path)
    assert timed > 0 and count == 5
