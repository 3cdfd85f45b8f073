"""lltm: the LLTM recurrent cell as a fused, stable-ABI PyTorch operator.

>>> import torch, lltm
>>> rnn = lltm.LLTM(input_features=32, state_size=128)
>>> x, h, c = torch.randn(16, 32), torch.randn(16, 128), torch.randn(16, 128)
>>> new_h, new_c = rnn(x, (h, c))
"""

from __future__ import annotations

from pathlib import Path as _Path

from . import _integrity
from ._version import __version__

# Before lltm's library is loaded (lltm/_C.py): a damaged copy could crash the
# interpreter.
_library = _integrity.library_file(_Path(__file__).parent, "lltm_cpu")
_damage = _library and _integrity.damage(_library, _Path(__file__).parent, "lltm")
if _damage:
    raise ImportError(
        f"lltm: the installed library {_library} is damaged ({_damage}). Reinstall it: "
        f"pip install --force-reinstall --no-deps 'lltm=={__version__}'"
    )

# _backends loads the CUDA plugin when usable and registers the fallback kernel.
from . import _backends, ops, reference  # noqa: E402,F401
from .functional import lltm_cell, lltm_sequence  # noqa: E402
from .module import LLTM, LLTMSequence  # noqa: E402

__all__ = [
    "LLTM",
    "LLTMSequence",
    "__version__",
    "lltm_cell",
    "lltm_sequence",
    "ops",
    "reference",
]
