"""torch.export (static and dynamic shapes, save/load, an AOTInductor
package), activation checkpointing, inference mode and deterministic mode
with lltm's modules."""

from __future__ import annotations

import json
import zipfile

import pytest
import torch
from torch.export import Dim

import lltm


class _Model(torch.nn.Module):
    """A cell step and a two-layer bidirectional sequence, as a model holds them."""

    def __init__(self):
        super().__init__()
        self.cell = lltm.LLTM(4, 6)
        self.rnn = lltm.LLTMSequence(6, 5, 2, batch_first=True, bidirectional=True)

    def forward(self, x, h, c):
        new_h, new_c = self.cell(x[:, 0], (h, c))
        output, (h_n, _) = self.rnn(torch.tanh(x @ self.cell.weights[:6, 6:].T))
        return new_h, new_c, output, h_n


def _model_and_inputs(batch=3, steps=5, seed=0):
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed + 1)
    inputs = (
        torch.randn(batch, steps, 4, generator=generator),
        torch.randn(batch, 6, generator=generator),
        torch.randn(batch, 6, generator=generator),
    )
    return _Model().eval(), inputs


def _assert_same(ours, theirs):
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b)


def _lltm_targets(exported):
    return [str(n.target) for n in exported.graph.nodes if "lltm" in str(n.target)]


def test_export_static_save_and_load(tmp_path):
    model, inputs = _model_and_inputs()
    exported = torch.export.export(model, inputs)
    assert "lltm.forward.default" in _lltm_targets(exported)
    assert _lltm_targets(exported).count("lltm.sequence_forward.default") == 4
    _assert_same(exported.module()(*inputs), model(*inputs))
    torch.export.save(exported, tmp_path / "model.pt2")
    loaded = torch.export.load(tmp_path / "model.pt2")
    _assert_same(loaded.module()(*inputs), model(*inputs))


def test_export_dynamic_batch_and_length():
    model, inputs = _model_and_inputs()
    batch, steps = Dim("batch", min=1, max=64), Dim("steps", min=1, max=64)
    shapes = ({0: batch, 1: steps}, {0: batch}, {0: batch})
    exported = torch.export.export(model, inputs, dynamic_shapes=shapes)
    for size in [(1, 2), (7, 9)]:
        _, other = _model_and_inputs(*size, seed=3)
        _assert_same(exported.module()(*other), model(*other))


@pytest.mark.slow
def test_aot_inductor_package_runs(tmp_path):
    # Compiles C++ for the whole model (about a minute): in the slow session.
    model, inputs = _model_and_inputs()
    exported = torch.export.export(model, inputs)
    path = torch._inductor.aoti_compile_and_package(
        exported, package_path=str(tmp_path / "model.pt2")
    )
    compiled = torch._inductor.aoti_load_package(path)
    _assert_same(compiled(*inputs), model(*inputs))
    # The compiled model calls the fused operators (extern kernels, listed in
    # the package beside the wrapper): lltm's decompositions are only for
    # consumers that lower to core ATen (tests/test_decompositions.py).
    with zipfile.ZipFile(path) as package:
        (listing,) = [name for name in package.namelist() if name.endswith("wrapper.json")]
        targets = [node["node"]["target"] for node in json.loads(package.read(listing))["nodes"]]
    assert targets.count("lltm::forward") == 1
    assert targets.count("lltm::sequence_forward") == 4


def test_non_reentrant_checkpointing_matches_plain_backward():
    model, inputs = _model_and_inputs()
    model.train()

    def grads(use_checkpoint):
        model.zero_grad()
        if use_checkpoint:
            outputs = torch.utils.checkpoint.checkpoint(model, *inputs, use_reentrant=False)
        else:
            outputs = model(*inputs)
        sum(o.pow(2).sum() for o in outputs).backward()
        return [p.grad.clone() for p in model.parameters()]

    _assert_same(grads(True), grads(False))


def test_inference_mode_and_no_grad():
    model, inputs = _model_and_inputs()
    expected = [o.detach() for o in model(*inputs)]
    with torch.inference_mode():
        outputs = model(*inputs)
    assert all(o.is_inference() and not o.requires_grad for o in outputs)
    _assert_same(outputs, expected)


def test_deterministic_mode_is_bitwise_repeatable():
    model, inputs = _model_and_inputs()
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        runs = []
        for _ in range(2):
            model.zero_grad()
            outputs = model(*inputs)
            sum(o.sum() for o in outputs).backward()
            runs.append(
                [*(o.detach() for o in outputs), *(p.grad.clone() for p in model.parameters())]
            )
    finally:
        torch.use_deterministic_algorithms(previous)
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)
