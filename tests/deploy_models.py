"""Models holding lltm as a deployed model holds them, with seeded inputs:
shared by test_decompositions.py, test_onnx.py, test_executorch.py and
test_deployment.py.

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
        self.rnn = lltm.LLTMSequence(FEATURES, STATE)

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


# --- Every form side by side -------------------------------------------------------------


FORMS = (
    "one_layer",
    "one_layer_state",
    "layers_bidirectional_state",
    "layers_batch_first",
    "unbatched_bidirectional",
    "unbatched_state",
    "cell_loop",
)
"""The forms of Zoo: a layer without and with an initial state, two layers
in both directions from one, two batch_first layers, unbatched in both
directions and from a state, the cell stepped in a Python loop."""


class Zoo(torch.nn.Module):
    """Forms a deployed model holds the recurrence in (FORMS), side by side in
    one program (exporting and lowering are most of a deployment test's time):
    lltm's modules, or, as the control, torch's with the same arguments
    (nn.LSTM, nn.LSTMCell).

    Inputs (see :func:`zoo_inputs`): ``x`` (T, B, F), the same steps batch
    first, and an initial state ``h_0``, ``c_0`` (4, B, S); outputs, each
    form's (output, h_n, c_n) in the order of FORMS.
    """

    def __init__(self, kind: str, forms: tuple[str, ...]) -> None:
        super().__init__()

        def rnn(**kwargs: Any) -> torch.nn.Module:
            if kind == "lltm":
                return lltm.LLTMSequence(FEATURES, STATE, **kwargs)
            return torch.nn.LSTM(FEATURES, STATE, **kwargs)

        made = {
            "one_layer": rnn,
            "one_layer_state": rnn,
            "layers_bidirectional_state": lambda: rnn(num_layers=2, bidirectional=True),
            "layers_batch_first": lambda: rnn(num_layers=2, batch_first=True),
            "unbatched_bidirectional": lambda: rnn(bidirectional=True),
            "unbatched_state": rnn,
            "cell_loop": lambda: (lltm.LLTM if kind == "lltm" else torch.nn.LSTMCell)(
                FEATURES, STATE
            ),
        }
        self.forms = [form for form in FORMS if form in forms]
        self.models = torch.nn.ModuleDict({form: made[form]() for form in self.forms})

    def forward(self, x: Tensor, x_batch_first: Tensor, h_0: Tensor, c_0: Tensor) -> list[Tensor]:
        outputs: list[Tensor] = []
        for form in self.forms:
            model = self.models[form]
            if form == "cell_loop":
                h, c = h_0[0], c_0[0]
                steps = []
                for step in x.unbind(0):
                    h, c = model(step, (h, c))
                    steps.append(h)
                outputs.extend((torch.stack(steps), h, c))
                continue
            output, (h_n, c_n) = model(*_arguments(form, x, x_batch_first, h_0, c_0))
            outputs.extend((output, h_n, c_n))
        return outputs


def _arguments(form: str, x: Tensor, x_batch_first: Tensor, h_0: Tensor, c_0: Tensor) -> tuple:
    """What Zoo passes the model of ``form``."""
    if form == "one_layer":
        return (x,)
    if form == "one_layer_state":
        return (x, (h_0[:1], c_0[:1]))
    if form == "layers_bidirectional_state":
        return (x, (h_0, c_0))
    if form == "layers_batch_first":
        return (x_batch_first,)
    if form == "unbatched_bidirectional":
        return (x[:, 0],)
    return (x[:, 0], (h_0[:1, 0], c_0[:1, 0]))  # unbatched_state


def zoo(kind: str, forms: tuple[str, ...] = FORMS, seed: int = 0) -> Zoo:
    torch.manual_seed(seed)
    return Zoo(kind, forms).eval()


def zoo_inputs(steps: int, batch: int, seed: int = 0) -> tuple[Tensor, ...]:
    g = torch.Generator().manual_seed(seed + 1000 * steps + batch)
    x = torch.randn(steps, batch, FEATURES, generator=g)
    x_batch_first = torch.randn(batch, steps, FEATURES, generator=g)
    state = [torch.randn(4, batch, STATE, generator=g) for _ in range(2)]
    return (x, x_batch_first, *state)


def zoo_shapes(batch: Dim | None, steps: Dim | None) -> tuple[dict[int, Dim], ...]:
    """dynamic_shapes of zoo_inputs for the dynamic sizes given (None: fixed)."""
    x = {k: d for k, d in ((0, steps), (1, batch)) if d is not None}
    x_batch_first = {k: d for k, d in ((0, batch), (1, steps)) if d is not None}
    state = {1: batch} if batch is not None else {}
    return (x, x_batch_first, state, dict(state))
