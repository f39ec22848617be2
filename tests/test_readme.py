"""The README's two set-up commands exist, and CI runs the test command's steps in order."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from conftest import USER_SET_THREADS, needs_torch, worker_cores

ROOT = Path(__file__).parent.parent


def _commands() -> list[str]:
    return re.findall(r"```bash\n(python3 -m venv[^\n]*)\n```", (ROOT / "README.md").read_text())


def test_readme_has_the_two_setup_commands():
    main, tests = _commands()
    assert main.endswith("tvm-convgrad demo") and "pip install -e ." in main
    assert tests.endswith("python -m pytest -q -n auto --maxprocesses 4") and '".[test]"' in tests  # (pytest-xdist, the test extra's)


def test_ci_runs_the_readme_test_command():
    steps = _commands()[1].split(" && ")
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith(("#", "set ", "cd "))]
    assert [line for line in ci if "torch" not in line] == steps
    assert ".venv/bin/pip install torch==2.13.0" in ci


@pytest.mark.skipif(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) < 2, reason="the README's command runs workers; this run has none")
def test_each_worker_of_the_readme_command_has_its_share_of_the_cores():
    """Under the README's command every worker's TVM and OpenMP pools (and what its tests start:
    notebook kernels, benchdnn's children) get the worker's cores, not every core: the package's
    import sets ``TVM_NUM_THREADS`` to every core in xdist's controller, whose environment the
    workers inherit (a notebook took 7x as long beside a benchdnn worker)."""
    if os.environ[USER_SET_THREADS]:
        pytest.skip("the user set TVM_NUM_THREADS / OMP_NUM_THREADS for this run")
    assert os.environ["TVM_NUM_THREADS"] == os.environ["OMP_NUM_THREADS"] == str(worker_cores())


def test_readme_usage_snippet_runs(tmp_path, monkeypatch, capsys):
    snippet = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    monkeypatch.chdir(tmp_path)
    exec(compile(snippet, "README.md", "exec"), {})
    error = float(capsys.readouterr().out.splitlines()[0])
    assert error < 1e-4
    assert (tmp_path / "my_dw.so").exists()


def _snippet(index: int) -> str:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)[index]


def test_readme_is_a_front_door():
    """Short, with the four ways in, and every document it points to exists."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for link in re.findall(r"\]\(((?:docs|notebooks)/[^)#]*)", text):
        assert (ROOT / link).exists(), link


def test_readme_relax_snippet_runs(capsys):
    snippet = _snippet(2)
    assert "tvm_convgrad.relax import SetupTrainer" in snippet
    exec(compile(snippet, "README.md", "exec"), {})
    loss = float(capsys.readouterr().out.split()[-1])
    assert 0 < loss < 10


@needs_torch
def test_readme_pytorch_snippet_runs(capsys):
    snippet = _snippet(3)
    assert "tvm_convgrad.torch import Conv2d" in snippet
    exec(compile(snippet, "README.md", "exec"), {})
    assert capsys.readouterr().out.strip() == "(8, 16, 28, 28) (32, 16, 3, 3)"


def test_readme_framework_snippet_runs(capsys):
    snippet = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)[1]
    assert "onednn.convolution_backward_weights" in snippet
    exec(compile(snippet, "README.md", "exec"), {})
    assert capsys.readouterr().out.split() == ["25088.0", "24200.0"]
