"""Each private name of torch that lltm reads holds its contract under this torch.

lltm/_probes.py keeps every private name of torch lltm touches behind one
probe. These tests run under every torch of the matrix (2.10, 2.13, 2.15):
the first says which probes this torch has, the others what each must
answer, and the last that lltm still imports, warns once and computes the
same where all of them are missing, as a torch release that moved them would
leave it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from conftest import make_inputs
from torch.utils._python_dispatch import TorchDispatchMode

import lltm
from lltm import _probes


@pytest.mark.parametrize("name", _probes.PROBES)
def test_this_torch_has_what_the_probe_reads(name):
    probe = _probes.PROBES[name]
    assert probe.found, f"torch {torch.__version__} lacks {probe.needs}: {probe.fallback}"
    assert name not in _probes.MISSING


def test_functorch_transforms_active():
    seen = []

    def record(x):
        seen.append(_probes.functorch_transforms_active())
        return x.sin()

    record(torch.ones(2))
    torch.func.vmap(record)(torch.ones(2))
    torch.func.grad(lambda x: record(x).sum())(torch.ones(2))
    assert seen == [False, True, True]


def test_nested_differentiation():
    seen = []

    def record(x):
        seen.append(_probes.nested_differentiation())
        return x.sin().sum()

    torch.func.grad(record)(torch.ones(2))
    torch.func.vmap(torch.func.grad(record))(torch.ones(3, 2))
    torch.func.grad(torch.func.grad(record))(torch.ones(()))
    torch.func.jvp(torch.func.grad(record), (torch.ones(2),), (torch.ones(2),))
    assert seen == [False, False, True, True]


def test_forward_ad_active():
    assert not _probes.forward_ad_active()
    with fwAD.dual_level():
        assert _probes.forward_ad_active()
    assert not _probes.forward_ad_active()


def test_any_autocast_enabled():
    assert not _probes.any_autocast_enabled()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _probes.any_autocast_enabled()
        with torch.autocast("cpu", enabled=False):
            assert not _probes.any_autocast_enabled()


def test_dispatch_modes_active():
    class Watching(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    assert not _probes.dispatch_modes_active()
    with Watching():
        assert _probes.dispatch_modes_active()
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        assert _probes.dispatch_modes_active()


@pytest.mark.filterwarnings("ignore:`torch.jit.:DeprecationWarning")
def test_jit_tracing():
    seen = []

    def record(x):
        seen.append(_probes.jit_tracing())
        return x * 2

    record(torch.ones(1))
    torch.jit.trace(record, torch.ones(1), check_trace=False)
    assert seen == [False, True]


def test_cuda_matmul_allows_tf32():
    # What the legacy setter and the new API set; the fallback agrees.
    try:
        for setting, expected in (("high", True), ("medium", True), ("highest", False)):
            torch.set_float32_matmul_precision(setting)
            assert _probes.cuda_matmul_allows_tf32() is expected
            assert _probes._cuda_matmul_allows_tf32_in_python() is expected
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        assert _probes.cuda_matmul_allows_tf32() is True
        assert _probes._cuda_matmul_allows_tf32_in_python() is True
    finally:
        torch.set_float32_matmul_precision("highest")


def test_below_autograd_and_redispatch():
    args = make_inputs(2, 3, 4, requires_grad=True)
    with _probes.below_autograd():
        new_h, _, _ = _probes.direct(torch.ops.lltm.forward.default)(*args)
    assert new_h.grad_fn is None  # the Autograd kernel did not run
    # The Autograd kernel redispatches below itself when nothing differentiates.
    with torch.no_grad():
        op_h, _, _ = torch.ops.lltm.forward(*args)
    assert op_h.grad_fn is None and torch.equal(op_h, new_h)


def test_any_requires_grad():
    x, y = torch.ones(1), torch.ones(1, requires_grad=True)
    assert not _probes.any_requires_grad(x, None, 3, x)
    assert _probes.any_requires_grad(x, None, y)


def test_the_function_base_records_its_node_at_its_transforms_level():
    assert issubclass(torch.autograd.Function, _probes.FunctionBase)
    # lltm's Functions under two transforms at once (per-sample gradients).
    inputs = make_inputs(3, 2, 4)
    grads = torch.func.vmap(
        torch.func.grad(
            lambda w, x: lltm.lltm_cell(x[None], w, *inputs[2:3], *(t[:1] for t in inputs[3:]))[
                0
            ].sum()
        ),
        in_dims=(None, 0),
    )(inputs[1], inputs[0])
    assert grads.shape == (3, *inputs[1].shape)


def test_dispatcher_queries():
    assert _probes.has_kernel("lltm::forward", "CPU") is True
    assert _probes.has_kernel("lltm::forward", "Lazy") is False
    assert _probes.has_dispatch_key("AutocastCPU")
    assert not _probes.has_dispatch_key("NoSuchKey")


def test_upper_bound_of_a_traced_size():
    seen = []

    def record(x):
        seen.append(_probes.upper_bound(x.shape[0]))
        return x * 2

    batch = torch.export.Dim("batch", min=2, max=40)
    torch.export.export(_Recorder(record), (torch.ones(4, 3),), dynamic_shapes=({0: batch},))
    assert _probes.upper_bound(7) == 7
    assert 40 in seen, seen


class _Recorder(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def test_direct_calls_what_the_operator_calls():
    op = torch.ops.lltm.forward.default
    assert _probes.direct(op) is op._op
    args = make_inputs(2, 3, 4)
    for ours, theirs in zip(_probes.direct(op)(*args), op(*args), strict=True):
        assert torch.equal(ours, theirs)


# --- Without any of them ------------------------------------------------------------------

# In a fresh interpreter: every name the probes read removed from torch while
# lltm/_probes.py runs (as a torch that moved them all would have it), then
# put back for torch's own use; lltm must import, warn once naming them, and
# compute what the reference computes, in eager mode and under torch.func.
_WITHOUT_PROBES = textwrap.dedent(
    """
    import importlib.machinery, json, sys, warnings
    sys.path[:0] = {paths!r}
    import torch, torch.autograd.forward_ad, torch._functorch.utils, torch.autograd.function
    import torch._higher_order_ops.scan

    removed, probes = [], []
    for probe, dotted in {needs!r}:
        *parents, name = dotted.split(".")
        parent = sys.modules.get(".".join(parents))
        # A module's attribute; not a class's (OpOverload._op) nor several names.
        if parent is not None and hasattr(parent, name):
            removed.append((parent, name, getattr(parent, name)))
            probes.append(probe)

    class WithoutThemWhileProbing:
        def find_spec(self, name, path, target=None):
            if name != "lltm._probes":
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            run = spec.loader.exec_module

            def exec_module(module):
                for parent, attribute, _ in removed:
                    delattr(parent, attribute)
                try:
                    run(module)
                finally:
                    for parent, attribute, value in removed:
                        setattr(parent, attribute, value)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, WithoutThemWhileProbing())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import lltm

    from lltm import _probes, reference
    messages = [str(w.message) for w in caught if "lacks what lltm reads" in str(w.message)]
    inputs = [t.requires_grad_() for t in reference.example_inputs(dtype=torch.float64)]
    ours = lltm.lltm_cell(*inputs)
    theirs = reference.lltm_cell(*inputs)
    grads = [torch.autograd.grad(sum(o.sum() for o in out), inputs) for out in (ours, theirs)]
    errors = [float((a - b).abs().max()) for a, b in zip((*ours, *grads[0]), (*theirs, *grads[1]))]
    func = torch.func.grad(lambda w: lltm.lltm_cell(inputs[0], w, *inputs[2:])[0].sum())(inputs[1])
    func_ref = torch.func.grad(lambda w: reference.lltm_cell(inputs[0], w, *inputs[2:])[0].sum())(inputs[1])
    errors.append(float((func - func_ref).abs().max()))
    report = {{"missing": list(_probes.MISSING), "removed": probes, "messages": messages}}
    print(json.dumps({{**report, "errors": errors}}))
    """
)


def test_without_any_probe_lltm_imports_warns_once_and_computes_the_same():
    needs = [(name, probe.needs) for name, probe in _probes.PROBES.items()]
    script = _WITHOUT_PROBES.format(paths=[str(Path(lltm.__file__).parents[1])], needs=needs)
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    # Every probe whose name could be removed fell back; the others read
    # attributes of classes or several names at once.
    assert set(report["missing"]) == set(report["removed"]), report
    assert len(report["removed"]) >= len(_probes.PROBES) - 4, report
    assert len(report["messages"]) == 1, report
    assert max(report["errors"]) < 1e-12, report
