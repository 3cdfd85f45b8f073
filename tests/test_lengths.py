"""Padded batches with ``lengths`` (ONNX's ``sequence_lens``): the packed path's
results and gradients, in eager and traced, and programs that export.

In eager the call is the packed path itself, so its results and gradients
are compared with a PackedSequence's bit for bit. Traced (torch.export,
torch.compile, jit.trace) it is a graph with no data-dependent shape
(lltm/lengths.py); forced in eager, it is held to the packed path too, and
the exported programs (torch.export, ONNX in onnxruntime, ExecuTorch's
portable and XNNPACK runtimes) to eager at lengths and batch sizes other than
the example's.
"""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import lltm
from lltm import lengths as lengths_module

F, S = 4, 6


def _model(seed=0, dtype=torch.float64, **kwargs):
    torch.manual_seed(seed)
    return lltm.LLTMSequence(F, S, **kwargs).to(dtype).eval()


def _batch(steps, lengths, layers_directions=1, dtype=torch.float64, batch_first=False, seed=1):
    g = torch.Generator().manual_seed(seed)
    batch = len(lengths)
    shape = (batch, steps, F) if batch_first else (steps, batch, F)
    x = torch.randn(*shape, generator=g, dtype=dtype)
    state = tuple(torch.randn(layers_directions, batch, S, generator=g, dtype=dtype) for _ in "hc")
    return x, state, torch.tensor(lengths)


def _packed_path(model, x, state, lengths):
    """The reference: pack, run, pad back."""
    batch_first = model.batch_first
    packed = pack_padded_sequence(x, lengths, batch_first=batch_first, enforce_sorted=False)
    output, final = model(packed, state)
    steps = x.shape[1] if batch_first else x.shape[0]
    output, _ = pad_packed_sequence(output, batch_first=batch_first, total_length=steps)
    return output, *final


def _flat(result):
    output, (h_n, c_n) = result
    return output, h_n, c_n


MODELS = {
    "one_layer": {},
    "layers_bidirectional": {"num_layers": 2, "bidirectional": True},
    "batch_first_no_bias": {"num_layers": 2, "batch_first": True, "bias": False},
}
LENGTHS = [[5, 2, 7, 1], [7, 7, 7], [3], [1, 4, 2, 6, 6, 1]]


@pytest.mark.parametrize("lengths", LENGTHS, ids=str)
@pytest.mark.parametrize("kwargs", MODELS.values(), ids=MODELS)
def test_eager_is_the_packed_path(kwargs, lengths):
    model = _model(**kwargs)
    ld = model.num_layers * model.directions
    x, state, lens = _batch(7, lengths, ld, batch_first=model.batch_first)
    got = _flat(model(x, state, lens))
    expected = _packed_path(model, x, state, lens)
    for a, e in zip(got, expected, strict=True):
        assert torch.equal(a, e)
    output = got[0] if not model.batch_first else got[0].transpose(0, 1)
    for b, n in enumerate(lengths):  # zeros past each length
        assert not output[n:, b].any()


@pytest.mark.parametrize("kwargs", MODELS.values(), ids=MODELS)
def test_eager_gradients_are_the_packed_paths(kwargs):
    model = _model(**kwargs)
    x, state, lens = _batch(7, LENGTHS[0], model.num_layers * model.directions,
                            batch_first=model.batch_first)  # fmt: skip
    leaves = [x.requires_grad_(), *(s.requires_grad_() for s in state), *model.parameters()]

    def grads(outputs):
        weights = torch.Generator().manual_seed(5)
        loss = sum((o * torch.randn(o.shape, generator=weights, dtype=o.dtype)).sum()
                   for o in outputs)  # fmt: skip
        return torch.autograd.grad(loss, leaves)

    got = grads(_flat(model(x, state, lens)))
    expected = grads(_packed_path(model, x, state, lens))
    for a, e in zip(got, expected, strict=True):
        assert torch.equal(a, e)


@pytest.fixture
def traced_route(monkeypatch):
    """The traced route, in eager."""
    monkeypatch.setattr(lengths_module, "traced", lambda: True)


@pytest.mark.parametrize("lengths", LENGTHS, ids=str)
@pytest.mark.parametrize("kwargs", MODELS.values(), ids=MODELS)
def test_the_traced_route_equals_the_packed_path(kwargs, lengths, traced_route):
    model = _model(**kwargs)
    x, state, lens = _batch(7, lengths, model.num_layers * model.directions,
                            batch_first=model.batch_first)  # fmt: skip
    leaves = [x.requires_grad_(), *(s.requires_grad_() for s in state), *model.parameters()]
    got = _flat(model(x, state, lens))
    expected = _packed_path(model, x, state, lens)
    for a, e in zip(got, expected, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)
    ones = [torch.ones_like(t) for t in got]
    for a, e in zip(torch.autograd.grad(got, leaves, ones),
                    torch.autograd.grad(expected, leaves, ones), strict=True):  # fmt: skip
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-10)


def test_the_traced_route_keeps_a_sequence_of_length_zero_at_its_state(traced_route):
    model = _model(bidirectional=True)
    x, state, _ = _batch(5, [5, 0, 2], 2)
    output, (h_n, c_n) = model(x, state, torch.tensor([5, 0, 2]))
    assert not output[:, 1].any()
    assert torch.equal(h_n[:, 1], state[0][:, 1]) and torch.equal(c_n[:, 1], state[1][:, 1])


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_the_functional_form(traced, monkeypatch):
    monkeypatch.setattr(lengths_module, "traced", lambda: traced)
    model = _model()
    x, (h, c), lens = _batch(6, [2, 6, 4], 1)
    output, (h_n, c_n) = lltm.lltm_sequence(x, model.weights, model.bias, h[0], c[0], lens)
    expected = _packed_path(model, x, (h, c), lens)
    torch.testing.assert_close(output, expected[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h_n, expected[1][0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(c_n, expected[2][0], rtol=1e-12, atol=1e-12)


def test_lengths_on_the_inputs_device_or_any_integer_type():
    model = _model()
    x, state, lens = _batch(6, [2, 6, 4])
    expected = _flat(model(x, state, lens))
    for other in (lens.to(torch.int32), lens.to(torch.uint8)):
        for a, e in zip(_flat(model(x, state, other)), expected, strict=True):
            assert torch.equal(a, e)


# --- Bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "lengths, message",
    [
        (torch.tensor([2, 8, 4]), "at most seq_len = 6"),
        (torch.tensor([2, 0, 4]), "at least 1"),
        (torch.tensor([2, 6]), r"shape \(batch,\) = \(3,\)"),
        (torch.tensor([[2, 6, 4]]), r"shape \(batch,\)"),
        (torch.tensor([2.0, 6.0, 4.0]), "integer tensor"),
        (torch.tensor([2, 6, 4], device="meta"), "on the CPU or on the input's device"),
    ],
    ids=["past_seq_len", "zero", "too_few", "2d", "float", "other_device"],
)
def test_bad_lengths_are_named(lengths, message):
    model = _model()
    x, state, _ = _batch(6, [1, 1, 1])
    with pytest.raises(ValueError, match=f"lltm: LLTMSequence lengths must .*{message}"):
        model(x, state, lengths)
    with pytest.raises(ValueError, match=f"lltm: lltm_sequence lengths must .*{message}"):
        lltm.lltm_sequence(x, model.weights, model.bias, state[0][0], state[1][0], lengths)


def test_lengths_with_a_packed_or_unbatched_input_are_refused():
    model = _model()
    x, _state, lens = _batch(6, [3, 6])
    packed = pack_padded_sequence(x, lens, enforce_sorted=False)
    with pytest.raises(ValueError, match="lengths are for a padded batch"):
        model(packed, None, lens)
    with pytest.raises(ValueError, match="lengths are for a padded batch"):
        model(x[:, 0], None, torch.tensor([3]))
    with pytest.raises(TypeError, match="lengths must be a Tensor"):
        model(x, None, [3, 6])


# --- Traced and exported -----------------------------------------------------------------


class _Served(torch.nn.Module):
    """A served model: two layers in both directions over a batch with lengths."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.rnn = lltm.LLTMSequence(F, S, num_layers=2, bidirectional=True)

    def forward(self, x, lengths):
        output, (h_n, c_n) = self.rnn(x, None, lengths)
        return output, h_n, c_n


def _request(steps, lengths, seed=3):
    g = torch.Generator().manual_seed(seed + steps)
    return torch.randn(steps, len(lengths), F, generator=g), torch.tensor(lengths)


# Sizes other than the example's (5 steps, lengths [5, 2, 3]).
REQUESTS = [(9, [9, 1, 4, 7]), (3, [2, 3]), (12, [12]), (6, [6, 6, 1, 2, 5, 3, 4])]


def _shapes(max_batch=None):
    batch = Dim("batch", min=1, max=max_batch or 1024)
    return ({0: Dim("steps", min=2, max=64), 1: batch}, {0: batch})


def _exported(max_batch=None):
    model = _Served().eval()
    program = torch.export.export(model, _request(5, [5, 2, 3]), dynamic_shapes=_shapes(max_batch))
    return model, program


def test_torch_export_with_a_dynamic_length_and_batch():
    model, program = _exported()
    assert any("lltm.sequence_forward" in str(n.target) for n in program.graph.nodes)
    for steps, lengths in REQUESTS:
        inputs = _request(steps, lengths)
        with torch.no_grad():
            for a, e in zip(program.module()(*inputs), model(*inputs), strict=True):
                torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-6)


def test_torch_compile_equals_eager_and_the_packed_gradients():
    model = _Served()
    compiled = torch.compile(model, backend="aot_eager", dynamic=True, fullgraph=True)
    for steps, lengths in REQUESTS[:2]:
        x, lens = _request(steps, lengths)
        got, expected = compiled(x, lens), model(x, lens)
        for a, e in zip(got, expected, strict=True):
            torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-6)
        params = list(model.parameters())
        grads = torch.autograd.grad(sum(o.sum() for o in got), params)
        reference = torch.autograd.grad(sum(o.sum() for o in expected), params)
        for a, e in zip(grads, reference, strict=True):
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)


def _max_error(got, expected):
    return max((a - e).abs().max().item() for a, e in zip(got, expected, strict=True))


def test_onnx_runs_every_length_and_batch_in_onnxruntime(tmp_path):
    pytest.importorskip("onnxscript", reason="pip install --group deploy")
    ort = pytest.importorskip("onnxruntime", reason="pip install --group deploy")
    model = _Served().eval()
    path = tmp_path / "served.onnx"
    torch.onnx.export(model, _request(5, [5, 2, 3]), path, dynamic_shapes=_shapes())
    session = ort.InferenceSession(str(path))
    names = [i.name for i in session.get_inputs()]
    for steps, lengths in REQUESTS:
        x, lens = _request(steps, lengths)
        outputs = session.run(None, dict(zip(names, (x.numpy(), lens.numpy()), strict=True)))
        with torch.no_grad():
            expected = model(x, lens)
        assert _max_error([torch.from_numpy(o) for o in outputs], expected) < 1e-5


@pytest.mark.parametrize(
    "backend", ["portable", pytest.param("xnnpack", marks=pytest.mark.deploy_full)]
)
def test_executorch_runs_every_length_and_batch(backend, tmp_path):
    pytest.importorskip("executorch", reason="pip install --group deploy")
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    model, program = _exported(max_batch=8)
    partitioners = []
    if backend == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        partitioners = [XnnpackPartitioner()]
    lowered = to_edge_transform_and_lower(program, partitioner=partitioners).to_executorch()
    path = tmp_path / "served.pte"
    path.write_bytes(lowered.buffer)
    method = Runtime.get().load_program(str(path)).load_method("forward")
    for steps, lengths in REQUESTS:
        x, lens = _request(steps, lengths)
        with torch.no_grad():
            expected = model(x, lens)
        assert _max_error(method.execute([x, lens]), expected) < 1e-5
