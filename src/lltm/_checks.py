"""Argument checks of the lltm operators, as the C++ kernels make them.

This mirrors csrc/lltm_checks.h and csrc/lltm_sequence_checks.h message for
message: the fake kernels and the composite kernel run these, so eager,
compiled and fallback calls fail alike, with a short error naming the argument
and what was expected.
"""

from __future__ import annotations

from typing import Any, NamedTuple, NoReturn

import torch
from torch import Tensor

_FLOATING = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _shape(t: Tensor) -> str:
    return str(tuple(t.shape))


def _fail(message: str) -> NoReturn:
    raise ValueError(f"lltm: {message}")


def _check_same(first: Tensor, first_name: str, t: Tensor, name: str) -> None:
    if t.dtype != first.dtype:
        _fail(
            f"{name} has dtype {t.dtype} but {first_name} has {first.dtype}; "
            "all arguments must share one floating dtype"
        )
    if t.device != first.device:
        _fail(f"{name} is on another device than {first_name}; all arguments must be on one device")


def _check_matrix(t: Tensor, name: str, rows: Any, cols: Any, expected: str) -> None:
    if t.dim() != 2 or t.shape[0] != rows or t.shape[1] != cols:
        _fail(f"{name} must have shape {expected} = ({rows}, {cols}), got {_shape(t)}")


def _check_weights(weights: Tensor, state: Any, features: Any) -> None:
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
            _fail(
                f"old_h has state_size = {state}; the weights expect {weights_state} "
                f"(weights have shape {_shape(weights)} = {layout})"
            )
        _fail(
            f"input has input_features = {features}; the weights expect {weights_features} "
            f"(weights have shape {_shape(weights)} = {layout} with state_size = {state})"
        )
    _check_matrix(weights, "weights", 3 * state, state + features, layout)


def _check_supported_dtype(input: Tensor) -> None:
    if input.dtype not in _FLOATING:
        _fail(
            f"input has dtype {input.dtype}; expected torch.float32, torch.float64, "
            "torch.float16 or torch.bfloat16"
        )


def _check_bias(bias: Tensor | None, state: Any) -> None:
    """bias: None, or (3 * state_size,) (dtype and device checked before)."""
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != 3 * state):
        _fail(f"bias must have shape (3 * state_size,) = ({3 * state},), got {_shape(bias)}")


def check_forward_args(
    input: Tensor, weights: Tensor, bias: Tensor | None, old_h: Tensor, old_cell: Tensor
) -> tuple[Any, Any, Any]:
    """Validates forward's arguments like the C++ kernels do; returns (B, F, S)."""
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
    _check_supported_dtype(input)
    for name, t in (("weights", weights), ("bias", bias), ("old_h", old_h), ("old_cell", old_cell)):
        if t is not None:
            _check_same(input, "input", t, name)
    if input.dim() != 2:
        _fail(f"input must be 2-D (batch, input_features), got shape {_shape(input)}")
    if old_h.dim() != 2:
        _fail(f"old_h must be 2-D (batch, state_size), got shape {_shape(old_h)}")
    batch, features, state = input.shape[0], input.shape[1], old_h.shape[1]
    _check_matrix(old_h, "old_h", batch, state, "(batch, state_size)")
    _check_matrix(old_cell, "old_cell", batch, state, "(batch, state_size)")
    _check_weights(weights, state, features)
    _check_bias(bias, state)
    return batch, features, state


def check_backward_args(
    grad_h: Tensor,
    grad_cell: Tensor,
    new_cell: Tensor,
    gates: Tensor,
    input: Tensor,
    old_h: Tensor,
    weights: Tensor,
) -> tuple[Any, Any, Any]:
    """Validates backward's arguments like the C++ kernels do; returns (B, F, S)."""
    _check_supported_dtype(input)
    others = {
        "grad_h": grad_h,
        "grad_cell": grad_cell,
        "new_cell": new_cell,
        "gates": gates,
        "old_h": old_h,
        "weights": weights,
    }
    for name, t in others.items():
        _check_same(input, "input", t, name)
    if input.dim() != 2 or old_h.dim() != 2:
        _fail(f"input and old_h must be 2-D, got shapes {_shape(input)} and {_shape(old_h)}")
    batch, features, state = input.shape[0], input.shape[1], old_h.shape[1]
    for name in ("old_h", "grad_h", "grad_cell", "new_cell"):
        _check_matrix(others[name], name, batch, state, "(batch, state_size)")
    _check_matrix(gates, "gates", batch, 3 * state, "(batch, 3 * state_size)")
    _check_weights(weights, state, features)
    return batch, features, state


def check_output_mask(output_mask: Any) -> tuple[bool, bool, bool, bool, bool]:
    """lltm::backward's output_mask: which of the five arguments get a gradient.

    The five are (input, weights, bias, old_h, old_cell).
    """
    if len(output_mask) != 5:
        _fail(
            "output_mask must have 5 entries (input, weights, bias, old_h, old_cell), "
            f"got {len(output_mask)}"
        )
    return tuple(bool(want) for want in output_mask)  # type: ignore[return-value]


# --- Sequences ------------------------------------------------------------------


class SequenceBackwardArgs(NamedTuple):
    """The arguments of lltm::sequence_backward before ``output_mask``.

    All of lltm::sequence_gate_grads'. ``SequenceBackwardArgs(*args[:11])``
    names them: the one place that spells them out.
    """

    grad_output: Tensor | None
    grad_h_n: Tensor | None
    grad_c_n: Tensor | None
    output: Tensor
    gates: Tensor
    cells: Tensor
    input: Tensor
    weights: Tensor
    old_h: Tensor
    batch_sizes: Tensor | None
    reverse: bool


class SequenceSizes(NamedTuple):
    """The sizes of a sequence call.

    ``steps`` steps over ``batch`` sequences, ``rows`` rows of input in all
    (steps * batch unless packed).
    """

    steps: Any
    batch: Any
    rows: Any
    features: Any
    state: Any
    packed: bool


def _check_sequence_layout(t: Tensor, name: str, n: SequenceSizes, width: Any, what: str) -> None:
    if n.packed:
        if t.dim() != 2 or t.shape[0] != n.rows or t.shape[1] != width:
            _fail(
                f"{name} must have shape (sum(batch_sizes), {what}) = ({n.rows}, {width}), "
                f"got {_shape(t)}"
            )
    elif t.dim() != 3 or tuple(t.shape) != (n.steps, n.batch, width):
        _fail(
            f"{name} must have shape (seq_len, batch, {what}) = ({n.steps}, {n.batch}, {width}), "
            f"got {_shape(t)}"
        )


def _check_batch_sizes_tensor(batch_sizes: Tensor) -> None:
    if (
        batch_sizes.dim() != 1
        or batch_sizes.dtype != torch.int64
        or batch_sizes.device.type != "cpu"
    ):
        where = "" if batch_sizes.device.type == "cpu" else " on another device"
        _fail(
            "batch_sizes must be a 1-D int64 tensor on the CPU, as a PackedSequence's; got shape "
            f"{_shape(batch_sizes)} of {batch_sizes.dtype}{where}"
        )


def _sequence_sizes(input: Tensor, old_h: Tensor, batch_sizes: Tensor | None) -> SequenceSizes:
    if old_h.dim() != 2:
        _fail(f"old_h must be 2-D (batch, state_size), got shape {_shape(old_h)}")
    state = old_h.shape[1]
    if batch_sizes is not None:
        _check_batch_sizes_tensor(batch_sizes)
        if input.dim() != 2:
            _fail(
                "input must be 2-D (sum(batch_sizes), input_features) when batch_sizes is "
                f"given, got shape {_shape(input)}"
            )
        return SequenceSizes(
            batch_sizes.shape[0], old_h.shape[0], input.shape[0], input.shape[1], state, True
        )
    if input.dim() != 3:
        _fail(f"input must be 3-D (seq_len, batch, input_features), got shape {_shape(input)}")
    steps, batch, features = input.shape
    return SequenceSizes(steps, batch, steps * batch, features, state, False)


def check_sequence_args(
    input: Tensor,
    weights: Tensor,
    bias: Tensor | None,
    old_h: Tensor,
    old_cell: Tensor,
    batch_sizes: Tensor | None,
) -> SequenceSizes:
    """Validates lltm::sequence_forward's arguments like the C++ kernels do."""
    _check_supported_dtype(input)
    for name, t in (("weights", weights), ("bias", bias), ("old_h", old_h), ("old_cell", old_cell)):
        if t is not None:
            _check_same(input, "input", t, name)
    n = _sequence_sizes(input, old_h, batch_sizes)
    _check_matrix(old_h, "old_h", n.batch, n.state, "(batch, state_size)")
    _check_matrix(old_cell, "old_cell", n.batch, n.state, "(batch, state_size)")
    _check_weights(weights, n.state, n.features)
    _check_bias(bias, n.state)
    return n


def check_sequence_backward_args(args: SequenceBackwardArgs) -> SequenceSizes:
    """Validates lltm::sequence_backward's arguments like the C++ kernels do."""
    grad_output, grad_h_n, grad_c_n, output, gates, cells, input, weights, old_h = args[:9]
    batch_sizes = args.batch_sizes
    _check_supported_dtype(input)
    for name, t in (
        ("output", output),
        ("gates", gates),
        ("cells", cells),
        ("weights", weights),
        ("old_h", old_h),
        ("grad_output", grad_output),
        ("grad_h_n", grad_h_n),
        ("grad_c_n", grad_c_n),
    ):
        if t is not None:
            _check_same(input, "input", t, name)
    n = _sequence_sizes(input, old_h, batch_sizes)
    _check_matrix(old_h, "old_h", n.batch, n.state, "(batch, state_size)")
    _check_sequence_layout(input, "input", n, n.features, "input_features")
    _check_sequence_layout(output, "output", n, n.state, "state_size")
    _check_sequence_layout(cells, "cells", n, n.state, "state_size")
    _check_sequence_layout(gates, "gates", n, 3 * n.state, "3 * state_size")
    if grad_output is not None:
        _check_sequence_layout(grad_output, "grad_output", n, n.state, "state_size")
    for name, t in (("grad_h_n", grad_h_n), ("grad_c_n", grad_c_n)):
        if t is not None:
            _check_matrix(t, name, n.batch, n.state, "(batch, state_size)")
    _check_weights(weights, n.state, n.features)
    return n


def sequence_batch_sizes(batch_sizes: Tensor | None, n: SequenceSizes) -> list[int]:
    """Every step's active batch size, checked like the C++ kernels check it."""
    if batch_sizes is None:
        return [int(n.batch)] * int(n.steps)
    sizes = [int(v) for v in batch_sizes.tolist()]
    for step, size in enumerate(sizes):
        limit = n.batch if step == 0 else sizes[step - 1]
        if size < 1 or size > limit or (step == 0 and size != n.batch):
            _fail(
                "batch_sizes must be positive and non-increasing, starting at the batch of old_h "
                f"({n.batch}); got {size} at step {step}"
            )
    if sum(sizes) != n.rows:
        _fail(f"batch_sizes must sum to the rows of input ({n.rows}), got {sum(sizes)}")
    return sizes
