"""Bad arguments fail early with one short line that says what to fix.

Every message starts with "lltm:", names the offending argument and what was
expected. Eager kernels (C++), the fake kernels (Python: meta tensors,
torch.compile) and the composite fallback kernel raise the very same message.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import ALL_GRADS, TORCH, kernel_text, make_inputs
from torch._subclasses.fake_tensor import FakeTensorMode

import lltm
from lltm import _errors
from lltm.ops.cell_ops import composite as cell_composite

B, F, S = 2, 3, 4


def _with(**changes):
    """Valid float64 (input, weights, bias, old_h, old_cell) with some replaced."""
    args = dict(
        zip(("input", "weights", "bias", "old_h", "old_cell"), make_inputs(B, F, S), strict=True)
    )
    args.update({name: change(args[name]) for name, change in changes.items()})
    return list(args.values())


# name: (arguments, regex that the message must start with after "lltm: ")
FORWARD_CASES = {
    "input_3d": (
        _with(input=lambda t: t[None]),
        r"input must be 2-D \(batch, input_features\), got shape \(1, 2, 3\)",
    ),
    "input_1d": (_with(input=lambda t: t[0]), r"input must be 2-D .*got shape \(3,\)"),
    "old_h_1d": (
        _with(old_h=lambda t: t[0]),
        r"old_h must be 2-D \(batch, state_size\), got shape \(4,\)",
    ),
    "weights_features": (
        _with(weights=lambda t: t[:, :-1]),
        # The weights (12, 6) imply 2 input features: input, with 3, is named.
        r"input has input_features = 3; the weights expect 2 \(weights have shape \(12, 6\) = "
        r"\(3 \* state_size, state_size \+ input_features\) with state_size = 4\)$",
    ),
    "weights_state": (
        _with(weights=lambda t: t[:-3]),
        r"old_h has state_size = 4; the weights expect 3 \(weights have shape \(9, 7\) = "
        r"\(3 \* state_size, state_size \+ input_features\)\)$",
    ),
    "weights_1d": (
        _with(weights=lambda t: t.flatten()),
        r"weights must have shape .* = \(12, 7\), got \(84,\)",
    ),
    "old_h_batch": (
        _with(old_h=lambda t: t[:1]),
        r"old_h must have shape \(batch, state_size\) = \(2, 4\), got \(1, 4\)",
    ),
    "old_cell_batch": (
        _with(old_cell=lambda t: torch.cat([t, t])),
        r"old_cell must have shape \(batch, state_size\) = \(2, 4\), got \(4, 4\)",
    ),
    "old_cell_state": (
        _with(old_cell=lambda t: t[:, :3]),
        r"old_cell must have shape .* = \(2, 4\), got \(2, 3\)",
    ),
    "bias_size": (
        _with(bias=lambda t: t[:-1]),
        r"bias must have shape \(3 \* state_size,\) = \(12,\), got \(11,\)",
    ),
    "bias_2d": (
        _with(bias=lambda t: t[None]),
        r"bias must have shape \(3 \* state_size,\) = \(12,\), got \(1, 12\)",
    ),
    "weights_dtype": (
        _with(weights=lambda t: t.float()),
        r"weights has dtype torch\.float32 but input has torch\.float64; all arguments must share one floating dtype",
    ),
    "old_cell_dtype": (
        _with(old_cell=lambda t: t.half()),
        r"old_cell has dtype torch\.float16 but input has torch\.float64",
    ),
    "input_int64": (
        [t.long() for t in make_inputs(B, F, S)],
        r"input has dtype torch\.int64; expected torch\.float32, torch\.float64, torch\.float16 or torch\.bfloat16",
    ),
    "input_int32": (
        _with(input=lambda t: t.int()),
        r"input has dtype torch\.int32; expected torch\.float32",
    ),
    "input_bool": (_with(input=lambda t: t > 0), r"input has dtype torch\.bool; expected"),
    "input_float8": (
        [t.to(torch.float8_e4m3fn) for t in make_inputs(B, F, S)],
        r"input has dtype torch\.float8_e4m3fn; expected",
    ),
    "input_complex": (
        [t.to(torch.complex64) for t in make_inputs(B, F, S)],
        r"input has dtype torch\.complex64; expected",
    ),
    "bias_int": (
        _with(bias=lambda t: t.int()),
        r"bias has dtype torch\.int32 but input has torch\.float64",
    ),
    "weights_meta": (
        _with(weights=lambda t: t.to("meta")),
        r"weights is on another device than input",
    ),
    "input_meta": (_with(input=lambda t: t.to("meta")), r"weights is on another device than input"),
    "old_cell_meta": (
        _with(old_cell=lambda t: t.to("meta")),
        r"old_cell is on another device than input",
    ),
}


def _assert_lltm_error(error: BaseException, pattern: str) -> None:
    message = str(error)
    assert isinstance(error, ValueError), f"{type(error).__name__}: {message}"
    assert message.startswith("lltm: "), message
    assert "\n" not in message and len(message) < 200, message
    assert re.match(pattern, message[len("lltm: ") :]), message


def _eager_message(op, args) -> str:
    with pytest.raises(ValueError) as info:
        op(*args)
    return str(info.value)


@pytest.mark.parametrize("case", FORWARD_CASES)
@pytest.mark.parametrize("call", ["functional", "op", "composite"])
def test_forward_errors(case, call):
    args, pattern = FORWARD_CASES[case]
    fn = {
        "functional": lltm.lltm_cell,
        "op": torch.ops.lltm.forward,
        "composite": cell_composite.forward,
    }[call]
    with pytest.raises(ValueError) as info:
        fn(*args)
    _assert_lltm_error(info.value, pattern)


def test_module_reports_the_same_errors():
    rnn = lltm.LLTM(F, S).double()
    x, _, _, h, c = make_inputs(B, F + 1, S)
    with pytest.raises(
        ValueError,
        match=r"^lltm: input has input_features = 4; the weights expect 3 \(weights have shape "
        r"\(12, 7\) = .* with state_size = 4\)$",
    ):
        rnn(x, (h, c))
    x, _, _, h, c = make_inputs(B, F, S + 1)
    with pytest.raises(
        ValueError, match=r"^lltm: old_h has state_size = 5; the weights expect 4 \(weights have"
    ):
        rnn(x, (h, c))
    x, _, _, h, c = make_inputs(B, F, S)
    with pytest.raises(
        ValueError, match=r"^lltm: weights has dtype torch\.float64 but input has torch\.float32"
    ):
        rnn(x.float(), (h.float(), c.float()))


@pytest.mark.parametrize("position", range(5))
def test_non_tensor_argument(position):
    args = make_inputs(B, F, S)
    name = ("input", "weights", "bias", "old_h", "old_cell")[position]
    args[position] = args[position].tolist()
    expected = "a Tensor or None" if name == "bias" else "a Tensor"  # bias is optional
    with pytest.raises(TypeError, match=rf"^lltm: {name} must be {expected}, got list$"):
        lltm.lltm_cell(*args)


# Cases whose tensors can all be moved to the meta device: there the op runs
# its fake kernel, which must say exactly what the C++ kernel says.
SAME_DEVICE_CASES = [name for name in FORWARD_CASES if "meta" not in name]


def _to_meta(args):
    return [t.to("meta") if isinstance(t, torch.Tensor) else t for t in args]


@pytest.mark.parametrize("case", SAME_DEVICE_CASES)
def test_fake_kernel_raises_the_same_forward(case):
    args, _ = FORWARD_CASES[case]
    expected = _eager_message(torch.ops.lltm.forward, args)
    assert _eager_message(torch.ops.lltm.forward, _to_meta(args)) == expected
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) for t in args]
        assert _eager_message(torch.ops.lltm.forward, fake) == expected


def _root_value_error(error: BaseException) -> ValueError | None:
    """The ValueError that torch.compile wrapped (in __cause__ / __context__)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, ValueError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize(
    "case", ["weights_features", "old_h_batch", "bias_size", "weights_dtype", "input_int64"]
)
def test_compile_raises_the_same(case):
    args, _ = FORWARD_CASES[case]
    expected = _eager_message(lltm.lltm_cell, args)
    compiled = torch.compile(lltm.lltm_cell, backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception) as info:
        compiled(*args)
    root = _root_value_error(info.value)
    assert root is not None, f"{type(info.value).__name__}: {info.value}"
    assert str(root) == expected


# --- lltm::backward called directly ---------------------------------------------


def _backward_with(**changes):
    input, weights, bias, old_h, old_cell = make_inputs(B, F, S)
    new_h, new_cell, gates = torch.ops.lltm.forward(input, weights, bias, old_h, old_cell)
    args = dict(
        grad_h=torch.ones_like(new_h),
        grad_cell=torch.ones_like(new_cell),
        new_cell=new_cell,
        gates=gates,
        input=input,
        old_h=old_h,
        weights=weights,
    )
    args.update({name: change(args[name]) for name, change in changes.items()})
    return [*args.values(), ALL_GRADS]


BACKWARD_CASES = {
    "gates_shape": (
        _backward_with(gates=lambda t: t[:, :-1]),
        r"gates must have shape \(batch, 3 \* state_size\) = \(2, 12\), got \(2, 11\)",
    ),
    "grad_h_shape": (
        _backward_with(grad_h=lambda t: t[:1]),
        r"grad_h must have shape \(batch, state_size\) = \(2, 4\), got \(1, 4\)",
    ),
    "grad_cell_shape": (
        _backward_with(grad_cell=lambda t: t[:, :2]),
        r"grad_cell must have shape .* = \(2, 4\), got \(2, 2\)",
    ),
    "new_cell_shape": (
        _backward_with(new_cell=lambda t: t.t()),
        r"new_cell must have shape .* = \(2, 4\), got \(4, 2\)",
    ),
    "weights_shape": (
        _backward_with(weights=lambda t: t[:, 1:]),
        r"input has input_features = 3; the weights expect 2 \(weights have shape \(12, 6\)",
    ),
    "old_h_shape": (
        _backward_with(old_h=lambda t: t[:1]),
        r"old_h must have shape \(batch, state_size\) = \(2, 4\), got \(1, 4\)",
    ),
    "input_1d": (
        _backward_with(input=lambda t: t[0]),
        r"input and old_h must be 2-D, got shapes \(3,\) and \(2, 4\)",
    ),
    "gates_dtype": (
        _backward_with(gates=lambda t: t.float()),
        r"gates has dtype torch\.float32 but input has torch\.float64",
    ),
    "grad_h_dtype": (
        _backward_with(grad_h=lambda t: t.bfloat16()),
        r"grad_h has dtype torch\.bfloat16 but input has torch\.float64",
    ),
    "input_int": (
        [*(t.long() for t in _backward_with()[:-1]), ALL_GRADS],
        r"input has dtype torch\.int64; expected torch\.float32, torch\.float64, torch\.float16 or torch\.bfloat16",
    ),
    "weights_meta": (
        _backward_with(weights=lambda t: t.to("meta")),
        r"weights is on another device than input",
    ),
    "grad_cell_meta": (
        _backward_with(grad_cell=lambda t: t.to("meta")),
        r"grad_cell is on another device than input",
    ),
}


@pytest.mark.parametrize("case", BACKWARD_CASES)
@pytest.mark.parametrize("call", ["op", "composite"])
def test_backward_errors(case, call):
    args, pattern = BACKWARD_CASES[case]
    fn = {"op": torch.ops.lltm.backward, "composite": cell_composite.backward}[call]
    with pytest.raises(ValueError) as info:
        fn(*args)
    _assert_lltm_error(info.value, pattern)


@pytest.mark.parametrize("case", [name for name in BACKWARD_CASES if "meta" not in name])
def test_fake_kernel_raises_the_same_backward(case):
    args, _ = BACKWARD_CASES[case]
    expected = _eager_message(torch.ops.lltm.backward, args)
    assert _eager_message(torch.ops.lltm.backward, _to_meta(args)) == expected


# --- The documented type, under every torch ------------------------------------
# Only the text of a kernel's exception crosses torch's stable ABI: its
# argument errors reach Python as ValueError through torch 2.14 and as
# RuntimeError from 2.15. The kernels say which type they mean in the text
# (csrc/lltm_errors.h), and lltm._errors reads it in one place. The tests
# above hold the result under the torch they run with; these hold the
# mechanism under any torch, fed a kernel's text as each torch delivers it.


@pytest.mark.parametrize(
    ("op", "case"),
    [(lltm.ops.forward, case) for case in FORWARD_CASES if "meta" not in case]
    + [(lltm.ops.backward, case) for case in BACKWARD_CASES if "meta" not in case],
)
@pytest.mark.parametrize("delivered_as", [RuntimeError, ValueError])
def test_a_kernels_argument_error_gets_its_type_back(op, case, delivered_as):
    args, _ = (FORWARD_CASES if op is lltm.ops.forward else BACKWARD_CASES)[case]
    message = _eager_message(op, args)
    raw = kernel_text(op, args)
    assert raw == "lltm: [ValueError] " + message.removeprefix("lltm: ")
    restored = _errors.documented(delivered_as(raw))
    assert type(restored) is ValueError and str(restored) == message


@pytest.mark.parametrize(
    "text",
    [
        "lltm: the matrix product failed: some reason of torch's",
        "lltm: launching lltm forward_kernel failed: unspecified launch failure",
        "not lltm's: the message of a saved-tensor hook",
        "[ValueError] not lltm's either",
    ],
)
def test_a_failure_that_is_no_argument_error_stays_what_it_is(text, monkeypatch):
    # An invalid LLTM_CPU_ISA makes every CPU kernel call an argument error;
    # it changes nothing for errors that did not come from one.
    monkeypatch.setenv("LLTM_CPU_ISA", "no such set")
    assert _errors.documented(RuntimeError(text)) is None


def test_an_out_of_memory_becomes_torch_out_of_memory_error():
    text = "lltm: allocating an output tensor failed: CUDA out of memory. Tried to allocate 2 GiB."
    converted = _errors.documented(RuntimeError(text))
    assert isinstance(converted, torch.OutOfMemoryError) and str(converted) == text
    # Someone else's out-of-memory is not lltm's to convert.
    assert _errors.documented(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB.")) is None


@pytest.mark.parametrize("case", ["weights_features", "old_h_batch", "input_int64", "bias_size"])
def test_inference_mode(case):
    args, pattern = FORWARD_CASES[case]
    with torch.inference_mode():
        # lltm's entry points: the documented type, whatever the torch.
        with pytest.raises(ValueError) as info:
            lltm.lltm_cell(*args)
        _assert_lltm_error(info.value, pattern)
        # So inside an autocast region too, whose kernel is the last Python
        # on the way to the kernel in inference mode.
        with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(ValueError) as info:
            lltm.lltm_cell(*args)
        _assert_lltm_error(info.value, pattern)
        # The operator called directly in inference mode reaches the kernel
        # with no Python in between (no Autograd key): the type is torch's,
        # ValueError through 2.14 (pybind11's for std::invalid_argument),
        # RuntimeError from 2.15; the text names the type lltm means.
        with pytest.raises(Exception) as info:
            torch.ops.lltm.forward(*args)
        assert type(info.value) is (RuntimeError if TORCH >= (2, 15) else ValueError)
        text = str(info.value)
        assert text.startswith("lltm: [ValueError] ") and re.match(pattern, text[19:])


# --- What is valid -------------------------------------------------------------


def test_empty_batch_is_valid():
    args = make_inputs(0, F, S, requires_grad=True)
    new_h, new_cell = lltm.lltm_cell(*args)
    assert new_h.shape == new_cell.shape == (0, S)
    (new_h.sum() + new_cell.sum()).backward()
    # No samples: every parameter gradient is exactly zero.
    assert torch.equal(args[1].grad, torch.zeros_like(args[1]))
    assert torch.equal(args[2].grad, torch.zeros_like(args[2]))


def test_meta_tensors_give_shapes():
    new_h, new_cell, gates = torch.ops.lltm.forward(*_to_meta(make_inputs(B, F, S)))
    assert new_h.device.type == "meta"
    assert (new_h.shape, new_cell.shape, gates.shape) == ((B, S), (B, S), (B, 3 * S))


# --- No C++ backtraces ---------------------------------------------------------

# Raises every error above in a fresh interpreter and prints, as JSON, every
# message caught: what a user sees. With `control`, also an ATen error, whose
# message carries a C++ backtrace under TORCH_SHOW_CPP_STACKTRACES=1: the
# proof that the scan below finds one.
_SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.path[:0] = {paths!r}
    import test_errors as cases
    import lltm, torch

    caught = []
    def attempt(fn, *args):
        try:
            fn(*args)
        except Exception as error:
            caught.append(f"{{type(error).__name__}}: {{error}}")
        else:
            caught.append("no error")

    for args, _ in cases.FORWARD_CASES.values():
        for fn in (lltm.lltm_cell, torch.ops.lltm.forward):
            attempt(fn, *args)
    for args, _ in cases.BACKWARD_CASES.values():
        attempt(torch.ops.lltm.backward, *args)
    if {control!r}:
        attempt(torch.mm, torch.ones(2, 3), torch.ones(2, 3))
    print(json.dumps(caught))
    """
)
BACKTRACE_MARKERS = ("Exception raised from", "frame #", "c10::", "libtorch", "Traceback")


def _raise_all(control: bool = False, **env_changes: str) -> tuple[list[str], str]:
    """(messages caught, stderr) of _SCRIPT in a fresh interpreter."""
    tests_dir = str(Path(__file__).parent)
    paths = [tests_dir, *sys.path]
    env = {k: v for k, v in os.environ.items() if k != "TORCH_SHOW_CPP_STACKTRACES"}
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT.format(paths=paths, control=control)],
        capture_output=True,
        text=True,
        env={**env, **env_changes},
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1]), result.stderr


def _backtraces(messages: list[str], stderr: str) -> list[str]:
    """Markers of a C++ or Python backtrace, in stderr or in any message."""
    return [m for m in BACKTRACE_MARKERS for text in (stderr, *messages) if m in text]


def test_errors_print_no_cpp_backtrace():
    messages, stderr = _raise_all()
    assert len(messages) == 2 * len(FORWARD_CASES) + len(BACKWARD_CASES)
    for message in messages:
        assert message.startswith("ValueError: lltm: ") and "\n" not in message, message
    assert not _backtraces(messages, stderr), stderr + "\n".join(messages)


def test_backtrace_scan_finds_a_cpp_backtrace():
    # The same run plus one ATen error, with C++ backtraces switched on: the
    # scan must see it (and still not in lltm's own messages).
    messages, _ = _raise_all(control=True, TORCH_SHOW_CPP_STACKTRACES="1")
    *ours, aten = messages
    # torch 2.15 names the operator in front of its message.
    prefix = "mm: " if TORCH >= (2, 15) else ""
    assert aten.startswith(f"RuntimeError: {prefix}mat1 and mat2 shapes cannot be multiplied")
    assert "Exception raised from" in _backtraces([aten], "")
    assert not _backtraces(ours, "")
