"""``tvm_convgrad.relax``: Relax's training with the package's conv2d gradients, every gradient
compared with PyTorch autograd in float64 on networks that mix strides, asymmetric pads, dilation,
groups, depthwise and layouts; what Relax's own gradient cannot do (a dilated conv); the
``ConvGradients`` rewrite of a module Relax differentiated; the compiled module exported."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.training.loss import CrossEntropyLoss
from tvm.relax.training.optimizer import SGD

from conftest import slow, torch
from tvm_convgrad.compile import numpy_dtype
from tvm_convgrad.relax import ConvGradients, SetupTrainer, conv2d_gradients

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed (pip install torch==2.13.0)")

# (weight shape in its layout, conv2d attributes): a stem with asymmetric pads, an NHWC/HWIO strided
# conv, a dilated depthwise conv, an NHWC/OHWI grouped conv (OHWI read in place: OXI), a 1x1
_LAYERS = [
    ((8, 3, 3, 3), dict(padding=(1, 0, 2, 1))),
    ((3, 3, 8, 16), dict(strides=2, padding=1, data_layout="NHWC", kernel_layout="HWIO")),
    ((16, 1, 3, 3), dict(padding=2, dilation=2, groups=16)),
    ((16, 3, 2, 8), dict(strides=(1, 2), padding=(0, 1, 1, 0), groups=2, data_layout="NHWC", kernel_layout="OHWI", out_layout="NHWC")),
    ((10, 16, 1, 1), dict()),
]
_BATCH, _CLASSES = 2, 10


def _backbone(dtype: str = "float32") -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((_BATCH, 3, 12, 12), dtype))
    weights = [relax.Var(f"w{i}", relax.TensorType(shape, dtype)) for i, (shape, _) in enumerate(_LAYERS)]
    with bb.function("backbone", [x, *weights]):
        with bb.dataflow():
            h = x
            layout = "NCHW"
            for w, (_, attrs) in zip(weights, _LAYERS):
                want = attrs.get("data_layout", "NCHW")
                if want != layout:
                    h = bb.emit(relax.op.permute_dims(h, [layout.index(c) for c in want]))
                h = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(h, w, **attrs)))
                layout = attrs.get("out_layout", want)
            out = bb.emit_output(relax.op.mean(h, axis=[2, 3] if layout == "NCHW" else [1, 2]))
        bb.emit_func_output(out)
    return bb.get().with_attrs({"param_num": len(_LAYERS), "state_num": 0})


def _torch_grads(args: list[np.ndarray], target: np.ndarray):
    """The same network in PyTorch, float64: loss and the weights' gradients (in their layouts)."""
    F = torch.nn.functional
    tensors = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in args]
    h = tensors[0]
    for w, (_, attrs) in zip(tensors[1:], _LAYERS):
        oihw = {"OIHW": w, "HWIO": w.permute(3, 2, 0, 1), "OHWI": w.permute(0, 3, 1, 2)}[attrs.get("kernel_layout", "OIHW")]
        pad = attrs.get("padding", 0)
        top, left, bottom, right = (pad,) * 4 if isinstance(pad, int) else pad
        h = F.conv2d(F.pad(h, (left, right, top, bottom)), oihw, stride=attrs.get("strides", 1), dilation=attrs.get("dilation", 1),
                     groups=attrs.get("groups", 1))  # fmt: skip
        h = F.relu(h)
    loss = F.cross_entropy(h.mean((2, 3)), torch.tensor(target))
    loss.backward()
    return loss.item(), [t.grad.numpy() for t in tensors[1:]]


def _inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    args = [rng.uniform(-1, 1, (_BATCH, 3, 12, 12)).astype("float32")] + [rng.uniform(-1, 1, s).astype("float32") for s, _ in _LAYERS]
    return args, np.array([1, 7], dtype="int64")


def _loss_args():
    return [relax.TensorType((_BATCH, _CLASSES), "float32"), relax.TensorType((_BATCH,), "int64")]


@needs_torch
def test_setup_trainer_gradients_match_pytorch():
    mod = SetupTrainer(CrossEntropyLoss(), SGD(0.1), _loss_args(), target="llvm")(_backbone())
    names = {gv.name_hint for gv in mod.get_global_vars()}
    assert {"backbone", "backbone_loss", "backbone_loss_adjoint", "optimizer"} <= names
    assert "conv2d_transpose" not in names and sum(n.startswith("conv2d_weight_grad") for n in names) == len(_LAYERS)
    assert sum(n.startswith("conv2d_input_grad") for n in names) == len(_LAYERS) - 1  # the data needs no gradient
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    args, target = _inputs()
    loss, grads = vm["backbone_loss_adjoint"](*[tvm.runtime.tensor(a) for a in args], tvm.runtime.tensor(target))
    expected_loss, expected = _torch_grads(args, target)
    assert abs(float(loss.numpy()) - expected_loss) <= 1e-5 * abs(expected_loss)
    for got, want, (shape, _) in zip(grads, expected, _LAYERS):
        assert got.numpy().shape == shape
        assert np.abs(got.numpy() - want).max() <= 1e-5 * np.abs(want).max() + 1e-7


def _dilated_backbone() -> tvm.IRModule:
    """NCHW / OIHW (the only layouts Relax's own gradient takes), one dilated 3x3 conv."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((_BATCH, 4, 12, 12), "float32"))
    w = relax.Var("w", relax.TensorType((_CLASSES, 4, 3, 3), "float32"))
    with bb.function("backbone", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, padding=2, dilation=2))
            out = bb.emit_output(relax.op.mean(y, axis=[2, 3]))
        bb.emit_func_output(out)
    return bb.get().with_attrs({"param_num": 1, "state_num": 0})


def test_relax_alone_cannot_train_a_dilated_conv():
    """Relax's own conv2d gradient fails on dilation (its conv2d_transpose's output padding) and on
    any layout but NCHW / OIHW; the package's trains both. Relax's own gradient is back after the
    ``with`` block."""
    with pytest.raises(Exception, match="output padding"):
        relax.training.SetupTrainer(CrossEntropyLoss(), SGD(0.1), _loss_args())(_dilated_backbone())
    with pytest.raises(Exception, match="only support NCHW"):
        relax.training.SetupTrainer(CrossEntropyLoss(), SGD(0.1), _loss_args())(_backbone())
    with conv2d_gradients("llvm"):
        relax.training.SetupTrainer(CrossEntropyLoss(), SGD(0.1), _loss_args())(_dilated_backbone())
    with pytest.raises(Exception, match="output padding"):
        relax.training.SetupTrainer(CrossEntropyLoss(), SGD(0.1), _loss_args())(_dilated_backbone())


def _plain_conv_module(dtype: str = "float32"):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 16, 9, 9), dtype))
    w = relax.Var("w", relax.TensorType((32, 16, 3, 3), dtype))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, strides=2, padding=(1, 0, 1, 2)))
            if dtype != "float32":  # Relax differentiates a float32 loss only (not bf16)
                y = bb.emit(relax.op.astype(y, "float32"))
            out = bb.emit_output(relax.op.sum(relax.op.multiply(y, y)))
        bb.emit_func_output(out)
    return bb.get()


def _run_adjoint(mod, *arrays):
    vm = relax.VirtualMachine(tvm.compile(relax.transform.LegalizeOps()(mod), "llvm"), tvm.cpu())
    _, grads = vm["main_adjoint"](*[tvm.runtime.tensor(a) for a in arrays])
    return [g.numpy() for g in grads]


@slow
def test_conv_gradients_rewrites_a_module_relax_differentiated():
    differentiated = relax.transform.Gradient("main")(_plain_conv_module())
    rewrite = ConvGradients("llvm")
    ours = rewrite(differentiated)
    assert rewrite.last_count == 2
    text = ours["main_adjoint"].script()
    assert "R.nn.conv2d_transpose" not in text and "conv2d_input_grad" in text and "conv2d_weight_grad" in text
    rng = np.random.default_rng(0)
    x, w = rng.uniform(-1, 1, (2, 16, 9, 9)).astype("float32"), rng.uniform(-1, 1, (32, 16, 3, 3)).astype("float32")
    for got, want in zip(_run_adjoint(ours, x, w), _run_adjoint(differentiated, x, w)):
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("dtype", [pytest.param("float16", marks=slow), "bfloat16"])
def test_half_precision_gradients(dtype):
    """f16 / bf16 models: the kernels take the type (fp32 sums, rounded once)."""
    import ml_dtypes

    from tvm_convgrad import reference

    with conv2d_gradients("llvm"):
        mod = relax.transform.Gradient("main")(_plain_conv_module(dtype))
    numpy_type = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    rng = np.random.default_rng(0)
    x, w = rng.uniform(-1, 1, (2, 16, 9, 9)).astype(numpy_type), rng.uniform(-1, 1, (32, 16, 3, 3)).astype(numpy_type)
    dx, dw = _run_adjoint(mod, x, w)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    xp = np.pad(x64, ((0, 0), (0, 0), (1, 1), (0, 2)))
    y = sum(np.einsum("nchw,oc->nohw", xp[:, :, i : i + 9 : 2, j : j + 9 : 2][:, :, :5, :5], w64[:, :, i, j]) for i in range(3) for j in range(3))
    dy = 2 * y.astype(numpy_type).astype(np.float64)  # dy = 2 y, y rounded to the model's type
    want_dx = reference.conv2d_backprop_input(w64, dy, (9, 9), (2, 2), (1, 1, 0, 2))
    want_dw = reference.conv2d_backprop_filter(x64, dy, (3, 3), (2, 2), (1, 1, 0, 2))
    eps = 2.0**-10 if dtype == "float16" else 2.0**-7
    for got, want in ((dx, want_dx), (dw, want_dw)):
        assert np.abs(got.astype(np.float64) - want).max() <= 4 * eps * np.abs(want).max()


@slow
def test_the_trainer_module_compiles_exports_and_runs(tmp_path):
    mod = SetupTrainer(CrossEntropyLoss(), SGD(0.1), _loss_args(), target="llvm")(_backbone())
    path = str(tmp_path / "trainer.so")
    tvm.compile(mod, "llvm").export_library(path)
    vm = relax.VirtualMachine(tvm.runtime.load_module(path), tvm.cpu())
    trainer = relax.training.Trainer(mod, vm, tvm.cpu())
    args, target = _inputs()
    trainer.load_params(args[1:])
    losses = [float(trainer.update(args[0], target).numpy()) for _ in range(5)]
    assert losses[-1] < losses[0]


def _inference_module(dtype: str = "float32") -> tvm.IRModule:
    """The backbone's convolutions, ReLUs and mean as an inference ``main`` (x and the weights its parameters)."""
    mod = _backbone(dtype)
    return tvm.IRModule({"main": mod["backbone"].with_attr("global_symbol", "main")})


def test_schedule_convs_puts_every_forward_conv_on_the_package_kernel():
    """An inference module: every ``relax.nn.conv2d`` (NCHW and NHWC, OIHW, HWIO and a permuted OHWI
    weight, an NHWC ``out_layout``, groups, dilation, asymmetric pads) becomes a ``call_tir`` of the
    package's forward, and the module computes what Relax's own legalized convolutions compute."""
    from tvm_convgrad.relax import ScheduleConvs, ScheduleLoops

    args, _ = _inputs()
    mod = _inference_module()
    own = relax.VirtualMachine(tvm.compile(relax.transform.LegalizeOps()(mod), "llvm"), tvm.cpu())["main"](*map(tvm.runtime.tensor, args)).numpy()
    passed = ScheduleConvs("llvm")
    ours = passed(mod)
    assert passed.last_count == len(_LAYERS) and "relax.nn.conv2d" not in ours.script()
    assert passed.last_fused == len(_LAYERS) and "relax.nn.relu" not in ours.script()  # each ReLU inside its convolution's kernel
    ours = ScheduleLoops("llvm")(relax.transform.LegalizeOps()(ours))
    result = relax.VirtualMachine(tvm.compile(ours, "llvm"), tvm.cpu())["main"](*map(tvm.runtime.tensor, args)).numpy()
    np.testing.assert_allclose(result, own, rtol=1e-5, atol=1e-5)


def _epilogue_module(layout: str, dtype: str) -> tvm.IRModule:
    """``main(x, w, b, r)``: a convolution and the epilogue a network puts after it: a reshaped
    bias added (on the left), a residual added, ReLU6, a leaky ReLU, SiLU, the bias subtracted;
    then a convolution whose output is read twice (by a ReLU and by the add after it)."""
    (n, c, h, w_), o = (2, 8, 6, 5), 16
    shape = lambda *nchw: tuple(nchw[ "NCHW".index(a)] for a in layout)  # noqa: E731
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape(n, c, h, w_), dtype))
    w = relax.Var("w", relax.TensorType((o, c, 3, 3), dtype))
    b = relax.Var("b", relax.TensorType((o,), dtype))
    r = relax.Var("r", relax.TensorType(shape(n, o, h, w_), dtype))
    w2 = relax.Var("w2", relax.TensorType((o, o, 1, 1), dtype))
    with bb.function("main", [x, w, b, r, w2]):
        with bb.dataflow():
            bias = bb.emit(relax.op.reshape(b, shape(1, o, 1, 1)))
            y = bb.emit(relax.op.nn.conv2d(x, w, padding=1, data_layout=layout))
            y = bb.emit(relax.op.add(bias, y))
            y = bb.emit(relax.op.add(y, r))
            y = bb.emit(relax.op.clip(y, 0.0, 6.0))
            y = bb.emit(relax.op.nn.leakyrelu(y, 0.1))
            y = bb.emit(relax.op.nn.silu(y))
            y = bb.emit(relax.op.subtract(y, bias))
            z = bb.emit(relax.op.nn.conv2d(y, w2, data_layout=layout))
            out = bb.emit_output(relax.op.add(relax.op.nn.relu(z), z))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("layout, dtype", [("NCHW", "float32"), ("NHWC", "float32"), ("NCHW", "bfloat16")])
def test_schedule_convs_fuses_the_epilogue_into_the_kernel(layout, dtype):
    """The first convolution's six epilogue operators run inside its kernel (their operands its
    arguments); the second's output is read twice, so it stays a value of its own and the ReLU a
    function of its own; the module computes what Relax's own computes (bf16: each of Relax's
    operators rounds, the kernel rounds once)."""
    from tvm_convgrad.relax import ScheduleConvs, ScheduleLoops

    mod = _epilogue_module(layout, dtype)
    passed = ScheduleConvs("llvm")
    ours = passed(mod)
    assert (passed.last_count, passed.last_fused) == (2, 6)
    script = ours["main"].script()
    assert not re.search(r"R\.(add|clip|nn\.leakyrelu|nn\.silu|subtract)\(", script.split("R.call_tir")[1]), script
    assert "R.nn.relu(" in script  # the second convolution's output, read twice
    rng = np.random.default_rng(0)
    args = [rng.uniform(-1, 1, [int(d) for d in p.ty.shape.values]).astype(numpy_dtype(dtype)) for p in mod["main"].params]

    def run(m, args):
        return relax.VirtualMachine(tvm.compile(m, "llvm"), tvm.cpu())["main"](*map(tvm.runtime.tensor, args)).numpy().astype(np.float64)

    result = run(ScheduleLoops("llvm")(relax.transform.LegalizeOps()(ours)), args)
    if dtype == "float32":
        np.testing.assert_allclose(result, run(relax.transform.LegalizeOps()(mod), args), rtol=1e-5, atol=1e-5)
    else:  # against the float32 module on the same inputs: within a few bf16 roundings of the largest value
        f32 = run(relax.transform.LegalizeOps()(_epilogue_module(layout, "float32")), [a.astype(np.float32) for a in args])
        assert np.abs(result - f32).max() <= 2.0**-6 * np.abs(f32).max()


def test_two_convolutions_meeting_in_a_residual_add_fuse_it_once():
    """A downsampling block's end, ``relu((conv(x, w1) + b1) + (conv(x, w2) + b2))``: the first
    convolution takes its bias, the sum and the ReLU (the second's output an argument of its
    kernel), the second its bias; nothing is computed twice or read before it is written."""
    from tvm_convgrad.relax import ScheduleConvs

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 8, 6, 6), "float32"))
    params = [relax.Var(n, relax.TensorType(s, "float32")) for n, s in (("w1", (16, 8, 3, 3)), ("b1", (1, 16, 1, 1)), ("w2", (16, 8, 1, 1)), ("b2", (1, 16, 1, 1)))]
    w1, b1, w2, b2 = params
    with bb.function("main", [x, *params]):
        with bb.dataflow():
            main = bb.emit(relax.op.add(bb.emit(relax.op.nn.conv2d(x, w1, padding=1)), b1))
            shortcut = bb.emit(relax.op.add(bb.emit(relax.op.nn.conv2d(x, w2)), b2))
            out = bb.emit_output(relax.op.nn.relu(bb.emit(relax.op.add(main, shortcut))))
        bb.emit_func_output(out)
    mod = bb.get()
    passed = ScheduleConvs("llvm")
    ours = passed(mod)
    assert (passed.last_count, passed.last_fused) == (2, 4)
    rng = np.random.default_rng(1)
    args = [tvm.runtime.tensor(rng.uniform(-1, 1, [int(d) for d in p.ty.shape.values]).astype("float32")) for p in mod["main"].params]
    run = lambda m: relax.VirtualMachine(tvm.compile(relax.transform.LegalizeOps()(m), "llvm"), tvm.cpu())["main"](*args).numpy()  # noqa: E731
    np.testing.assert_allclose(run(ours), run(mod), rtol=1e-5, atol=1e-5)


@needs_torch
def test_relu_joins_the_convolution_in_a_trainer_and_its_gradient_is_pytorchs_at_zero():
    """In a trainer, ReLU's gradient reads ReLU's output (``where(y > 0, dy, 0)``, PyTorch's
    ``threshold_backward``), so the convolution's output is read by the ReLU alone and the ReLU runs
    inside the convolution's kernel. At a zero pre-activation (zero weights) the gradient is
    PyTorch's 0, where Relax's own (``where(x < 0, 0, dy)``) passes dy through."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((_BATCH, 3, 8, 8), "float32"))
    w = relax.Var("w", relax.TensorType((_CLASSES, 3, 3, 3), "float32"))
    with bb.function("backbone", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.mean(relax.op.nn.relu(relax.op.nn.conv2d(x, w, padding=1)), axis=[2, 3]))
        bb.emit_func_output(out)
    mod = SetupTrainer(CrossEntropyLoss(), SGD(0.1), _loss_args(), target="llvm")(bb.get().with_attrs({"param_num": 1, "state_num": 0}))
    adjoint = mod["backbone_loss_adjoint"].script()
    assert "relu" not in adjoint, "the ReLU is not inside the convolution's kernel"
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    rng = np.random.default_rng(0)
    xs, target = rng.uniform(-1, 1, (_BATCH, 3, 8, 8)).astype("float32"), np.array([1, 7], dtype="int64")
    for weights in (np.zeros((_CLASSES, 3, 3, 3), "float32"), rng.uniform(-1, 1, (_CLASSES, 3, 3, 3)).astype("float32")):
        _, (dw,) = vm["backbone_loss_adjoint"](*map(tvm.runtime.tensor, (xs, weights, target)))
        wt = torch.tensor(weights, dtype=torch.float64, requires_grad=True)
        y = torch.nn.functional.conv2d(torch.tensor(xs, dtype=torch.float64), wt, padding=1).relu().mean((2, 3))
        torch.nn.functional.cross_entropy(y, torch.tensor(target)).backward()
        np.testing.assert_allclose(dw.numpy(), wt.grad.numpy(), rtol=1e-5, atol=1e-7)


def _serial_functions(mod: tvm.IRModule, above: int) -> list[str]:
    """The PrimFuncs with a parameter of at least ``above`` elements and no parallel loop."""
    serial = []
    for gvar, func in mod.functions_items():
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        script = func.script()
        shapes = re.findall(r"T\.Buffer\(\(((?:T\.int64\(\d+\)|\d+|, )*)\)", script)  # the parameters' static shapes
        elements = max(int(np.prod([int(d) for d in re.findall(r"\d+(?=\)|,|$)", shape.replace("T.int64(", ""))] or [1])) for shape in shapes)
        if elements >= above and "T.parallel" not in script:
            serial.append(f"{gvar.name_hint} ({elements})")
    return serial


def test_a_trainer_module_has_no_large_serial_loop_nest(monkeypatch):
    """After ``SetupTrainer``, no PrimFunc with a tensor of at least ``PARALLEL_ABOVE`` elements
    (lowered to 256 for this small network) is a serial loop nest: the package's kernels, and the
    elementwise, broadcast and reduction functions ``ScheduleLoops`` scheduled; without the
    forward pass (``forward=False``, Relax's legalized functions as they are) there are such."""
    from tvm_convgrad.schedule.cpu import generic

    monkeypatch.setattr(generic, "PARALLEL_ABOVE", 256)
    ours = SetupTrainer(CrossEntropyLoss(), SGD(0.1), _loss_args(), target="llvm")(_backbone())
    assert not _serial_functions(ours, 256), _serial_functions(ours, 256)
    relax_own = SetupTrainer(CrossEntropyLoss(), SGD(0.1), _loss_args(), target="llvm", forward=False)(_backbone())
    assert len(_serial_functions(relax_own, 256)) >= 5


def _assert_trains_as_pytorch(trainer, losses: list[float], model, x: np.ndarray, y: np.ndarray, learning_rate: float):
    """The same steps in PyTorch (SGD on cross-entropy, training mode): its losses are the trainer's
    ``losses`` and its parameters after them the trainer's."""
    optimizer = torch.optim.SGD(model.parameters(), learning_rate)
    expected = []
    for _ in losses:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model.train()(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        optimizer.step()
        expected.append(loss.item())
    np.testing.assert_allclose(losses, expected, rtol=1e-4)
    for ours, theirs in zip(trainer.export_params().values(), model.parameters()):
        np.testing.assert_allclose(ours.numpy(), theirs.detach().numpy(), rtol=1e-3, atol=1e-5)


@needs_torch
def test_a_pytorch_module_exported_to_relax_trains_as_pytorch_does():
    """The recipe (``training.exported``): a ResNet written in PyTorch, ``torch.export``ed, imported
    with ``from_exported_program`` and trained with the package's trainer (forward and gradient
    kernels, the other PrimFuncs scheduled): its first two steps' losses and its parameters after
    them are PyTorch's (float32, the same SGD)."""
    from tvm_convgrad.torch.nets import small_resnet
    from tvm_convgrad.training.exported import relax_backbone, relax_trainer

    torch.manual_seed(0)
    model = small_resnet(10)
    rng = np.random.default_rng(0)
    x, y = rng.random((2, 3, 16, 16), dtype=np.float32), np.array([3, 8], dtype="int64")
    backbone = relax_backbone(model, torch.from_numpy(x))
    assert backbone.states == []
    mod, trainer = relax_trainer(backbone.module, batch=2, learning_rate=0.05)
    assert "relax.nn.conv2d" not in mod.script()  # every convolution on the package's kernels
    trainer.load_params(backbone.params)
    losses = [float(trainer.update(x, y).numpy()) for _ in range(2)]
    _assert_trains_as_pytorch(trainer, losses, model, x, y, 0.05)


@needs_torch
def test_batch_norm_trains_with_its_running_statistics_as_states():
    """A PyTorch model with BatchNorm in training mode, exported to Relax: batch statistics in the
    step, the running mean and variance Relax states the trainer updates (TVM's importer alone
    drops them); losses, parameters and running statistics after two steps are PyTorch's."""
    from tvm_convgrad.training.exported import relax_backbone, relax_trainer

    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 16, 3, 2, 1, bias=False),
                          nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))  # fmt: skip
    rng = np.random.default_rng(1)
    x, y = rng.random((4, 3, 8, 8), dtype=np.float32), np.array([1, 2, 3, 4], dtype="int64")
    backbone = relax_backbone(model, torch.from_numpy(x))
    assert int(backbone.module.attrs["state_num"]) == 4 and len(backbone.states) == 4
    _, trainer = relax_trainer(backbone.module, batch=4, learning_rate=0.1)
    trainer.load_params(backbone.params)
    trainer.load_states(backbone.states)
    losses = [float(trainer.update(x, y).numpy()) for _ in range(2)]
    _assert_trains_as_pytorch(trainer, losses, model, x, y, 0.1)
    running = [b.numpy() for m in model.modules() if isinstance(m, nn.BatchNorm2d) for b in (m.running_mean, m.running_var)]
    for ours, theirs in zip(trainer.export_states().values(), running):
        np.testing.assert_allclose(ours.numpy(), theirs, rtol=1e-4, atol=1e-6)


@slow
@needs_torch
def test_the_exported_step_bench_runs(capsys):
    from tvm_convgrad.training.exported import main

    assert main(["--batch", "2", "--steps", "1", "--rounds", "1"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("small_resnet N=2") and "inference forward" in line and "PyTorch / ours" in line


def test_relax_chooses_winograd_for_the_target_it_builds_for():
    """``algorithm_for`` gives ``"auto"`` on a CPU, and the choice is the compile target's, not
    the host's: a 3x3 layer on 7x7 maps at N=8 (4 tiles a side, 128 of them, the last ones half
    cut) runs F(2x2, 3x3) for AVX-512 and the cube for AVX2
    (:data:`~tvm_convgrad.dsl.compute.winograd_rules.WINOGRAD_NARROW_ODD_MIN_TILES`), its forward
    and dX alike; the dW by its own rule (the cube)."""
    from tvm_convgrad import isa_target
    from tvm_convgrad.frontends.conv2d import Conv2dGradients
    from tvm_convgrad.relax.forward import forward_func
    from tvm_convgrad.relax.gradient import Conv2dCall, gradient_funcs

    gradients = Conv2dGradients((8, 128, 7, 7), (128, 128, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, "float32")
    call = Conv2dCall(gradients, "NCHW", "OIHW")
    for isa, winograd in (("avx512", True), ("avx2", False)):
        target = isa_target(isa)
        dx, dw = gradient_funcs(gradients, target)
        forward = forward_func(call, target)
        assert ("wino_m" in dx.script()) == winograd and ("wino_m" in forward.script()) == winograd, isa
        assert "wino_dw" not in dw.script()
