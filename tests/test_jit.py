"""TorchScript: torch.jit.trace of modules using lltm gives a graph of lltm's
registered ops that passes trace checking, differentiates, saves, and loads
and runs in a fresh process that imports lltm."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import lltm

# torch >= 2.13 deprecates TorchScript in favour of torch.export, which lltm
# supports too (test_export.py); traces keep working and are tested here.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.:DeprecationWarning")


class _CellModel(torch.nn.Module):
    """A step of the tutorial's module between two linear layers."""

    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Linear(5, 6)
        self.cell = lltm.LLTM(6, 7)
        self.head = torch.nn.Linear(7, 2)

    def forward(self, x, h, c):
        new_h, new_c = self.cell(torch.tanh(self.encoder(x)), (h, c))
        return self.head(new_h), new_c


class _SequenceModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = lltm.LLTMSequence(5, 6, 2, True, True, 0.0, True)  # nn.LSTM's order
        self.head = torch.nn.Linear(12, 2)

    def forward(self, x):
        output, (h_n, c_n) = self.rnn(x)
        return self.head(output), h_n, c_n


def _models_and_inputs():
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    cell_inputs = (
        torch.randn(3, 5, generator=generator),
        torch.randn(3, 7, generator=generator),
        torch.randn(3, 7, generator=generator),
    )
    sequence_inputs = (torch.randn(3, 4, 5, generator=generator),)
    return {
        "cell": (_CellModel().eval(), cell_inputs),
        "sequence": (_SequenceModel().eval(), sequence_inputs),
    }


class _NoTracerWarnings:
    """TracerWarnings (a trace that does not hold for other inputs) as errors."""

    def __enter__(self):
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("error", torch.jit.TracerWarning)

    def __exit__(self, *exc):
        return self._catch.__exit__(*exc)


def _op_kinds(traced):
    graph = traced.inlined_graph
    return [node.kind() for node in graph.nodes()]


@pytest.mark.parametrize("name", ["cell", "sequence"])
def test_trace_records_lltm_ops_and_passes_checking(name):
    model, inputs = _models_and_inputs()[name]
    # check_trace (the default) reruns the trace and compares the graphs
    # and outputs; TracerWarnings would say the trace is not faithful.
    with _NoTracerWarnings():
        traced = torch.jit.trace(model, inputs)
    kinds = _op_kinds(traced)
    expected = "lltm::forward" if name == "cell" else "lltm::sequence_forward"
    assert expected in kinds, kinds
    assert "prim::PythonOp" not in kinds, kinds
    # Two layers, two directions: one op call each.
    assert kinds.count(expected) == (1 if name == "cell" else 4)
    for ours, theirs in zip(traced(*inputs), model(*inputs), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["cell", "sequence"])
def test_traced_module_differentiates_like_eager(name):
    model, inputs = _models_and_inputs()[name]
    traced = torch.jit.trace(model, inputs)

    def grads(module):
        module.zero_grad()
        sum(o.pow(2).sum() for o in module(*inputs)).backward()
        return [p.grad.clone() for p in model.parameters()]

    for ours, theirs in zip(grads(traced), grads(model), strict=True):
        torch.testing.assert_close(ours, theirs)


def test_saved_trace_loads_and_runs_in_a_fresh_process(tmp_path):
    expected = {}
    for name, (model, inputs) in _models_and_inputs().items():
        torch.jit.save(torch.jit.trace(model, inputs), tmp_path / f"{name}.pt")
        expected[name] = (inputs, model(*inputs))
    torch.save(expected, tmp_path / "expected.pt")
    script = textwrap.dedent(
        f"""
        import torch
        import lltm  # registers the ops the saved graphs call
        expected = torch.load({str(tmp_path / "expected.pt")!r})
        for name, (inputs, outputs) in expected.items():
            loaded = torch.jit.load({str(tmp_path)!r} + "/" + name + ".pt")
            for ours, theirs in zip(loaded(*inputs), outputs, strict=True):
                torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


@pytest.mark.parametrize("name", ["cell", "sequence"])
def test_script_says_it_is_not_supported_and_what_to_use(name):
    # torch.jit.script cannot compile the modules' Python forward: the error
    # names the module and the ways that work, for the module itself and for
    # a model that holds it.
    model, _ = _models_and_inputs()[name]
    module = model.cell if name == "cell" else model.rnn
    for scripted in (module, model):
        with pytest.raises(RuntimeError, match=r"lltm: torch.jit.script .*torch.jit.trace"):
            torch.jit.script(scripted)
