"""``lltm.LLTM``: drop-in replacement for the tutorial's module."""

from __future__ import annotations

from torch import Tensor

from . import reference
from .functional import lltm_cell


class LLTM(reference.LLTM):
    """The LLTM cell as an ``nn.Module``, running the fused operator.

    It is the tutorial's module (:class:`lltm.reference.LLTM`) with its
    constructor, parameters (``weights``: ``(3 * state_size, input_features +
    state_size)``, ``bias``: ``(3 * state_size,)``), initialisation and call
    convention, so its state_dicts load unchanged; only ``forward`` differs::

        new_h, new_cell = rnn(input, (old_h, old_cell))
    """

    def forward(self, input: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        old_h, old_cell = state
        return lltm_cell(input, self.weights, self.bias, old_h, old_cell)

    def extra_repr(self) -> str:
        return f"input_features={self.input_features}, state_size={self.state_size}"
