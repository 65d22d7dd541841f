"""ResNet v1 as the ResNet-50 article trained it: the bottleneck down-samples in its 3x3
convolution (torchvision's layout, parameter names included), and the last BatchNorm gamma of
every residual block starts at zero, so each block starts as the identity (Goyal et al. 2017).

``resnet50()`` is the article's network (25,557,032 parameters for 1,000 classes);
``small_resnet()`` is a narrow, shallow one with a 3x3 stem for tiny images on a CPU.
"""

from __future__ import annotations

from torch import nn


def _conv3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int = 1,
                 downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1, self.bn1 = _conv3(cin, width, stride), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = _conv3(width, width), nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def last_bn(self) -> nn.BatchNorm2d:
        return self.bn2

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + identity)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carries the stride: "v1" as in the article), 1x1 expand."""

    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1,
                 downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2, self.bn2 = _conv3(width, width, stride), nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, width * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(width * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def last_bn(self) -> nn.BatchNorm2d:
        return self.bn3

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + identity)


class ResNet(nn.Module):
    """A ResNet of ``block`` stages; ``small_stem`` uses one 3x3 convolution and no max-pool."""

    def __init__(self, block: type[BasicBlock] | type[Bottleneck], layers: list[int],
                 num_classes: int = 1000, width: int = 64, small_stem: bool = False,
                 zero_init_residual: bool = True) -> None:
        super().__init__()
        self.inplanes = width
        if small_stem:
            self.conv1 = _conv3(3, width)
            self.maxpool: nn.Module = nn.Identity()
        else:
            self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
            self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        stages = []
        for i, blocks in enumerate(layers):
            stages.append(self._stage(block, width * 2**i, blocks, stride=1 if i == 0 else 2))
        self.layer1, self.layer2, self.layer3, self.layer4 = (stages + [nn.Identity()] * 4)[:4]
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(self.inplanes, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, (BasicBlock, Bottleneck)):
                    nn.init.zeros_(m.last_bn().weight)

    def _stage(self, block, width: int, blocks: int, stride: int) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != width * block.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, width * block.expansion, 1, stride=stride, bias=False),
                nn.BatchNorm2d(width * block.expansion))
        layers = [block(self.inplanes, width, stride, downsample)]
        self.inplanes = width * block.expansion
        layers += [block(self.inplanes, width) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x).flatten(1))


def resnet50(num_classes: int = 1000, zero_init_residual: bool = True) -> ResNet:
    """ResNet-50 v1 as in the article: torchvision's layout and parameter names (the
    bottleneck down-samples in its 3x3 convolution), 25,557,032 parameters for 1000 classes.

    Args:
        num_classes: Outputs of the last layer.
        zero_init_residual: Initialise the last BatchNorm gamma of every residual block to 0.
    """
    return ResNet(Bottleneck, [3, 4, 6, 3], num_classes, zero_init_residual=zero_init_residual)


def small_resnet(num_classes: int = 10, width: int = 16, layers: tuple[int, ...] = (1, 1, 1),
                 zero_init_residual: bool = True) -> ResNet:
    """Basic blocks with a 3x3 stem, for small images on a CPU.

    Args:
        num_classes: Outputs of the last layer.
        width: Channels of the first stage (doubling per stage).
        layers: Basic blocks per stage.
        zero_init_residual: Initialise the last BatchNorm gamma of every residual block to 0.
    """
    return ResNet(BasicBlock, list(layers), num_classes, width=width, small_stem=True,
                  zero_init_residual=zero_init_residual)


MODELS = {"resnet50": resnet50, "small-resnet": small_resnet}
