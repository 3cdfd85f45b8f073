"""The exception lltm documents for an error its kernels raised, read from the error's text.

Only the text of a C++ exception crosses torch's stable ABI: through torch
2.14 a kernel's argument error reaches Python as ``ValueError``, from 2.15 as
``RuntimeError``. The kernels therefore write the type they mean into the
message, in the one form csrc/lltm_errors.h defines, and every Python entry
to them passes what they raise through :func:`documented`:

* ``lltm: [ValueError] <message>``: ``ValueError("lltm: <message>")``;
* ``lltm: ... failed: ...`` naming a CUDA out-of-memory:
  ``torch.OutOfMemoryError``, which tools that shrink a batch on memory
  pressure catch;
* anything else, lltm's own failures inside torch and every error lltm did
  not raise (a saved-tensor hook's, a tensor subclass's): None, and the
  caller re-raises it untouched, with its type, message and cause.
"""

from __future__ import annotations

import re
from typing import NoReturn

import torch

# csrc/lltm_errors.h's kArgumentErrorPrefix, with the type it names.
_TAGGED = re.compile(r"lltm: \[(ValueError|TypeError)\] ")
_TYPES: dict[str, type[Exception]] = {"ValueError": ValueError, "TypeError": TypeError}


def documented(error: BaseException) -> Exception | None:
    """The exception lltm documents for ``error``, or None to raise ``error`` as it is.

    :func:`reraise` is how every entry to the kernels uses it.
    """
    if isinstance(error, torch.OutOfMemoryError):
        return None
    message = str(error)
    tagged = _TAGGED.match(message)
    if tagged is not None:
        return _TYPES[tagged[1]]("lltm: " + message[tagged.end() :])
    if (
        isinstance(error, RuntimeError)
        and message.startswith("lltm: ")
        and "out of memory" in message
    ):
        return torch.OutOfMemoryError(message)
    return None


def reraise(error: BaseException) -> NoReturn:
    """Raises what :func:`documented` makes of ``error``, or ``error`` itself, untouched.

    For ``except (RuntimeError, ValueError) as error: reraise(error)`` around
    a call into the kernels. The documented exception replaces the kernel's
    (``from None``: the kernel's text is all it said); any other keeps its
    type, message, cause and context.
    """
    converted = documented(error)
    if converted is None:
        raise error
    raise converted from None


def from_message(message: str) -> Exception:
    """The exception for an error message a library's C function returned (lltm/_native.py)."""
    return documented(RuntimeError(message)) or RuntimeError(message)
