"""ResNet- and MobileNetV3-style networks written the way torchvision writes them
(``ReLU(inplace=True)`` after BatchNorm, ``out += identity``, ``Hardswish(inplace=True)``,
depthwise convolutions, squeeze-excitation with ``Hardsigmoid``), for the model tests and
``benchmarks/models.py``: torchvision itself has no CPU build for torch 2.13 on the
package index. ``width`` scales the channel counts."""

from __future__ import annotations

import torch
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNetTiny(nn.Module):
    def __init__(self, classes=5, width=8):
        super().__init__()
        w = width
        self.conv1 = nn.Conv2d(3, w, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(w)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = BasicBlock(w, w)
        self.layer2 = BasicBlock(w, 2 * w, 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(2 * w, classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class SqueezeExcitation(nn.Module):
    def __init__(self, c, squeeze):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(c, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, c, 1)
        self.activation = nn.ReLU()
        self.scale_activation = nn.Hardsigmoid()

    def forward(self, x):
        s = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
        return s * x


def _cbn(cin, cout, k, stride=1, groups=1, act=nn.Hardswish):
    layers = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
              nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(act(inplace=True))
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    def __init__(self, cin, cexp, cout, stride, act):
        super().__init__()
        self.use_res = stride == 1 and cin == cout
        self.block = nn.Sequential(_cbn(cin, cexp, 1, act=act),
                                   _cbn(cexp, cexp, 3, stride, groups=cexp, act=act),
                                   SqueezeExcitation(cexp, max(cexp // 4, 8)),
                                   _cbn(cexp, cout, 1, act=None))

    def forward(self, x):
        out = self.block(x)
        if self.use_res:
            out += x
        return out


class MobileNetV3Tiny(nn.Module):
    def __init__(self, classes=5, width=8):
        super().__init__()
        w = width
        self.features = nn.Sequential(_cbn(3, w, 3, 2),
                                      InvertedResidual(w, 2 * w, w, 1, nn.ReLU),
                                      InvertedResidual(w, 3 * w, 2 * w, 2, nn.Hardswish),
                                      _cbn(2 * w, 4 * w, 1))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(4 * w, 3 * w), nn.Hardswish(inplace=True),
                                        nn.Dropout(0.0), nn.Linear(3 * w, classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))
