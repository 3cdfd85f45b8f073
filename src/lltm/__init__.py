"""lltm: the LLTM recurrent cell as a fused, stable-ABI PyTorch operator.

>>> import torch, lltm
>>> rnn = lltm.LLTM(input_features=32, state_size=128)
>>> x, h, c = torch.randn(16, 32), torch.randn(16, 128), torch.randn(16, 128)
>>> new_h, new_c = rnn(x, (h, c))
"""

from __future__ import annotations

import os

# lltm._C loads lltm's library first (a damaged one never: lltm/_native.py);
# _backends loads the CUDA plugin when usable; ops registers the rest.
from . import _C, _backends, ops, reference  # noqa: F401
from ._version import __version__
from .functional import lltm_cell, lltm_sequence
from .module import LLTM, LLTMSequence

cmake_prefix_path: str = os.path.join(os.path.dirname(__file__), "share", "cmake")
"""Where C++ builds find lltm's CMake package, as ``torch.utils.cmake_prefix_path`` for torch's.

Give both to CMake (``-DCMAKE_PREFIX_PATH="<torch's>;<lltm's>"``); then
``find_package(lltm)`` and ``target_link_libraries(app PRIVATE lltm::lltm)``
load lltm's operators in a C++ program (Linux). See the deployment guide.
"""

__all__ = [
    "LLTM",
    "LLTMSequence",
    "__version__",
    "cmake_prefix_path",
    "lltm_cell",
    "lltm_sequence",
    "ops",
    "reference",
]
