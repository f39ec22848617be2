"""The digits CNN (``tvm_convgrad.training``): the dataset, the model built for Relax and PyTorch from
the same weights, and ``tvm-convgrad train``. The full three-way training run (>= 95% held-out
accuracy each, the loss curves within 1e-3 over the first 20 steps) is notebook 05, executed by
``tests/test_notebooks.py``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cli_runs import cli, cli_in_process
from conftest import slow, torch

pytestmark = pytest.mark.skipif(torch is None, reason="PyTorch is not installed (pip install torch==2.13.0)")
sklearn = pytest.importorskip("sklearn", reason="scikit-learn is not installed (pip install -e '.[test]')")

from tvm_convgrad.training import DIGITS_CNN, init_params, load_digits, relax_backbone, torch_model  # noqa: E402


def test_the_digits_split():
    data = load_digits()
    assert data.train_x.shape == (1500, 1, 32, 32) and data.test_x.shape == (297, 1, 32, 32)
    assert data.train_x.dtype == np.float32 and data.train_y.dtype == np.int64
    assert abs(float(data.train_x.mean())) < 1e-4 and abs(float(data.train_x.std()) - 1) < 1e-3
    assert set(np.unique(data.test_y)) == set(range(10))
    epochs = [epoch for epoch, x, y in data.batches(32, 100, seed=0)]
    assert epochs[45] == 0 and epochs[46] == 1  # 46 whole batches per epoch


def test_the_net_covers_the_gradients_kinds():
    convs = DIGITS_CNN.convs
    assert any(c.stride > 1 for c in convs) and any(c.dilation > 1 for c in convs)
    assert any(c.groups == c.cin > 1 for c in convs) and any(1 < c.groups < c.cin for c in convs) and len(convs) >= 4


def test_relax_and_torch_models_compute_the_same_forward():
    import tvm
    from tvm import relax

    params = init_params(DIGITS_CNN, seed=3)
    x = load_digits().test_x[:4]
    vm = relax.VirtualMachine(tvm.compile(relax.transform.LegalizeOps()(relax_backbone(DIGITS_CNN, 4)), "llvm"), tvm.cpu())
    ours = vm["backbone"](tvm.runtime.tensor(x), *[tvm.runtime.tensor(p) for p in params]).numpy()
    with torch.no_grad():
        theirs = torch_model(DIGITS_CNN, params)(torch.from_numpy(x)).numpy()
    assert np.abs(ours - theirs).max() <= 1e-4 * np.abs(theirs).max()


@slow
def test_train_command_writes_the_curves_and_agrees(tmp_path):
    run = cli("train", "--steps", "24", "--out", str(tmp_path), "--no-progress", timeout=900)
    assert run.returncode == 0, run.stderr
    record = json.loads((tmp_path / "train.json").read_text())
    assert set(record["runs"]) == {"relax", "torch", "torch-ours"} and (tmp_path / "loss_curve.png").stat().st_size > 0
    assert all(len(r["losses"]) == 24 and r["seconds_per_step"] > 0 for r in record["runs"].values())
    assert all(d <= 1e-3 for d in record["agreement"].values()), record["agreement"]
    assert "held-out accuracy" in run.stdout and "ms/step" in run.stdout


@slow
def test_train_command_rejects_an_unknown_client():
    run = cli_in_process("train", "--clients", "jax")
    assert run.returncode != 0 and "--clients" in run.stderr
