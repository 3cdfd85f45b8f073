"""CUDA kernels for lltm, shipped as ``lltm-cuda<major>`` (``pip install 'lltm[cuda]'``).

There is nothing to call here: ``import lltm`` imports this package when it
matches torch's CUDA version, and importing it registers fused CUDA kernels
for every ``torch.ops.lltm.*`` operator. ``python -m lltm info`` tells whether
they are active.
"""

from __future__ import annotations

import lltm.ops  # noqa: F401  (declares the op schemas these kernels implement)

# A damaged library is never loaded, imported directly or by lltm
# (lltm._native.DamagedLibrary).
from . import _C

__version__: str = _C.lltm_version
"""The lltm version these kernels were built from; lltm requires it to equal its own."""

cuda_version: str = _C.cuda_version
"""CUDA runtime version the kernels were compiled with, e.g. ``"13.0"``."""

__all__ = ["__version__", "cuda_version"]
