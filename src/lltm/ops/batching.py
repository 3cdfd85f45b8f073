"""What every batching rule shares: the vmapped dimension folded into the kernels' batch.

lltm's kernels already take a batch of independent rows, so a vmapped call
whose parameters are shared (only inputs and state batched: per-sample
gradients, ``vmap`` over examples) becomes one kernel call: the vmapped
dimension is folded into the kernel's batch and unfolded from its outputs.
Folding puts the vmapped index innermost (row ``r`` of sample ``b`` becomes
row ``r * B + b``), which keeps a packed sequence packed: at every step the
active sequences of all samples are still a prefix of the batch, with ``B``
times the batch size. Where one call cannot serve (batched parameters:
ensembles), a rule makes one call per vmapped index.

Each family's vmap.py holds its operators' rules, registered from the table.
"""

from __future__ import annotations

from typing import Any, overload

import torch
from torch import Tensor

InDims = tuple[int | None, ...]
"""The vmapped dimension of each argument, None where it is not batched."""
Batched = tuple[tuple[Tensor | None, ...], tuple[int | None, ...]]
"""A rule's result: the outputs, and the vmapped dimension of each."""


@overload
def fold(t: Tensor, dim: int | None, size: int) -> Tensor: ...
@overload
def fold(t: None, dim: int | None, size: int) -> None: ...
@overload
def fold(t: Tensor | None, dim: int | None, size: int) -> Tensor | None: ...
def fold(t: Tensor | None, dim: int | None, size: int) -> Tensor | None:
    """(B at ``dim``, ..., rows, width) -> (..., rows * B, width).

    The vmapped index goes innermost; an unbatched tensor is broadcast over
    the B samples.
    """
    if t is None:
        return None
    t = t.movedim(dim, -2) if dim is not None else t.unsqueeze(-2).expand(*t.shape[:-1], size, -1)
    return t.reshape(*t.shape[:-3], t.shape[-3] * size, t.shape[-1])


def unfold(t: Tensor | None, size: int) -> tuple[Tensor | None, int | None]:
    """The inverse of :func:`fold`, with the output's vmapped dimension."""
    if t is None:
        return None, None
    return t.reshape(*t.shape[:-2], t.shape[-2] // size, size, t.shape[-1]), t.dim() - 1


def unfolded(outputs: tuple[Tensor | None, ...], size: int) -> Batched:
    """A kernel's outputs on folded arguments, unfolded: the rule's result."""
    pairs = [unfold(t, size) for t in outputs]
    return tuple(t for t, _ in pairs), tuple(d for _, d in pairs)


def per_index(op: Any, size: int, in_dims: InDims, args: tuple[Any, ...]) -> Batched:
    """One call per vmapped index, outputs stacked along dimension 0."""
    results = [
        op(
            *(
                a.select(d, k) if isinstance(d, int) else a
                for a, d in zip(args, in_dims, strict=True)
            )
        )
        for k in range(size)
    ]
    stacked = tuple(
        None if column[0] is None else torch.stack(column) for column in zip(*results, strict=True)
    )
    return stacked, tuple(None if t is None else 0 for t in stacked)


def samples_are_matrices(args: tuple[Any, ...], in_dims: InDims) -> bool:
    """Whether every batched tensor's samples have rows and columns, as folding needs.

    Where one does not, one call per sample raises the operator's own error
    naming the argument.
    """
    return all(
        not isinstance(a, Tensor) or d is None or a.dim() >= 3
        for a, d in zip(args, in_dims, strict=True)
    )


def to_front(t: Tensor, dim: int | None, size: int) -> Tensor:
    """The vmapped dimension first, broadcast where ``t`` is not batched."""
    return t.movedim(dim, 0) if dim is not None else t.expand(size, *t.shape)
