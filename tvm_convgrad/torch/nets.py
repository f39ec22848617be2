"""Two training workloads written here (torchvision's wheel does not load beside PyTorch's CPU
build on these machines): torchvision's ResNet-18 and MobileNetV2 architectures, layer for layer,
with ``nn.Conv2d`` layers
(:func:`tvm_convgrad.torch.convert_conv2d` makes them the drop-in).

* :func:`resnet18`: 7x7/2 stem, 3x3/2 max pool, four stages of two BasicBlocks (64, 128, 256, 512
  channels; the first block of stages 2-4 strided, its shortcut a 1x1/2 convolution + BatchNorm),
  global average pool, a linear classifier;
* :func:`mobilenet_v2`: 3x3/2 stem of 32, the seventeen inverted residual blocks (1x1 expansion
  x6, 3x3 depthwise, 1x1 projection; channels 16, 24, 32, 64, 96, 160, 320), a 1x1 to 1280,
  dropout 0.2, a linear classifier; BatchNorm + ReLU6 after every convolution but the projections.

* :func:`small_resnet`: a 3x3 stem of 16, four BasicBlocks without BatchNorm (16, 32, 64, 128
  channels, the last three strided, their shortcuts 1x1/2 convolutions), biases, global average
  pool, a linear classifier: issue 28's network for training in Relax (CIFAR-sized images).

They take NCHW images of any size the strides allow and ``classes`` outputs; their weights are
initialised as torchvision initialises them (He normal for convolutions, BatchNorm 1 / 0).
"""

from __future__ import annotations

from torch import nn


__all__ = ["NETS", "mobilenet_v2", "resnet18", "small_resnet"]


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, relu6: bool | None = None) -> list[nn.Module]:
    layers = [nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return layers + ([nn.ReLU6(inplace=True)] if relu6 else [])


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with BatchNorm, ReLU between, the shortcut added before the last ReLU."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1, self.bn1 = _conv_bn(cin, cout, 3, stride)
        self.relu = nn.ReLU(inplace=True)
        self.conv2, self.bn2 = _conv_bn(cout, cout, 3)
        self.downsample = nn.Sequential(*_conv_bn(cin, cout, 1, stride)) if stride != 1 or cin != cout else None

    def forward(self, x):
        shortcut = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(y)) + shortcut)


class ResNet18(nn.Module):
    def __init__(self, classes: int = 1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            stages.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, classes)
        _init(self)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x).flatten(1))


class InvertedResidual(nn.Module):
    """1x1 expansion (when ``expand`` > 1), 3x3 depthwise (``stride``), 1x1 linear projection; the
    input added where shapes allow."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        layers = _conv_bn(cin, hidden, 1, relu6=True) if expand != 1 else []
        layers += _conv_bn(hidden, hidden, 3, stride, groups=hidden, relu6=True) + _conv_bn(hidden, cout, 1)
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.conv(x) if self.residual else self.conv(x)


MOBILENET_V2_BLOCKS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))
"""(expansion, channels, blocks, first block's stride), torchvision's table."""


class MobileNetV2(nn.Module):
    def __init__(self, classes: int = 1000):
        super().__init__()
        layers, cin = _conv_bn(3, 32, 3, 2, relu6=True), 32
        for expand, cout, blocks, stride in MOBILENET_V2_BLOCKS:
            for i in range(blocks):
                layers.append(InvertedResidual(cin, cout, stride if i == 0 else 1, expand))
                cin = cout
        self.features = nn.Sequential(*layers, *_conv_bn(cin, 1280, 1, relu6=True))
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, classes))
        _init(self)

    def forward(self, x):
        return self.classifier(self.features(x).mean((2, 3)))


class PlainBlock(nn.Module):
    """A BasicBlock without BatchNorm: 3x3 (bias) - ReLU - 3x3 (bias), the shortcut (a 1x1 convolution
    where the shape changes) added before the last ReLU."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1)
        self.relu = nn.ReLU()
        self.downsample = nn.Conv2d(cin, cout, 1, stride) if stride != 1 or cin != cout else None

    def forward(self, x):
        shortcut = x if self.downsample is None else self.downsample(x)
        return self.relu(self.conv2(self.relu(self.conv1(x))) + shortcut)


class SmallResNet(nn.Module):
    """See :func:`small_resnet`."""

    def __init__(self, classes: int = 10, widths=(16, 32, 64, 128)):
        super().__init__()
        self.stem = nn.Conv2d(3, widths[0], 3, 1, 1)
        self.relu = nn.ReLU()
        blocks, cin = [], widths[0]
        for i, cout in enumerate(widths):
            blocks.append(PlainBlock(cin, cout, 1 if i == 0 else 2))
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)
        _init(self)

    def forward(self, x):
        return self.fc(self.blocks(self.relu(self.stem(x))).mean((2, 3)))


def _init(model: nn.Module):
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


def resnet18(classes: int = 1000) -> ResNet18:
    """torchvision's ResNet-18 (``nn.Conv2d`` layers)."""
    return ResNet18(classes)


def mobilenet_v2(classes: int = 1000) -> MobileNetV2:
    """torchvision's MobileNetV2 (``nn.Conv2d`` layers)."""
    return MobileNetV2(classes)


NETS = {"resnet18": resnet18, "mobilenet_v2": mobilenet_v2}


def small_resnet(classes: int = 10) -> SmallResNet:
    """Issue 28's ResNet: 3x3 stem, four BasicBlocks 16/32/64/128 wide without BatchNorm (see the module docstring)."""
    return SmallResNet(classes)
