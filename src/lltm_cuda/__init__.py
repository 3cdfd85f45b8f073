"""CUDA kernels for lltm, shipped as ``lltm-cuda<major>`` (``pip install 'lltm[cuda]'``).

There is nothing to call here: ``import lltm`` imports this package when it
matches torch's CUDA version, and importing it registers fused CUDA kernels
for every ``torch.ops.lltm.*`` operator. ``python -m lltm info`` tells whether
they are active.
"""

from __future__ import annotations

import lltm.ops  # noqa: F401  (declares the op schemas these kernels implement)
from lltm import _backends

# Imported directly (not by lltm), a damaged library is still never loaded.
_damage = _backends.plugin_damage(__name__)
if _damage:
    raise ImportError(
        f"{__name__} is damaged ({_damage}): "
        f"pip install --force-reinstall --no-deps '{__name__.replace('_', '-')}'"
    )

from . import _C  # noqa: E402

__version__: str = _C.lltm_version
"""The lltm version these kernels were built from; lltm requires it to equal its own."""

cuda_version: str = _C.cuda_version
"""CUDA runtime version the kernels were compiled with, e.g. ``"13.0"``."""

__all__ = ["__version__", "cuda_version"]
