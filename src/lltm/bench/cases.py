"""What is timed: one implementation at one size, as a callable per phase.

Three kinds of case share everything but how they are built:

* cell: one step, ``new_h, new_cell = rnn(input, (old_h, old_cell))``;
* sequence: ``seq_len`` steps, ``output, (h_n, c_n) = rnn(input, (h_0, c_0))``;
* per-sample: the gradients of the parameters for each of ``batch`` samples
  (one sequence each) apart, as differentially private training and
  per-example gradient statistics need them. Only the ``step`` phase: there
  is no forward to time apart from the backward;
* overhead: one cell step at the smallest size, where the kernels do almost
  nothing and what is timed is what every call costs around them: the
  forward under ``torch.no_grad()`` (phase ``no_grad``) and the step; and
  for ``lltm-sequence`` and ``lstm``, a sequence of one step at that size.

Every LLTM implementation of a case gets the same weights (those of one
:class:`lltm.reference.LLTM`) and the same inputs. Which tensors require grad
is the configuration: the parameters always, the inputs (input, h, c) only
with ``inputs_grad`` (a recurrent network's view, where the state comes from
the previous step). The backward phase computes the gradients of exactly the
tensors that require grad, as ``.backward()`` would.
"""

from __future__ import annotations

import contextlib
import copy
import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from functools import partial
from typing import Any, cast

import torch
from torch import Tensor

from .. import reference
from ..module import LLTM, LLTMSequence
from .kinds import (
    AUTOCAST_KINDS,
    OVERHEAD,
    OVERHEAD_SEQ_LEN,
    OVERHEAD_SEQUENCES,
    PER_SAMPLE,
    Kind,
    Size,
    kind_of,
)

# --- The phases ------------------------------------------------------------------


class Case:
    """One implementation at one size.

    It has ``forward``, ``backward`` and ``step``: those of its kind's phases
    that it times.
    """

    def __init__(self, impl: str) -> None:
        self.impl = impl

    def forward(self) -> Any:
        """One forward pass."""
        raise NotImplementedError

    def backward(self) -> Any:
        """One backward pass, of a graph the forward left."""
        raise NotImplementedError

    def step(self) -> Any:
        """One training step: forward and backward."""
        raise NotImplementedError

    def no_grad(self) -> Any:
        """One forward pass under ``torch.no_grad()``."""
        raise NotImplementedError

    def phase(self, name: str) -> Callable[[], Any]:
        """The method that runs phase ``name`` (forward, backward or step)."""
        method: Callable[[], Any] = getattr(self, name)
        return method

    def saved_for_backward(self) -> tuple[int, int] | None:
        """Bytes one forward keeps for backward (see AutogradCase), or None."""
        return None


# The arithmetic a case's model and loss run in: a context entered around
# them (torch.autocast for mixed precision), or none.
Precision = Callable[[], AbstractContextManager[Any]]


class AutogradCase(Case):
    """A module called on fixed inputs, differentiated by autograd.

    ``call`` returns the outputs whose sum is the loss: (new_h, new_cell) for
    a cell, (output, h_n, c_n) for a sequence. ``loss`` says how it is
    differentiated (kinds.LOSSES): "sum" as the tutorial's benchmark does,
    ``(new_h.sum() + new_cell.sum()).backward()``, accumulating into the
    leaves' ``.grad``; "dense" with autograd handed dense ones, the gradient
    of that sum, for each output. ``inputs`` are every tensor the call reads,
    parameters included; the backward phases differentiate with respect to
    those among them that require grad, and only those. ``precision``
    is entered around the model and the loss (``torch.autocast`` for mixed
    precision, as Lightning's ``precision="bf16-mixed"`` does), never around
    the backward.
    """

    def __init__(
        self,
        impl: str,
        call: Callable[[], Sequence[Tensor]],
        inputs: Sequence[Tensor],
        loss: str = "dense",
        precision: Precision = contextlib.nullcontext,
    ) -> None:
        super().__init__(impl)
        self.call = call
        self.inputs = list(inputs)
        self.leaves = [t for t in self.inputs if t.requires_grad]
        self.loss = loss
        self._precision = precision
        self._graph: tuple[Tensor, ...] | None = None
        self._ones: tuple[Tensor, ...] | None = None
        self._summed: Tensor | None = None

    def forward(self) -> Any:
        """Calls the module."""
        with self._precision():
            return self.call()

    def no_grad(self) -> Any:
        """Calls the module under ``torch.no_grad()``."""
        with torch.no_grad(), self._precision():
            return self.call()

    def backward(self) -> Any:
        """Gradients of the leaves, from one graph kept for every backward block."""
        if self._graph is None:  # one graph, kept for every backward block
            with self._precision():
                self._graph = tuple(self.call())
                self._summed = _summed(self._graph)
            self._ones = tuple(torch.ones_like(t) for t in self._graph)
        if self.loss == "sum":
            assert self._summed is not None
            return self._summed.backward(retain_graph=True)
        return torch.autograd.grad(self._graph, self.leaves, self._ones, retain_graph=True)

    def step(self) -> Any:
        """Calls the module and differentiates its outputs' sum.

        The model and the loss run in the case's precision, the backward
        outside it, as mixed-precision training runs them.
        """
        with self._precision():
            outputs = tuple(self.call())
            summed = _summed(outputs) if self.loss == "sum" else None
        if summed is not None:
            return summed.backward()
        if self._ones is None:
            self._ones = tuple(torch.ones_like(t) for t in outputs)
        return torch.autograd.grad(outputs, self.leaves, self._ones)

    def saved_for_backward(self) -> tuple[int, int]:
        """Bytes of the distinct storages one forward saves for backward.

        In all, and beyond those of the inputs and parameters (what the graph
        alone keeps alive).
        """
        storages: dict[int, int] = {}

        def pack(t: Tensor) -> Tensor:
            storage = t.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            self.forward()
        inputs = {t.untyped_storage().data_ptr() for t in self.inputs}
        beyond = sum(n for ptr, n in storages.items() if ptr not in inputs)
        return sum(storages.values()), beyond


def _summed(outputs: Sequence[Tensor]) -> Tensor:
    """The tutorial's loss, ``new_h.sum() + new_cell.sum()``, of any number of outputs."""
    loss = outputs[0].sum()
    for output in outputs[1:]:
        loss = loss + output.sum()
    return loss


class ScopedCase(AutogradCase):
    """An AutogradCase whose every phase runs inside ``scope()``.

    A setting the implementation is made of, for the length of each call
    (cuDNN without TF32, lltm's per-step path).
    """

    def __init__(
        self,
        impl: str,
        call: Callable[[], Sequence[Tensor]],
        inputs: Sequence[Tensor],
        scope: Callable[[], AbstractContextManager[None]],
        loss: str = "dense",
        precision: Precision = contextlib.nullcontext,
    ) -> None:
        super().__init__(impl, call, inputs, loss, precision)
        self._scope = scope

    def forward(self) -> Any:
        """Calls the module, in the scope."""
        with self._scope():
            return super().forward()

    def no_grad(self) -> Any:
        """Calls the module under ``torch.no_grad()``, in the scope."""
        with self._scope():
            return super().no_grad()

    def backward(self) -> Any:
        """Gradients of the leaves, in the scope."""
        with self._scope():
            return super().backward()

    def step(self) -> Any:
        """Forward and backward, in the scope."""
        with self._scope():
            return super().step()

    def saved_for_backward(self) -> tuple[int, int]:
        """Bytes one forward saves for backward, in the scope."""
        with self._scope():
            return super().saved_for_backward()


@contextlib.contextmanager
def _without_tf32() -> Iterator[None]:
    """Run cuDNN with exact float32 products (TF32 off), as lltm computes."""
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = before


@contextlib.contextmanager
def _per_step() -> Iterator[None]:
    """Run lltm's sequence op without its persistent GPU kernels (read at every call)."""
    before = os.environ.get("LLTM_CUDA_PERSISTENT")
    os.environ["LLTM_CUDA_PERSISTENT"] = "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ["LLTM_CUDA_PERSISTENT"]
        else:
            os.environ["LLTM_CUDA_PERSISTENT"] = before


# Implementations that are another one in a scope.
SCOPES: dict[str, Callable[[], AbstractContextManager[None]]] = {
    "lstm-notf32": _without_tf32,
    "lltm-sequence-per-step": _per_step,
}


class GemmCase(Case):
    """Not an implementation: the matrix products a forward and backward cannot avoid.

    On random operands of the right shapes (their values do not matter, as long
    as they are not denormal).
    """

    def __init__(
        self,
        forward: Sequence[Callable[[], Tensor]],
        backward: Sequence[Callable[[], Tensor]],
        precision: Precision = contextlib.nullcontext,
    ) -> None:
        super().__init__("gemm")
        self._forward, self._backward = list(forward), list(backward)
        self._precision = precision

    def forward(self) -> Any:
        """The products of the forward."""
        with self._precision():
            return [product() for product in self._forward]

    def backward(self) -> Any:
        """The products of the backward."""
        with self._precision():
            return [product() for product in self._backward]

    def step(self) -> Any:
        """The products of both."""
        return self.forward(), self.backward()


class PerSampleCase(Case):
    """The parameters' gradients for a batch of samples, in one phase (step).

    ``module`` is the module differentiated, ``samples`` the inputs and
    targets, ``(batch, seq_len, features)`` and ``(batch, seq_len, state)``.
    ``gradients`` runs the step and gives its result in one layout, outside
    what is timed: parameter name -> the per-sample gradients stacked,
    ``(batch, *parameter.shape)``, or for ``lltm-batched`` the one gradient
    of the batch's mean loss, ``parameter.shape``.
    """

    def __init__(
        self,
        impl: str,
        step: Callable[[], Any],
        module: torch.nn.Module,
        samples: tuple[Tensor, Tensor],
        collect: Callable[[Any], Iterable[Tensor]],
    ) -> None:
        super().__init__(impl)
        self._step, self._collect = step, collect
        self.module, self.samples = module, samples

    def step(self) -> Any:
        """Computes the per-sample gradients."""
        return self._step()

    def gradients(self) -> dict[str, Tensor]:
        """Parameter name -> the step's gradients, in one layout (outside what is timed)."""
        names = [name for name, _ in self.module.named_parameters()]
        return dict(zip(names, self._collect(self._step()), strict=True))


# --- Building cases --------------------------------------------------------------


def make_case(
    impl: str,
    size: Size,
    device: torch.device,
    dtype: torch.dtype,
    *,
    inputs_grad: bool = False,
    seed: int = 0,
    kind: Kind | None = None,
    autocast: torch.dtype | None = None,
) -> Case:
    """``impl`` at ``size``, of ``kind``.

    By default a cell step, or a sequence when ``size.seq_len`` is set.
    With ``autocast`` (float16 or bfloat16), the model and the loss of a
    cell or sequence case run under ``torch.autocast(device.type, autocast)``
    on float32 weights and inputs (``dtype``), as mixed-precision training
    runs them; the GEMM floor's products too.
    """
    kind = kind or kind_of(size)
    if impl not in kind.implementations:
        raise ValueError(f"no {kind.name} implementation {impl!r}")
    if kind is OVERHEAD and impl in OVERHEAD_SEQUENCES:
        size = replace(size, seq_len=OVERHEAD_SEQ_LEN)
    if kind.sequences and size.seq_len is None:
        raise ValueError(f"a {kind.name} case needs a sequence length")
    if kind is PER_SAMPLE and inputs_grad:
        raise ValueError("per-sample gradients are the parameters' only")
    if autocast is not None and kind.name not in AUTOCAST_KINDS:
        raise ValueError(f"only cells and sequences run under autocast, not {kind.name}")
    if autocast is not None and dtype != torch.float32:
        raise ValueError("autocast runs a float32 model in 16 bits: the dtype must be float32")
    precision: Precision = contextlib.nullcontext
    if autocast is not None:
        precision = partial(torch.autocast, device.type, autocast)
    torch.manual_seed(seed)
    # Every LLTM implementation gets these weights; the inputs are drawn next,
    # before any implementation-specific module, so they are the same for all.
    ref = reference.LLTM(size.features, size.state).to(device=device, dtype=dtype)

    def tensor(*shape: int, leaf: bool = inputs_grad) -> Tensor:
        return torch.randn(*shape, device=device, dtype=dtype, requires_grad=leaf)

    if impl == "gemm":
        floor = _cell_gemm if size.seq_len is None else _sequence_gemm
        return floor(
            ref.weights.detach(), size, inputs_grad, partial(tensor, leaf=False), precision
        )
    b, f, s = size.batch, size.features, size.state
    if kind is PER_SAMPLE:
        return _per_sample_case(impl, ref, size, partial(tensor, leaf=False))
    if size.seq_len is None:
        x, h, c = tensor(b, f), tensor(b, s), tensor(b, s)
        module = _cell_module(impl, ref)
        return AutogradCase(
            impl, lambda: module(x, (h, c)), [x, h, c, *module.parameters()], size.loss, precision
        )
    # (num_layers * directions, batch, state), as nn.LSTM and LLTMSequence take it.
    x, h_0, c_0 = tensor(size.seq_len, b, f), tensor(1, b, s), tensor(1, b, s)
    module, call = _sequence_module(impl, ref)
    inputs = [x, h_0, c_0, *module.parameters()]
    if impl in SCOPES:
        return ScopedCase(
            impl, lambda: call(x, h_0, c_0), inputs, SCOPES[impl], size.loss, precision
        )
    return AutogradCase(impl, lambda: call(x, h_0, c_0), inputs, size.loss, precision)


def _cell_module(impl: str, ref: reference.LLTM) -> torch.nn.Module:
    f, s = ref.input_features, ref.state_size
    if impl == "reference":
        return ref
    if impl == "compiled":
        # One static graph per size: after a shape change, automatic dynamic
        # shapes make AOTAutograd donate buffers, which forbids the retained
        # graph that the backward phase is timed on.
        # (Compiling a module gives a module: typed as any callable.)
        return cast(torch.nn.Module, torch.compile(copy.deepcopy(ref), dynamic=False))
    if impl == "lltm":
        return _like(LLTM(f, s), ref)
    assert impl == "lstmcell"
    return torch.nn.LSTMCell(f, s).to(ref.weights)


SequenceCall = Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]


def _sequence_module(impl: str, ref: reference.LLTM) -> tuple[torch.nn.Module, SequenceCall]:
    """The module and how to run it on (input, h_0, c_0), returning (output, h_n, c_n)."""
    f, s = ref.input_features, ref.state_size
    if impl in ("reference-loop", "lltm-loop"):
        cell = ref if impl == "reference-loop" else _like(LLTM(f, s), ref)
        return cell, lambda x, h_0, c_0: _loop(cell, x, h_0[0], c_0[0])
    if impl in ("lltm-sequence", "lltm-sequence-per-step"):
        module: torch.nn.Module = _like(LLTMSequence(f, s), ref)
    else:
        assert impl in ("lstm", "lstm-notf32")
        module = torch.nn.LSTM(f, s).to(ref.weights)

    def call(x: Tensor, h_0: Tensor, c_0: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        output, (h_n, c_n) = module(x, (h_0, c_0))
        return output, h_n, c_n

    return module, call


def _per_sample_case(
    impl: str, ref: reference.LLTM, size: Size, tensor: Callable[..., Tensor]
) -> PerSampleCase:
    """Samples of one sequence each, ``(seq_len, features)``.

    Stacked along dimension 0 as a data loader gives them; the loss of a sample
    is the mean squared error of its output against a random target, the
    initial state the module's default (zeros).
    """
    b, t, f, s = size.batch, size.seq_len or 0, size.features, size.state
    x, target = tensor(b, t, f), tensor(b, t, s)
    ours = impl.startswith("lltm")
    module = _like(LLTMSequence(f, s), ref) if ours else torch.nn.LSTM(f, s).to(ref.weights)
    parameters = list(module.parameters())

    def case(step: Callable[[], Any], collect: Callable[[Any], Iterable[Tensor]]) -> PerSampleCase:
        return PerSampleCase(impl, step, module, (x, target), collect)

    if impl.endswith("-loop"):
        # The straightforward way: one forward and backward per sample; each
        # sample's gradients are kept as autograd returns them (not stacked).
        def loop() -> list[tuple[Tensor, ...]]:
            return [
                torch.autograd.grad(_sample_loss(module(x[k])[0], target[k]), parameters)
                for k in range(b)
            ]

        return case(loop, _stack_per_sample)
    if impl == "lltm-batched":
        # Not per-sample: the one gradient of the batch's mean loss, in one
        # forward and backward of the whole batch, in the time-major layout
        # the module takes. The floor a per-sample method can approach.
        x_batch, target_batch = x.transpose(0, 1).contiguous(), target.transpose(0, 1).contiguous()
        return case(
            lambda: torch.autograd.grad(_sample_loss(module(x_batch)[0], target_batch), parameters),
            list,
        )
    assert impl.endswith("-vmap")

    def loss(params: dict[str, Tensor], x: Tensor, target: Tensor) -> Tensor:
        return _sample_loss(torch.func.functional_call(module, params, (x,))[0], target)

    shared = {name: p.detach() for name, p in module.named_parameters()}
    per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))
    if ours:
        return case(lambda: per_sample(shared, x, target), dict.values)

    def fallback() -> dict[str, Tensor]:
        # nn.LSTM's operator has no batching rule: vmap's fallback runs it
        # once per sample, with a warning that says so.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "There is a performance drop", UserWarning)
            grads: dict[str, Tensor] = per_sample(shared, x, target)
            return grads

    return case(fallback, dict.values)


def _sample_loss(output: Tensor, target: Tensor) -> Tensor:
    return torch.nn.functional.mse_loss(output, target)


def _stack_per_sample(grads: list[tuple[Tensor, ...]]) -> list[Tensor]:
    return [torch.stack(column) for column in zip(*grads, strict=True)]


def _loop(
    cell: torch.nn.Module, input: Tensor, h: Tensor, c: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """A cell over the steps of ``input`` in Python, the way a user writes it."""
    outputs = []
    for x in input.unbind(0):
        h, c = cell(x, (h, c))
        outputs.append(h)
    return torch.stack(outputs), h, c


def _like(module: torch.nn.Module, ref: reference.LLTM) -> torch.nn.Module:
    """``module`` on ref's device and dtype, with ref's weights."""
    module = module.to(ref.weights)
    module.load_state_dict(ref.state_dict())
    return module


MakeTensor = Callable[..., Tensor]


def _cell_gemm(
    weights: Tensor, size: Size, inputs_grad: bool, tensor: MakeTensor, precision: Precision
) -> GemmCase:
    """The products of one step.

    Forward ``[old_h, input] @ W^T``; backward the weight gradient ``d_gates^T
    @ [old_h, input]`` and, when the inputs need gradients, ``d_gates @ W``.
    """
    b, f, s = size.batch, size.features, size.state
    x, d_gates = tensor(b, s + f), tensor(b, 3 * s)
    backward = [lambda: torch.mm(d_gates.t(), x)]
    if inputs_grad:
        backward.append(lambda: torch.mm(d_gates, weights))
    return GemmCase([lambda: torch.mm(x, weights.t())], backward, precision)


def _sequence_gemm(
    weights: Tensor, size: Size, inputs_grad: bool, tensor: MakeTensor, precision: Precision
) -> GemmCase:
    """The products of ``seq_len`` steps.

    The input projection of all steps batched (as a fused implementation can)
    and the recurrent products one step at a time (as any implementation must).

    Forward: the input projection ``(T*B, F) x (F, 3S)`` and T recurrent
    products ``(B, S) x (S, 3S)``. Backward: the recurrent products ``(B, 3S)
    x (3S, S)`` that carry the gradient of h back one step (T - 1 of them, T
    when h_0 needs its gradient), the weight gradient ``(3S, T*B) x (T*B, S+F)``
    and, when the inputs need gradients, ``(T*B, 3S) x (3S, F)``.
    """
    t, b, f, s = size.seq_len or 0, size.batch, size.features, size.state
    w_h, w_x = weights[:, :s], weights[:, s:]
    # Every step's [h, input] and d_gates, stacked along the batch.
    xs, d_gates = tensor(t * b, s + f), tensor(t * b, 3 * s)
    h = tensor(b, s)
    d_steps = d_gates.split(b)
    forward = [lambda: torch.mm(xs[:, s:], w_x.t())]
    forward += [lambda: torch.mm(h, w_h.t())] * t

    def carry_back(d: Tensor) -> Callable[[], Tensor]:
        return lambda: torch.mm(d, w_h)

    backward = [carry_back(d) for d in d_steps[: t if inputs_grad else t - 1]]
    backward.append(lambda: torch.mm(d_gates.t(), xs))
    if inputs_grad:
        backward.append(lambda: torch.mm(d_gates, w_x))
    return GemmCase(forward, backward, precision)
