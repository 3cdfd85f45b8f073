"""The modules: ``lltm.LLTM`` and ``lltm.LLTMSequence``.

``lltm.LLTM`` is one step, the tutorial's module; ``lltm.LLTMSequence`` runs
whole sequences, in the style of ``torch.nn.LSTM``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import NoReturn, overload

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from . import lengths as _lengths
from . import ops, reference


class LLTM(reference.LLTM):
    """The LLTM cell as an ``nn.Module``, running the fused operator.

    It is the tutorial's module (:class:`lltm.reference.LLTM`) with its
    constructor, parameters, initialisation and call convention, so its
    state_dicts load unchanged; only ``forward`` differs::

        new_h, new_cell = rnn(input, (old_h, old_cell))

    Args:
        input_features: features of each input.
        state_size: features of the hidden state and of the cell.
        device: where the parameters are made, as for every torch module.
        dtype: the parameters' type, as for every torch module.

    Attributes:
        weights: ``(3 * state_size, state_size + input_features)``, the
            input gate's, output gate's and candidate's rows in that order;
            columns ``[0, state_size)`` multiply ``old_h``, the rest ``input``.
        bias: ``(3 * state_size,)``.
    """

    def forward(self, input: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """One step: ``(new_h, new_cell)`` from ``input`` and ``state = (old_h, old_cell)``."""
        old_h, old_cell = state
        # nn.Module finds a parameter in __getattr__, once Python's own lookup
        # has failed with an exception; reading the dict the parameter lives
        # in costs a fraction of that, on every step. A parametrization,
        # pruning or weight_norm takes it out of that dict, and the attribute
        # is then read as usual.
        parameters = self._parameters
        weights = parameters.get("weights")
        if weights is not None and "bias" in parameters:
            bias = parameters["bias"]
        else:
            weights, bias = self.weights, self.bias
        return ops.cell(input, weights, bias, old_h, old_cell)

    def extra_repr(self) -> str:
        """The sizes, shown in the module's repr."""
        return f"input_features={self.input_features}, state_size={self.state_size}"

    def __prepare_scriptable__(self) -> torch.nn.Module:
        _refuse_scripting(type(self).__name__)


def _refuse_scripting(module: str) -> NoReturn:
    # torch.jit.script calls __prepare_scriptable__ on a module and on every
    # submodule before compiling any: one clear error instead of TorchScript's
    # complaint about a line deep inside the argument checks.
    raise RuntimeError(
        f"lltm: torch.jit.script cannot compile lltm.{module} (its forward dispatches "
        "in Python, which TorchScript cannot read); use torch.jit.trace, which records "
        "lltm's operators, or torch.export"
    )


# Dynamo answers torch.compiler.is_exporting() with True in every trace, for
# torch.compile too, on torch before 2.13 (2.13 reads the real flag). There,
# only an export that traces without Dynamo (non-strict: torch.export's and
# the ONNX exporter's default) is recognised; a strict export of a packed
# sequence then fails inside the module, as nn.LSTM's does.
_EXPORT_FLAG_TRUSTED_UNDER_DYNAMO = torch.torch_version.TorchVersion(torch.__version__) >= "2.13"


def _exporting() -> bool:
    """torch.export, or an exporter built on it, is tracing this call."""
    if not torch.compiler.is_exporting():
        return False
    return _EXPORT_FLAG_TRUSTED_UNDER_DYNAMO or not torch.compiler.is_dynamo_compiling()


def _refuse_packed_export() -> NoReturn:
    # The number of sequences each step updates is data (batch_sizes), and an
    # exported graph cannot follow it: torch.export would fail deep inside
    # the module on a data-dependent guard, as it does for nn.LSTM.
    raise ValueError(
        "lltm: LLTMSequence cannot be exported (torch.export, ONNX, ExecuTorch) with a "
        "PackedSequence input: how many sequences each step updates is data, which an "
        "exported graph cannot follow. Export it on the padded batch with its lengths "
        "instead, model(padded, state, lengths): the packed path's results, in a graph "
        "that exports (torch.nn.utils.rnn.pad_packed_sequence gives both)"
    )


def _fail(message: str) -> NoReturn:
    raise ValueError(f"lltm: LLTMSequence {message}")


class LLTMSequence(torch.nn.Module):
    """The LLTM over whole sequences, with ``torch.nn.LSTM``'s conventions.

    Each layer and direction is one operator call for the whole sequence
    (:func:`lltm.lltm_sequence`), the recurrence and backpropagation through
    time running in C++ (or CUDA)::

        seq = lltm.LLTMSequence(input_features, state_size)
        output, (h_n, c_n) = seq(input, (h_0, c_0))  # the state is optional

    The constructor takes ``nn.LSTM``'s arguments in ``nn.LSTM``'s order.
    ``input_size`` and ``hidden_size`` are called ``input_features`` and
    ``state_size`` here, as in the tutorial's cell; ``nn.LSTM``'s names are
    read-only properties.

    Args:
        input_features: features of each step's input.
        state_size: features of the hidden state and of the cell.
        num_layers: stacked layers; layer ``k > 0`` reads the previous
            layer's output, ``directions * state_size`` features.
        bias: ``False`` gives no bias parameters, and the kernels add none.
        batch_first: ``input`` and ``output`` are ``(batch, seq_len, ...)``.
        dropout: dropout on the output of every layer but the last, in
            training mode only, as ``nn.LSTM`` applies it.
        bidirectional: a second direction per layer, run from the last step
            to the first; outputs are concatenated.
        proj_size: only 0. The LLTM's output is its hidden state; it has no
            projection, and any other value is an error.
        device: where the parameters are made.
        dtype: the parameters' type.

    Raises:
        ValueError: ``input_features``, ``state_size`` or ``num_layers`` is
            not an integer of the allowed range, ``dropout`` is not in
            ``[0, 1]``, or ``proj_size`` is not 0.

    The parameters: with one layer and one direction exactly :class:`lltm.LLTM`'s
    (``weights``, ``bias``, same shapes and initialisation), so state_dicts
    move between the cell and this module unchanged. Otherwise one pair per
    layer ``k`` and direction, named as ``nn.LSTM`` names them:
    ``weights_l{k}``, ``bias_l{k}``, and ``weights_l{k}_reverse``,
    ``bias_l{k}_reverse`` for the backward direction.
    """

    def __init__(
        self,
        input_features: int,
        state_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        proj_size: int = 0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        for name, value, least in (
            ("input_features", input_features, 0),
            ("state_size", state_size, 1),
            ("num_layers", num_layers, 1),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                _fail(f"{name} must be an integer >= {least}, got {value!r}")
        if (
            isinstance(dropout, bool)
            or not isinstance(dropout, (int, float))
            or not 0 <= dropout <= 1
        ):
            _fail(
                f"dropout must be a number in [0, 1], the probability of zeroing, got {dropout!r}"
            )
        if proj_size != 0:
            _fail(
                f"has no projection: proj_size must be 0, got {proj_size!r} "
                "(the LLTM's output is its hidden state, state_size wide)"
            )
        if dropout > 0 and num_layers == 1:
            warnings.warn(
                "lltm: LLTMSequence applies dropout to the output of every layer but the last; "
                f"dropout={dropout} with num_layers=1 does nothing",
                UserWarning,
                stacklevel=2,
            )
        self.input_features = input_features
        self.state_size = state_size
        self.num_layers = num_layers
        self.batch_first = bool(batch_first)
        self.dropout = float(dropout)
        self.bidirectional = bool(bidirectional)
        self.proj_size = 0
        self.directions = 2 if self.bidirectional else 1
        # (weights, bias) attribute names per (layer, direction), in the
        # order of the state's first dimension.
        self._parameter_names: list[tuple[str, str]] = []
        plain = num_layers == 1 and self.directions == 1
        for layer in range(num_layers):
            features = input_features if layer == 0 else self.directions * state_size
            for direction in range(self.directions):
                suffix = "" if plain else f"_l{layer}" + ("_reverse" if direction else "")
                names = (f"weights{suffix}", f"bias{suffix}")
                weights = torch.empty(
                    3 * state_size, features + state_size, device=device, dtype=dtype
                )
                self.register_parameter(names[0], torch.nn.Parameter(weights))
                bias_parameter = torch.nn.Parameter(
                    torch.empty(3 * state_size, device=device, dtype=dtype)
                )
                self.register_parameter(names[1], bias_parameter if bias else None)
                self._parameter_names.append(names)
        self.reset_parameters()

    @property
    def has_bias(self) -> bool:
        """Whether the layers have bias parameters (``bias=True``).

        The attribute ``bias`` is the bias parameter itself, as in ``lltm.LLTM``.
        """
        return getattr(self, self._parameter_names[0][1]) is not None

    # nn.LSTM's names for the two sizes, for code written against nn.LSTM.
    @property
    def input_size(self) -> int:
        """``input_features`` under ``nn.LSTM``'s name."""
        return self.input_features

    @property
    def hidden_size(self) -> int:
        """``state_size`` under ``nn.LSTM``'s name."""
        return self.state_size

    def flatten_parameters(self) -> None:
        """Does nothing, and exists so that code written for ``nn.LSTM`` runs.

        ``nn.LSTM`` copies its parameters into one contiguous buffer for
        cuDNN; lltm's kernels read each layer's ``weights`` and ``bias`` where
        they are, so there is nothing to flatten.
        """

    def __prepare_scriptable__(self) -> torch.nn.Module:
        _refuse_scripting(type(self).__name__)

    def reset_parameters(self) -> None:
        """The tutorial's initialisation: uniform in +-1/sqrt(state_size)."""
        stdv = 1.0 / math.sqrt(self.state_size)
        for weight in self.parameters():
            weight.data.uniform_(-stdv, +stdv)

    @overload
    def forward(
        self,
        input: Tensor,
        state: tuple[Tensor, Tensor] | None = None,
        lengths: Tensor | None = None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]: ...
    @overload
    def forward(
        self, input: PackedSequence, state: tuple[Tensor, Tensor] | None = None
    ) -> tuple[PackedSequence, tuple[Tensor, Tensor]]: ...
    def forward(
        self,
        input: Tensor | PackedSequence,
        state: tuple[Tensor, Tensor] | None = None,
        lengths: Tensor | None = None,
    ) -> tuple[Tensor | PackedSequence, tuple[Tensor, Tensor]]:
        """Runs every layer and direction over ``input``.

        Args:
            input: ``(seq_len, batch, input_features)``, or ``(batch, seq_len,
                input_features)`` with ``batch_first=True``; ``(seq_len,
                input_features)`` for one unbatched sequence; or a
                ``PackedSequence`` of sequences of different lengths, sorted
                or not.
            state: ``(h_0, c_0)``, each ``(num_layers * directions, batch,
                state_size)`` (``(num_layers * directions, state_size)`` for
                an unbatched sequence); zeros when None.
            lengths: for a padded batch of sequences of different lengths,
                ``(batch,)`` integers (ONNX's ``sequence_lens``), on the CPU
                or the input's device, in any order: sequence ``b`` is its
                first ``lengths[b]`` steps, as ``pack_padded_sequence(input,
                lengths, enforce_sorted=False)`` takes it, and the results
                are the packed path's (lltm/lengths.py). Unlike a
                ``PackedSequence``, it exports.

        Returns:
            ``(output, (h_n, c_n))``: ``output`` laid out like ``input`` (a
            ``PackedSequence`` for packed input) with ``directions *
            state_size`` features, zeros past each sequence's length;
            ``h_n`` and ``c_n`` shaped like ``h_0``, holding each sequence's
            last valid step.

        Raises:
            TypeError: ``input`` is not a tensor or a ``PackedSequence``, or
                ``state`` is not a pair of tensors, or ``lengths`` is neither
                a tensor nor None.
            ValueError: a shape, dtype or device that does not fit, or
                ``lengths`` outside ``[1, seq_len]`` or with a packed or
                unbatched input; the message starts with ``lltm:`` and names
                the argument.
        """
        if lengths is not None:
            return self._forward_lengths(input, state, lengths)
        packed = isinstance(input, PackedSequence)
        batched = True
        if packed:
            if _exporting():
                _refuse_packed_export()
            data, batch_sizes, sorted_indices, unsorted_indices = input
            batch = int(batch_sizes[0]) if batch_sizes.numel() else 0
        else:
            if not isinstance(input, Tensor):
                raise TypeError(
                    "lltm: LLTMSequence input must be a Tensor or a PackedSequence, "
                    f"got {type(input).__name__}"
                )
            if input.dim() not in (2, 3):
                _fail(
                    "input must be 3-D ("
                    + ("batch, seq_len" if self.batch_first else "seq_len, batch")
                    + f", input_features) or 2-D (seq_len, input_features), got shape "
                    f"{tuple(input.shape)}"
                )
            batched = input.dim() == 3
            data = input if batched else input.unsqueeze(1)
            if batched and self.batch_first:
                data = data.transpose(0, 1)
            batch_sizes = sorted_indices = unsorted_indices = None
            batch = data.shape[1]
        h_0, c_0 = self._initial_state(state, data, batch, batched, sorted_indices)

        def run(
            x: Tensor, w: Tensor, b: Tensor | None, h: Tensor, c: Tensor, reverse: bool
        ) -> tuple[Tensor, Tensor, Tensor]:
            return ops.sequence(x, w, b, h, c, batch_sizes, reverse)

        layer_input, (final_h, final_c) = self._layers(data, h_0, c_0, run)
        if packed:
            if unsorted_indices is not None:
                final_h = final_h.index_select(1, unsorted_indices)
                final_c = final_c.index_select(1, unsorted_indices)
            result = PackedSequence(layer_input, batch_sizes, sorted_indices, unsorted_indices)
            return result, (final_h, final_c)
        output = layer_input
        if not batched:
            return output.squeeze(1), (final_h.squeeze(1), final_c.squeeze(1))
        if self.batch_first:
            output = output.transpose(0, 1)
        return output, (final_h, final_c)

    def _forward_lengths(
        self, input: Tensor | PackedSequence, state: tuple[Tensor, Tensor] | None, lengths: Tensor
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """:meth:`forward` of a padded batch with ``lengths`` (see lltm/lengths.py)."""
        if not isinstance(input, Tensor) or input.dim() != 3:
            _fail(
                "lengths are for a padded batch, a 3-D input; a PackedSequence carries its own "
                "and one unbatched sequence has its own length"
            )
        data = input.transpose(0, 1) if self.batch_first else input
        steps, batch = data.shape[0], data.shape[1]
        lengths = _lengths.check(lengths, batch, steps, data, "LLTMSequence")
        if not _lengths.traced():
            packed = pack_padded_sequence(data, lengths, enforce_sorted=False)
            packed_output, final = self(packed, state)
            output, _ = pad_packed_sequence(packed_output, total_length=steps)
            return (output.transpose(0, 1) if self.batch_first else output), final
        h_0, c_0 = self._initial_state(state, data, batch, True, None)

        def run(
            x: Tensor, w: Tensor, b: Tensor | None, h: Tensor, c: Tensor, reverse: bool
        ) -> tuple[Tensor, Tensor, Tensor]:
            return _lengths.traced_direction(x, w, b, h, c, lengths, reverse)

        output, final = self._layers(data, h_0, c_0, run)
        return (output.transpose(0, 1) if self.batch_first else output), final

    def _layers(
        self,
        data: Tensor,
        h_0: Tensor,
        c_0: Tensor,
        run: Callable[[Tensor, Tensor, Tensor | None, Tensor, Tensor, bool], tuple[Tensor, ...]],
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Every layer and direction over ``data``: ``(output, (h_n, c_n))``.

        ``run(input, weights, bias, h_0, c_0, reverse)`` is one layer's
        direction: ``(output, h_n, c_n)``.
        """
        layer_input = data
        h_n: list[Tensor] = []
        c_n: list[Tensor] = []
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(self.directions):
                index = layer * self.directions + direction
                weights_name, bias_name = self._parameter_names[index]
                output, h, c = run(
                    layer_input,
                    getattr(self, weights_name),
                    getattr(self, bias_name),  # None with bias=False
                    # select(): the view h_0[index] makes, without Python
                    # indexing's parsing of the index on every call.
                    h_0.select(0, index),
                    c_0.select(0, index),
                    direction == 1,
                )
                outputs.append(output)
                h_n.append(h)
                c_n.append(c)
            layer_input = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-1)
            if self.dropout and self.training and layer < self.num_layers - 1:
                layer_input = F.dropout(layer_input, self.dropout, training=True)
        if len(h_n) == 1:  # a view, not a copy, in the common case
            return layer_input, (h_n[0].unsqueeze(0), c_n[0].unsqueeze(0))
        return layer_input, (torch.stack(h_n), torch.stack(c_n))

    def _initial_state(
        self,
        state: tuple[Tensor, Tensor] | None,
        data: Tensor,
        batch: int,
        batched: bool,
        sorted_indices: Tensor | None,
    ) -> tuple[Tensor, Tensor]:
        """(h_0, c_0) as (num_layers * directions, batch, state_size).

        In the order of the (sorted) batch.
        """
        shape = (self.num_layers * self.directions, batch, self.state_size)
        if state is None:
            zeros = data.new_zeros(shape)
            return zeros, zeros
        if not (isinstance(state, (tuple, list)) and len(state) == 2):
            raise TypeError("lltm: LLTMSequence state must be a tuple (h_0, c_0) of Tensors")
        h_0, c_0 = state
        expected = shape if batched else (shape[0], shape[2])
        for name, t in (("h_0", h_0), ("c_0", c_0)):
            if not isinstance(t, Tensor):
                raise TypeError(
                    f"lltm: LLTMSequence {name} must be a Tensor, got {type(t).__name__}"
                )
            if tuple(t.shape) != expected:
                what = (
                    "num_layers * directions, batch, state_size"
                    if batched
                    else ("num_layers * directions, state_size")
                )
                _fail(f"{name} must have shape ({what}) = {expected}, got {tuple(t.shape)}")
        if not batched:
            h_0, c_0 = h_0.unsqueeze(1), c_0.unsqueeze(1)
        if sorted_indices is not None:
            h_0 = h_0.index_select(1, sorted_indices)
            c_0 = c_0.index_select(1, sorted_indices)
        return h_0, c_0

    def extra_repr(self) -> str:
        """The configuration, shown in the module's repr."""
        extra = f"input_features={self.input_features}, state_size={self.state_size}"
        if self.num_layers != 1:
            extra += f", num_layers={self.num_layers}"
        if not self.has_bias:
            extra += ", bias=False"
        if self.batch_first:
            extra += ", batch_first=True"
        if self.dropout:
            extra += f", dropout={self.dropout}"
        if self.bidirectional:
            extra += ", bidirectional=True"
        return extra
