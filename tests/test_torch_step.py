"""Whole training steps with the drop-in: ResNet-18 and MobileNetV2 (written in the package) give
the gradients stock ``nn.Conv2d`` gives, NCHW and channels-last, f32 and under bf16 autocast; and
``tvm-convgrad bench --client torch`` times them and says where the time goes. (What the times
are is the bench's business, never a test's.)"""

from __future__ import annotations

import copy
import json
import os
import platform

import pytest

from conftest import slow, torch

pytestmark = pytest.mark.skipif(torch is None, reason="PyTorch is not installed (pip install torch==2.13.0)")

if torch is not None:
    import torch.nn.functional as F

    from tvm_convgrad.cli import main as cli
    from tvm_convgrad.torch import Conv2d, convert_conv2d, set_forward
    from tvm_convgrad.torch.nets import NETS


def _gradients(model, x, target, autocast: bool) -> dict:
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = F.cross_entropy(model(x), target)
    loss.backward()
    return {name: p.grad.detach().double() for name, p in model.named_parameters()}


@pytest.mark.parametrize("net, channels_last, autocast", [
    ("resnet18", False, False),
    pytest.param("resnet18", True, True, marks=slow),
    pytest.param("mobilenet_v2", True, False, marks=slow),
    pytest.param("mobilenet_v2", False, True, marks=slow),
])  # fmt: skip
def test_a_converted_network_trains_as_the_stock_one(net, channels_last, autocast):
    """The same weights and batch: every parameter's gradient within the dtype's reach of stock's
    (float32: 1e-3 of its largest element; bf16 autocast, where both round every convolution to bf16,
    5e-2), a parameter whose gradient is below 1e-3 of the network's largest measured at that floor."""
    torch.manual_seed(0)
    memory = torch.channels_last if channels_last else torch.contiguous_format
    stock = NETS[net](classes=10).to(memory_format=memory).eval()  # eval: BatchNorm's statistics fixed, dropout off
    ours = convert_conv2d(copy.deepcopy(stock))
    assert sum(type(m) is Conv2d for m in ours.modules()) == sum(isinstance(m, torch.nn.Conv2d) for m in stock.modules())
    x = torch.randn(2, 3, 32, 32).to(memory_format=memory)
    target = torch.randint(0, 10, (2,))
    # bf16 autocast: both forwards are bf16 convolutions rounded differently (PyTorch's bf16 path against the
    # package's fp32 sums rounded once), whose difference compounds over fifty layers: the gradients are
    # compared on PyTorch's forward there (the package's forward has its own float64 tests, tests/test_torch.py)
    set_forward("pytorch" if autocast else "auto")
    try:
        expected, got = _gradients(stock, x, target, autocast), _gradients(ours, x, target, autocast)
    finally:
        set_forward("auto")
    tolerance = 5e-2 if autocast else 1e-3
    largest = max(grad.abs().max().item() for grad in expected.values())
    for name, grad in expected.items():  # a gradient 1000x below the largest (a BatchNorm weight's, ~1e-11) is rounding noise at that scale
        scale = max(grad.abs().max().item(), 1e-3 * largest)
        assert (got[name] - grad).abs().max().item() <= tolerance * scale, name


def test_the_step_bench_times_both_and_profiles_them(tmp_path):
    status = cli(["bench", "--client", "torch", "--nets", "resnet18", "--sizes", "2x32", "--layouts", "channels-last",
                  "--dtypes", "float32", "--rounds", "1", "--out", str(tmp_path)])  # fmt: skip
    assert status == 0
    (row,) = json.loads((tmp_path / "steps.json").read_text())
    assert row["config"] == {"net": "resnet18", "batch": 2, "size": 32, "channels_last": True, "dtype": "float32"}
    assert row["stock_ms"] > 0 and row["ours_ms"] > 0 and row["round_ratios"] == [row["stock_samples"][0] / row["ours_samples"][0]]
    assert len(row["stock_faults"]) == len(row["ours_faults"]) == 1 and all(isinstance(f, int) and f >= 0 for f in row["stock_faults"] + row["ours_faults"])
    assert any("tvm_convgrad::conv2d_weight_grad" in name for name, _ in row["ours_profile"])
    assert not any("tvm_convgrad" in name for name, _ in row["stock_profile"])
    # the convolutions' whole time holds what runs inside them: the kernels, PyTorch's convolutions
    ours_inside = sum(ms for name, ms in row["ours_profile"] if name.startswith("tvm_convgrad::") or name in ("aten::mkldnn_convolution", "aten::mm"))
    stock_inside = sum(ms for name, ms in row["stock_profile"] if name in ("aten::mkldnn_convolution", "aten::convolution_backward"))
    assert row["ours_conv_ms"] >= ours_inside > 0 and row["stock_conv_ms"] >= stock_inside > 0
    # the step's ceiling: stock's convolutions replaced by their least time on this host's roofline
    assert row["conv_bound_ms"] > 0 and "GB/s" in row["host"]
    assert row["stock_profiled_ms"] >= row["stock_conv_ms"] * 0.9 and row["ours_profiled_ms"] > 0
    conv_share = min(1.0, row["stock_conv_ms"] / row["stock_profiled_ms"])
    assert row["ceiling"] == pytest.approx(row["stock_ms"] / (row["stock_ms"] * (1 - conv_share) + row["conv_bound_ms"]))
    report = (tmp_path / "steps.md").read_text()
    assert "| resnet18 | 2 x 32x32 | channels-last | f32 |" in report and "stock operator" in report and "page faults / step" in report
    assert f"| {row['ceiling']:.2f} |" in report and "at this host's roofline" in report


def test_the_step_profiles_alternate_and_take_each_operators_median():
    """The profiled steps alternate as the timed ones (stock, drop-in, drop-in, stock, ...), each
    side's operators in its own profile, each at its median over the steps (0 in a step that did
    not run it: an operator of one step in three has median 0)."""
    import torch

    from tvm_convgrad.training.torch_step import _profiles

    calls, a = [], torch.randn(64, 64)

    def stock():
        calls.append("stock")
        torch.mm(a, a)

    def ours():
        calls.append("ours")
        torch.add(a, a)
        if calls.count("ours") == 1:
            torch.mul(a, a)

    profiles = _profiles(stock, ours, 3)
    assert calls == ["stock", "ours", "ours", "stock", "stock", "ours"]
    stock_ops, ours_ops = dict(profiles[stock][0]), dict(profiles[ours][0])
    assert stock_ops["aten::mm"] > 0 and "aten::add" not in stock_ops
    assert ours_ops["aten::add"] > 0 and "aten::mm" not in ours_ops and ours_ops["aten::mul"] == 0.0
    assert list(ours_ops.values()) == sorted(ours_ops.values(), reverse=True)
    assert all(profiles[side][2] > 0 for side in (stock, ours))


def test_the_step_report_gives_each_rounds_ratio():
    """Each round's ratio is of its own two steps (the samples paired by round, not sorted), and
    the table gives their lowest and highest beside the ratio of the medians."""
    from tvm_convgrad.training.torch_step import StepConfig, StepResult, report

    result = StepResult(StepConfig("resnet18", 8, 64, False, "float32"), 100.0, 80.0, [100.0, 150.0, 90.0], [80.0, 100.0, 90.0])
    assert result.round_ratios == pytest.approx([1.25, 1.5, 1.0])
    assert "| **1.25** | 1.00-1.50 | - |" in report([result])
    assert "| **1.00** | - | - |" in report([StepResult(result.config, 1.0, 1.0, [], [])])


@pytest.mark.parametrize("option, value", [("--nets", "vgg"), ("--sizes", "8"), ("--layouts", "nhwc"), ("--dtypes", "float16")])
def test_the_step_bench_rejects_a_bad_option(option, value, capsys):
    assert cli(["bench", "--client", "torch", option, value]) == 2
    assert option in capsys.readouterr().err


def test_the_layer_bench_lists_each_set_and_times_a_layer(capsys):
    """``training.torch_backward``: its layer sets have the layers they name (a network's convs
    with their counts), and it times a layer both ways."""
    from tvm_convgrad.training.torch_backward import layers, main, net_layers

    late = layers("late", (1, 4))
    assert {layer.input_shape[2] for layer in late} == {7, 14} and {layer.input_shape[0] for layer in late} == {1, 4}
    assert len(layers("resnet50", (2,))) == 23
    atrous = layers("atrous", (4,))
    assert [layer.dilation for layer in atrous] == [2, 6, 12, 18] and all(layer.input_shape[2:] == (14, 14) for layer in atrous)
    resnet18 = net_layers("resnet18", 2, 64)
    assert sum(layer.count for layer in resnet18) == sum(isinstance(m, torch.nn.Conv2d) for m in NETS["resnet18"]().modules()) == 20
    assert resnet18[0].input_shape == (2, 3, 64, 64) and resnet18[0].kernel == 7
    mobilenet = net_layers("mobilenet_v2", 1, 32)
    assert any(layer.groups == layer.input_shape[1] > 1 for layer in mobilenet)  # the depthwise convs
    with pytest.raises(ValueError, match="layer set"):
        layers("vgg")
    assert main(["--layers", "mobilenet_v2", "--batch", "1", "--size", "32", "--rounds", "1", "--filter", r"conv1\.", "--dtype", "bfloat16", "--roofline"]) == 0
    out = capsys.readouterr().out
    assert "mobilenet_v2.conv1.n1" in out and "geomean" in out and "bfloat16" in out
    assert "roofline: copy" in out and "at the roofline" in out and "geomean nn.Conv2d / roofline backward" in out
    with pytest.raises(SystemExit):  # a filter that matches no layer: argparse's error naming the layers
        main(["--layers", "resnet18", "--batch", "1", "--size", "32", "--filter", "layer4"])
    assert "matches none of the layers: resnet18.conv0.n1" in capsys.readouterr().err


def test_the_layer_bench_names_each_sides_page_faults(capsys, monkeypatch):
    """A backward that faults pages: the line gives each side's median count (here every read of
    the counter 500 more than the last, so each backward takes 500), none where there are none."""
    import itertools

    from tvm_convgrad.training import torch_backward

    counter = itertools.count(0, 500)
    monkeypatch.setattr(torch_backward, "minor_faults", lambda: next(counter))
    (row,) = torch_backward.time_layers(torch_backward.net_layers("mobilenet_v2", 1, 32)[:1], rounds=3)
    assert row.faults == (500, 500) and "page faults 500 / 500" in capsys.readouterr().out
    monkeypatch.setattr(torch_backward, "minor_faults", lambda: 7)
    (row,) = torch_backward.time_layers(torch_backward.net_layers("mobilenet_v2", 1, 32)[:1], rounds=1)
    assert row.faults == (0, 0) and "page faults" not in capsys.readouterr().out


def test_the_layer_bench_names_the_gemms_that_ran_pytorchs(capsys, monkeypatch):
    """``--backward auto`` where PyTorch's two GEMMs time as the fastest way: the log line names the
    layer's two GEMMs, the summary counts them and the mode."""
    from tvm_convgrad.torch import backward as backward_module
    from tvm_convgrad.torch import set_backward
    from tvm_convgrad.training.torch_backward import main

    # PyTorch's both the fastest
    monkeypatch.setattr(backward_module, "_timings", lambda runs, *_: {way: 1.0 if len(way) == 2 else 2.0 for way in runs})
    try:
        assert main(["--layers", "mobilenet_v2", "--batch", "1", "--size", "32", "--rounds", "1", "--filter", r"conv1\.", "--backward", "auto"]) == 0
    finally:
        set_backward(os.environ.get("TVM_CONVGRAD_BACKWARD", "auto"))
    out = capsys.readouterr().out
    assert "(PyTorch's dw and dx)" in out and "2 of the drop-in's GEMMs PyTorch's (backward mode auto)" in out, out


def test_stock_beside_the_drop_in_runs_every_kind_of_process():
    """``training.torch_beside``: a round of child processes, one alternating stock with the
    drop-in, one running stock alone, one alternating it with a second stock model; each reports
    stock's step, and the slowdown is taken against both controls."""
    from tvm_convgrad.training.torch_beside import stock_beside
    from tvm_convgrad.training.torch_step import StepConfig

    lines = []
    result = stock_beside(StepConfig("mobilenet_v2", 2, 32, False, "float32"), pairs=1, rounds=1, log=lines.append)
    ((row),) = result["rounds"]
    assert set(row) == {"drop-in", "alone", "stock"} and min(row.values()) > 0
    for control in ("alone", "stock"):
        assert result["median_slowdown"][control] == row["drop-in"] / row[control] - 1
    assert lines[0].count("page faults") == 3 and "alone" in lines[0]
    if platform.libc_ver()[0] == "glibc":  # the control alone keeps glibc's own heap rule, as without the package
        assert result["heap_pinned"] == {"drop-in": True, "alone": False, "stock": True} and lines[0].count("glibc heap rule") == 1


def test_stock_after_the_drop_in_in_one_process():
    """``torch_beside.stock_after``: one process with stock, the drop-in and a second stock model;
    stock's step timed right after each neighbour's (ms and minor page faults)."""
    from tvm_convgrad.training.torch_beside import minor_faults, stock_after
    from tvm_convgrad.training.torch_step import StepConfig

    before = minor_faults()
    result = stock_after(StepConfig("mobilenet_v2", 2, 32, False, "float32"), rounds=1, warmup=1)
    (ours_ms, ours_faults), (stock_ms, stock_faults) = result["after"]["drop-in"], result["after"]["stock"]
    assert ours_ms > 0 and stock_ms > 0 and ours_faults >= 0 and stock_faults >= 0
    assert result["slowdown"] == ours_ms / stock_ms - 1
    assert minor_faults() > before  # (the counter moves: building and running three models touches new pages)
