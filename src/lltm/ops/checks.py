"""The argument checks both operator families are built from, as the C++ kernels make them.

csrc/lltm_checks.h holds these beside the cell's own checks; each family's
contract.py builds its operators' checks from them (cell_ops/contract.py as
csrc/lltm_checks.h does, sequence_ops/contract.py as
csrc/lltm_sequence_checks.h does), message for message, so that the fake
kernels, the composite kernels and the native ones fail alike: a
``ValueError`` that starts with ``lltm:`` and names the argument and what was
expected.

:func:`check_types` is Python's alone (a schema gives the C++ kernels their
types): the entry points' first check, and the composite kernels'.
"""

from __future__ import annotations

from typing import Any, NoReturn

import torch
from torch import Tensor

FLOATING = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def shape_str(t: Tensor) -> str:
    """A shape as the messages print it: ``(3, 4)``."""
    return str(tuple(t.shape))


def fail(message: str) -> NoReturn:
    """Raises lltm's argument error: ``ValueError("lltm: <message>")``."""
    raise ValueError(f"lltm: {message}")


def check_types(input: Any, weights: Any, bias: Any, old_h: Any, old_cell: Any) -> None:
    """A ``TypeError`` naming the first of the five that is no tensor (``bias``: nor None).

    The dispatcher's own message for it is long and names no expected type.
    """
    for name, t in (
        ("input", input),
        ("weights", weights),
        ("bias", bias),
        ("old_h", old_h),
        ("old_cell", old_cell),
    ):
        if not isinstance(t, Tensor) and not (name == "bias" and t is None):
            expected = "a Tensor or None" if name == "bias" else "a Tensor"
            raise TypeError(f"lltm: {name} must be {expected}, got {type(t).__name__}")


def check_supported_dtype(input: Tensor) -> None:
    """``input`` is float32, float64, float16 or bfloat16."""
    if input.dtype not in FLOATING:
        fail(
            f"input has dtype {input.dtype}; expected torch.float32, torch.float64, "
            "torch.float16 or torch.bfloat16"
        )


def check_same(first: Tensor, first_name: str, t: Tensor, name: str) -> None:
    """``t`` has the dtype and device of ``first``."""
    if t.dtype != first.dtype:
        fail(
            f"{name} has dtype {t.dtype} but {first_name} has {first.dtype}; "
            "all arguments must share one floating dtype"
        )
    if t.device != first.device:
        fail(f"{name} is on another device than {first_name}; all arguments must be on one device")


def check_matrix(t: Tensor, name: str, rows: Any, cols: Any, expected: str) -> None:
    """``t`` is a ``(rows, cols)`` matrix; ``expected`` spells the shape, e.g. ``(batch, state_size)``."""
    if t.dim() != 2 or t.shape[0] != rows or t.shape[1] != cols:
        fail(f"{name} must have shape {expected} = ({rows}, {cols}), got {shape_str(t)}")


def check_weights(weights: Tensor, state: Any, features: Any) -> None:
    """weights: (3 * state_size, state_size + input_features).

    state_size comes from old_h and input_features from input. The message
    names the argument that disagrees as a caller reads it (see check_weights
    in lltm_checks.h).
    """
    if (
        weights.dim() == 2
        and weights.shape[0] == 3 * state
        and weights.shape[1] == state + features
    ):
        return
    layout = "(3 * state_size, state_size + input_features)"
    if (
        weights.dim() == 2
        and weights.shape[0] % 3 == 0
        and weights.shape[1] >= weights.shape[0] // 3
    ):
        weights_state = weights.shape[0] // 3
        weights_features = weights.shape[1] - weights_state
        if weights_state != state:
            fail(
                f"old_h has state_size = {state}; the weights expect {weights_state} "
                f"(weights have shape {shape_str(weights)} = {layout})"
            )
        fail(
            f"input has input_features = {features}; the weights expect {weights_features} "
            f"(weights have shape {shape_str(weights)} = {layout} with state_size = {state})"
        )
    check_matrix(weights, "weights", 3 * state, state + features, layout)


def check_bias(bias: Tensor | None, state: Any) -> None:
    """bias: None, or (3 * state_size,) (dtype and device checked before)."""
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != 3 * state):
        fail(f"bias must have shape (3 * state_size,) = ({3 * state},), got {shape_str(bias)}")


def check_output_mask(output_mask: Any) -> tuple[bool, bool, bool, bool, bool]:
    """A backward operator's output_mask: which of the five arguments get a gradient.

    The five are (input, weights, bias, old_h, old_cell).
    """
    if len(output_mask) != 5:
        fail(
            "output_mask must have 5 entries (input, weights, bias, old_h, old_cell), "
            f"got {len(output_mask)}"
        )
    return tuple(bool(want) for want in output_mask)  # type: ignore[return-value]
