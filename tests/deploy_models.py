"""Models holding lltm as a deployed model holds them, with seeded inputs:
shared by test_decompositions.py, test_onnx.py and test_executorch.py.

Each case is every public way in: the cell alone and stepped in a Python loop,
``LLTMSequence`` with layers, both directions, ``batch_first``, an unbatched
input, with and without an initial state and a bias, and the functional forms.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.export import Dim

import lltm

FEATURES, STATE = 4, 6


class Cell(torch.nn.Module):
    """One step of lltm.LLTM between plain layers."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = lltm.LLTM(FEATURES, STATE)

    def forward(self, x: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
        return self.cell(torch.tanh(x), (h, c))


class CellLoop(torch.nn.Module):
    """lltm.LLTM over the steps of a (T, B, F) input in a Python loop."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = lltm.LLTM(FEATURES, STATE)

    def forward(self, x: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        outputs = []
        for step in x.unbind(0):
            h, c = self.cell(step, (h, c))
            outputs.append(h)
        return torch.stack(outputs), h, c


class Sequence(torch.nn.Module):
    """lltm.LLTMSequence with nn.LSTM's arguments; outputs (output, h_n, c_n)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self.rnn = lltm.LLTMSequence(FEATURES, STATE, **kwargs)

    def forward(self, x: Tensor, state: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, ...]:
        output, (h_n, c_n) = self.rnn(x, state)
        return output, h_n, c_n


class Functional(torch.nn.Module):
    """lltm.lltm_cell, then lltm.lltm_sequence from the state it leaves."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = lltm.LLTM(FEATURES, STATE)
        self.sequence = lltm.LLTM(FEATURES, STATE)

    def forward(self, x: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, ...]:
        h, c = lltm.lltm_cell(x[0], self.cell.weights, self.cell.bias, h, c)
        output, (h_n, c_n) = lltm.lltm_sequence(x, self.sequence.weights, self.sequence.bias, h, c)
        return output, h_n, c_n


class Packed(torch.nn.Module):
    """LLTMSequence over a PackedSequence made from padded input and lengths: what
    the exported graph cannot express."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = lltm.LLTMSequence(4, 6)

    def forward(self, x: Tensor, lengths: Tensor) -> Tensor:
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
        _, (h_n, _) = self.rnn(packed)
        return h_n


class Case(NamedTuple):
    """A model, its inputs for (steps, batch), and dynamic_shapes for
    torch.export given Dims for the batch and the length (None where that
    size cannot be dynamic)."""

    model: Callable[[], torch.nn.Module]
    inputs: Callable[[int, int], tuple[Any, ...]]
    dynamic_shapes: Callable[[Dim, Dim | None], Any]


def _randn(*shape: int, generator: torch.Generator, dtype: torch.dtype) -> Tensor:
    return torch.randn(*shape, generator=generator, dtype=dtype)


def _state(layers: int, batch: int | None, g: torch.Generator, dtype: torch.dtype) -> tuple:
    shape = (layers, STATE) if batch is None else (layers, batch, STATE)
    return (_randn(*shape, generator=g, dtype=dtype), _randn(*shape, generator=g, dtype=dtype))


def _generator(steps: int, batch: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 * steps + batch)


def inputs_cell(steps: int, batch: int, dtype: torch.dtype = torch.float32) -> tuple:
    g = _generator(steps, batch)
    return tuple(_randn(batch, n, generator=g, dtype=dtype) for n in (FEATURES, STATE, STATE))


def inputs_steps(steps: int, batch: int, dtype: torch.dtype = torch.float32) -> tuple:
    g = _generator(steps, batch)
    return (
        _randn(steps, batch, FEATURES, generator=g, dtype=dtype),
        _randn(batch, STATE, generator=g, dtype=dtype),
        _randn(batch, STATE, generator=g, dtype=dtype),
    )


def _sequence_inputs(
    layers: int, directions: int, *, batch_first: bool = False, unbatched: bool = False
) -> Callable[..., tuple]:
    def make(steps: int, batch: int, dtype: torch.dtype = torch.float32) -> tuple:
        g = _generator(steps, batch)
        if unbatched:
            shape = (steps, FEATURES)
        else:
            shape = (batch, steps, FEATURES) if batch_first else (steps, batch, FEATURES)
        x = _randn(*shape, generator=g, dtype=dtype)
        state = _state(layers * directions, None if unbatched else batch, g, dtype)
        return (x, state)

    return make


def _no_state(make: Callable[..., tuple]) -> Callable[..., tuple]:
    return lambda steps, batch, dtype=torch.float32: make(steps, batch, dtype)[:1]


CASES: dict[str, Case] = {
    "cell": Case(Cell, inputs_cell, lambda b, t: ({0: b}, {0: b}, {0: b})),
    "cell_loop": Case(CellLoop, inputs_steps, lambda b, t: ({1: b}, {0: b}, {0: b})),
    "sequence": Case(
        lambda: Sequence(),
        _no_state(_sequence_inputs(1, 1)),
        lambda b, t: ({0: t, 1: b},),
    ),
    "sequence_layers_bidirectional_state": Case(
        lambda: Sequence(num_layers=2, bidirectional=True),
        _sequence_inputs(2, 2),
        lambda b, t: ({0: t, 1: b}, ({1: b}, {1: b})),
    ),
    "sequence_batch_first": Case(
        lambda: Sequence(num_layers=2, batch_first=True, bidirectional=True),
        _no_state(_sequence_inputs(2, 2, batch_first=True)),
        lambda b, t: ({0: b, 1: t},),
    ),
    "sequence_unbatched": Case(
        lambda: Sequence(bidirectional=True),
        _sequence_inputs(1, 2, unbatched=True),
        lambda b, t: ({0: t}, (None, None)),
    ),
    "sequence_no_bias": Case(
        lambda: Sequence(num_layers=2, bias=False),
        _no_state(_sequence_inputs(2, 1)),
        lambda b, t: ({0: t, 1: b},),
    ),
    "functional": Case(Functional, inputs_steps, lambda b, t: ({0: t, 1: b}, {0: b}, {0: b})),
}


def make(name: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return CASES[name].model().eval()


def flat(outputs: Any) -> list[Tensor]:
    """Tensors of a model's outputs, in order."""
    return [t for t in torch.utils._pytree.tree_leaves(outputs) if isinstance(t, Tensor)]


def lltm_nodes(graph_module: torch.fx.GraphModule) -> list[str]:
    """lltm operators called anywhere in a program's graphs."""
    return [
        str(node.target)
        for module in graph_module.modules()
        if isinstance(module, torch.fx.GraphModule)
        for node in module.graph.nodes
        if node.op == "call_function" and str(node.target).startswith("lltm.")
    ]
