"""``lltm.LLTM``: drop-in replacement for the tutorial's module."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .functional import lltm_cell


class LLTM(torch.nn.Module):
    """The LLTM cell as an ``nn.Module``.

    Same constructor, parameters (``weights``: ``(3 * state_size,
    input_features + state_size)``, ``bias``: ``(3 * state_size,)``),
    initialisation and call convention as the module of PyTorch's C++/CUDA
    extension tutorial, so its state_dicts load unchanged::

        new_h, new_cell = rnn(input, (old_h, old_cell))
    """

    def __init__(self, input_features: int, state_size: int) -> None:
        super().__init__()
        self.input_features = input_features
        self.state_size = state_size
        self.weights = torch.nn.Parameter(torch.empty(3 * state_size, input_features + state_size))
        self.bias = torch.nn.Parameter(torch.empty(3 * state_size))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.state_size)
        for weight in self.parameters():
            weight.data.uniform_(-stdv, +stdv)

    def forward(self, input: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        old_h, old_cell = state
        return lltm_cell(input, self.weights, self.bias, old_h, old_cell)

    def extra_repr(self) -> str:
        return f"input_features={self.input_features}, state_size={self.state_size}"
