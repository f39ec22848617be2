"""The notebooks run top to bottom (their code cells, in order, in one namespace)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, capsys):
    cells = json.loads(path.read_text())["cells"]
    namespace: dict = {}
    for i, cell in enumerate(c for c in cells if c["cell_type"] == "code"):
        exec(compile("".join(cell["source"]), f"{path.name}[{i}]", "exec"), namespace)
    out = capsys.readouterr().out
    assert "max |error|" in out
    for line in out.splitlines():
        if "max |error| =" in line:
            assert float(line.rsplit("=", 1)[1]) < 1e-3, line
        if "error / bound =" in line:
            assert float(line.rsplit("=", 1)[1]) <= 1.0, line
