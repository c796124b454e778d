"""LeNet-5 (LeCun et al. 1998), as the calibration literature trains it (Guo et al. 2017, ICML).

Two stages of a 5×5 valid convolution, ReLU and 2×2 max-pooling (6 then 16 channels), then fully connected
layers 16·5·5 → 120 → 84 with ReLU; the 84 units are the features h = f_θ(x) and ``head`` maps them to the K
logits. This is Guo et al.'s LeNet-5 as Kängsepp's replication of their paper trains it (``NN_calibration``,
``lenet5_c10.py``, from BIGBALLON's ``cifar-10-cnn``): ReLU and max-pooling where LeCun had scaled tanh and
trainable subsampling, He-normal weights (``kaiming_normal_`` with fan-in) and zero biases. That replication also
puts a BatchNorm after each stage; it is left out here, as in LeCun's network and the common PyTorch LeNet-5.

The network is built for 32×32 inputs (16·5·5 = 400 values reach the first fully connected layer). A smaller
input is zero-padded to 32×32, centred: for 28×28 Fashion-MNIST or MNIST this is LeCun's padding of 2 (the
first convolution of a 28×28 image padded by 2), which is how LeNet-5 saw MNIST's digits in a 32×32 field.
A larger input raises a ``ValueError``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional

from calib.models import MODELS
from calib.models._base import CalibModel
from calib.models._checks import check_positive_int

__all__ = ["INPUT_SIDE", "NUM_FEATURES", "LeNet5", "lenet5"]

INPUT_SIDE = 32
"""The side of the input LeNet-5 is built for; smaller inputs are zero-padded to it."""
NUM_FEATURES = 84
"""Width of the penultimate fully connected layer, the features the head (and MaC-Cal's) reads."""


class LeNet5(CalibModel):
    """conv5×5(in→6)-ReLU-maxpool2, conv5×5(6→16)-ReLU-maxpool2, fc 400→120-ReLU, fc 120→84-ReLU; head 84→K.

    ``features`` pads an input smaller than 32×32 with zeros to 32×32 (28×28: 2 pixels a side).
    """

    def __init__(self, num_classes: int, in_channels: int = 3) -> None:
        check_positive_int("num_classes", num_classes)
        check_positive_int("in_channels", in_channels)
        super().__init__(num_features=NUM_FEATURES, num_classes=num_classes)
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, 6, kernel_size=5),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, kernel_size=5),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(16 * 5 * 5, 120),
            nn.ReLU(inplace=True),
            nn.Linear(120, NUM_FEATURES),
            nn.ReLU(inplace=True),
        )
        for module in self.modules():
            if isinstance(module, nn.Conv2d | nn.Linear):
                nn.init.kaiming_normal_(module.weight, mode="fan_in", nonlinearity="relu")
                nn.init.zeros_(module.bias)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The 84 penultimate activations, shape (N, 84)."""
        height, width = x.shape[-2:]
        if height > INPUT_SIDE or width > INPUT_SIDE:
            raise ValueError(f"lenet5 takes inputs of at most {INPUT_SIDE}×{INPUT_SIDE} pixels (smaller ones are "
                             f"zero-padded to it), got {height}×{width}.")
        if (height, width) != (INPUT_SIDE, INPUT_SIDE):
            top, left = (INPUT_SIDE - height) // 2, (INPUT_SIDE - width) // 2
            x = functional.pad(x, (left, INPUT_SIDE - width - left, top, INPUT_SIDE - height - top))
        return self.body(x)


@MODELS.register("lenet5")
def lenet5(num_classes: int, in_channels: int = 3) -> LeNet5:
    """LeNet-5 for 32×32 inputs (CIFAR: ``in_channels=3``), or 28×28 ones padded to 32×32 (Fashion-MNIST: 1)."""
    return LeNet5(num_classes=num_classes, in_channels=in_channels)
