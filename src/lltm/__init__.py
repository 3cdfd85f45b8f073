"""lltm: the LLTM recurrent cell as a fused, stable-ABI PyTorch operator.

>>> import torch, lltm
>>> rnn = lltm.LLTM(input_features=32, state_size=128)
>>> x, h, c = torch.randn(16, 32), torch.randn(16, 128), torch.randn(16, 128)
>>> new_h, new_c = rnn(x, (h, c))
"""

from __future__ import annotations

# lltm._C loads lltm's library first (a damaged one never: lltm/_native.py);
# _backends loads the CUDA plugin when usable; ops registers the rest.
from . import _C, _backends, ops, reference  # noqa: F401
from ._version import __version__
from .functional import lltm_cell, lltm_sequence
from .module import LLTM, LLTMSequence

__all__ = [
    "LLTM",
    "LLTMSequence",
    "__version__",
    "lltm_cell",
    "lltm_sequence",
    "ops",
    "reference",
]
