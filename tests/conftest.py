"""Helpers shared by lltm's tests.

Inputs are drawn from a seeded generator so every failure reproduces; the
shapes follow the op's contract (see lltm.functional.lltm_cell).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Generator, Sequence
from pathlib import Path

import pytest
import torch
from torch import Tensor

ARG_NAMES = ("input", "weights", "bias", "old_h", "old_cell")

# The torch under test, comparable with tuples: `TORCH >= (2, 15)`. Where torch
# itself differs between releases (its messages, what crosses its stable
# ABI), tests state the condition and assert what each release gives.
TORCH = torch.torch_version.TorchVersion(torch.__version__)


_INDUCTOR_CACHE_KEY = pytest.StashKey[tuple[str, str | None]]()


def pytest_configure(config: pytest.Config) -> None:
    # torch.compile caches compiled graphs on disk, keyed by the forward graph:
    # a backward compiled against an older lltm would be reused. Tests compile
    # the code under test, in a cache of their own, removed at the end.
    cache = tempfile.mkdtemp(prefix="lltm-inductor-")
    config.stash[_INDUCTOR_CACHE_KEY] = (cache, os.environ.get("TORCHINDUCTOR_CACHE_DIR"))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache


def pytest_unconfigure(config: pytest.Config) -> None:
    if _INDUCTOR_CACHE_KEY not in config.stash:
        return
    cache, before = config.stash[_INDUCTOR_CACHE_KEY]
    if before is None:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    else:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = before
    shutil.rmtree(cache, ignore_errors=True)


# Per-test timeout of the slow tests (pytest-timeout; the others get the
# `timeout` of pyproject.toml): above the longest deadline of a command they run,
# compute-sanitizer's 3600 s on a GPU (tests/test_cuda_robustness.py). The
# slowest here, 111 s, is the first of tests/test_fallback.py's: it also creates
# the cached environments (a CUDA torch).
SLOW_TEST_TIMEOUT_S = 3900


def _time_out_slow_tests(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("timeout"):
        return  # without pytest-timeout there is no `timeout` marker
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TEST_TIMEOUT_S))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    error = call.excinfo.value if call.excinfo else None
    if isinstance(error, subprocess.TimeoutExpired):
        # A command past its deadline: what it wrote before it was killed.
        for stream, data in (("stdout", error.stdout), ("stderr", error.stderr)):
            if data:
                text = data.decode(errors="replace") if isinstance(data, bytes) else data
                report.sections.append((f"{stream} of the command until its timeout", text))
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    # The fuzz tests' worst error per dtype (tests/test_fuzz.py), when they ran.
    fuzz = sys.modules.get("test_fuzz")
    if fuzz is not None:
        fuzz.report(terminalreporter)


def input_shapes(batch: int, features: int, state: int) -> list[tuple[int, ...]]:
    """Shapes of (input, weights, bias, old_h, old_cell)."""
    return [
        (batch, features),
        (3 * state, state + features),
        (3 * state,),
        (batch, state),
        (batch, state),
    ]


def kernel_text(op, args) -> str:
    """The text of the error a kernel raises for ``args``, as it crosses torch's stable ABI.

    Called inside inference mode, where no Python of lltm's runs between the
    caller and the kernel (no Autograd key): what torch >= 2.15 hands over as
    a RuntimeError, and earlier torches as a ValueError.
    """
    with torch.inference_mode():
        try:
            op(*args)
        except (RuntimeError, ValueError) as error:
            return str(error)
    raise AssertionError(f"{op} raised nothing")


def make_inputs(
    batch: int,
    features: int,
    state: int,
    dtype: torch.dtype = torch.float64,
    requires_grad: bool = False,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> list[Tensor]:
    """(input, weights, bias, old_h, old_cell), standard normal, reproducible.

    Values are drawn in float64 on the CPU and then converted, so the same seed
    gives the same numbers (up to rounding) whatever the dtype and device.
    """
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.randn(shape, generator=generator, dtype=torch.float64)
        .to(device=device, dtype=dtype)
        .requires_grad_(requires_grad)
        for shape in input_shapes(batch, features, state)
    ]


# lltm::backward's output_mask asking for all five gradients.
ALL_GRADS = [True] * 5


def make_backward_args(
    inputs: list[Tensor], output_mask: Sequence[bool] = ALL_GRADS
) -> tuple[Tensor | list[bool], ...]:
    """Arguments of lltm::backward for one forward of ``inputs``, with random
    upstream gradients: (grad_h, grad_cell, new_cell, gates, input, old_h,
    weights, output_mask)."""
    new_h, new_cell, gates = torch.ops.lltm.forward(*inputs)
    input, weights, _, old_h, _ = inputs
    grad_h, grad_cell = make_grad_outputs(new_h, new_cell)
    return (grad_h, grad_cell, new_cell, gates, input, old_h, weights, list(output_mask))


def make_grad_outputs(new_h: Tensor, new_cell: Tensor, seed: int = 1) -> tuple[Tensor, Tensor]:
    """Random upstream gradients for (new_h, new_cell): catches a swapped or
    dropped gradient, which an all-ones cotangent (``.sum()``) can hide."""
    generator = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(t.shape, generator=generator, dtype=torch.float64).to(t.device, t.dtype)
        for t in (new_h, new_cell)
    )


def run_cell(
    cell: Callable[..., tuple[Tensor, Tensor]], inputs: Sequence[Tensor], seed: int = 1
) -> tuple[list[Tensor], list[Tensor]]:
    """Forward and backward of ``cell`` on fresh leaf copies of ``inputs``.

    Returns ``([new_h, new_cell], [grad of each input])``; the arguments given
    are left untouched, so one input set can feed several cells.
    """
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    outputs = cell(*leaves)
    grads = torch.autograd.grad(outputs, leaves, make_grad_outputs(*outputs, seed=seed))
    return [t.detach() for t in outputs], list(grads)


def assert_all_close(
    actual: Sequence[Tensor], expected: Sequence[Tensor], names: Sequence[str], **tol
) -> None:
    """torch.testing.assert_close over pairs, naming the pair that differs."""
    for name, a, e in zip(names, actual, expected, strict=True):
        torch.testing.assert_close(a, e, msg=lambda m, name=name: f"{name}: {m}", **tol)


def rms(t: Tensor) -> float:
    """Root mean square of ``t`` (0 for an empty tensor)."""
    return t.double().pow(2).mean().sqrt().item() if t.numel() else 0.0


def assert_as_accurate_as_reference(
    names: Sequence[str],
    ours: Sequence[Tensor],
    theirs: Sequence[Tensor],
    exact: Sequence[Tensor],
    dtype: torch.dtype,
) -> None:
    """lltm's results in ``dtype`` are no less accurate than the reference's.

    ``theirs`` is the reference run in ``dtype`` on the same device (plain
    PyTorch sets the bar), ``exact`` the reference in float64 on the same
    rounded inputs. Errors are relative to each tensor's RMS and bounded in
    units of ``dtype``'s epsilon, whatever the dtype: the RMS error (a stable
    statistic over many elements) within twice the reference's + eps/8, and
    the worst element within twice the reference's + 8 eps (a few wrong
    elements, which the RMS averages away). A kernel that is off by a
    systematic 1 % (bfloat16's epsilon is 0.8 %) fails; see
    test_parity.test_accuracy_check_rejects_broken_kernels.
    """
    eps = torch.finfo(dtype).eps
    for name, a, r, e in zip(names, ours, theirs, exact, strict=True):
        assert a.dtype == dtype and a.shape == e.shape, f"{name}: {a.dtype} {tuple(a.shape)}"
        if not e.numel():
            continue
        scale = max(rms(e), 1e-30)
        a, r, e = a.detach().cpu().double(), r.detach().cpu().double(), e.detach().cpu().double()
        ours_rms, theirs_rms = rms(a - e) / scale, rms(r - e) / scale
        assert ours_rms <= 2 * theirs_rms + eps / 8, (
            f"{name}: RMS error {ours_rms / eps:.2f} eps, reference in {dtype}: "
            f"{theirs_rms / eps:.2f} eps"
        )
        ours_max = (a - e).abs().max().item() / scale
        theirs_max = (r - e).abs().max().item() / scale
        assert ours_max <= 2 * theirs_max + 8 * eps, (
            f"{name}: worst error {ours_max / eps:.2f} eps, reference in {dtype}: "
            f"{theirs_max / eps:.2f} eps"
        )


OUTPUT_NAMES = ("new_h", "new_cell")
GRAD_NAMES = tuple(f"grad_{name}" for name in ARG_NAMES)


# --- Which kernels serve the ops on CPU tensors ------------------------------------------
#
# A test module that says ``pytestmark = pytest.mark.usefixtures("kernels")``
# runs each of its tests twice: against lltm's CPU kernels, and against the
# CUDA sources built for the host (tests/cuda_host/), which then serve
# lltm's ops on CPU tensors through every entry point. The second runs in
# ``nox -s cuda_host`` (``-m cuda_host``) and is skipped, saying so, elsewhere.
# A test about the CPU kernels alone says ``@pytest.mark.cpu_kernels_only``.

KERNELS = ["cpu", pytest.param("cuda_host", marks=pytest.mark.cuda_host)]


@pytest.fixture(scope="module", params=KERNELS)
def kernels(request: pytest.FixtureRequest):
    """ "cpu" (lltm's CPU kernels) or "cuda_host" (csrc/cuda built for the
    host, routed to lltm's ops for the module's tests)."""
    if request.param == "cpu":
        yield request.param
        return
    import cuda_host

    with cuda_host.routed():
        yield request.param


# torch.compile's inductor backend, as a test parameter: inductor calls lltm's
# ops as extern kernels, as aot_eager does, so the CUDA sources run under
# torch.compile in the aot_eager case; inductor's compile (a minute) is spared
# the host build's session.
INDUCTOR = pytest.param(
    "inductor",
    marks=pytest.mark.cpu_kernels_only(reason="aot_eager runs the kernels under torch.compile"),
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _time_out_slow_tests(config, items)
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or callspec.params.get("kernels") != "cuda_host":
            continue
        marker = item.get_closest_marker("cpu_kernels_only")
        if marker is not None:
            reason = marker.kwargs.get("reason", "about lltm's CPU kernels alone")
            item.add_marker(pytest.mark.skip(reason=f"not a CUDA source: {reason}"))
        else:
            import cuda_host

            if not cuda_host.ENABLED:
                item.add_marker(pytest.mark.skip(reason=cuda_host.SKIPPED))


@pytest.fixture
def fresh_dynamo():
    """torch.compile caches and counters cleared before and after a test."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def restore_num_threads():
    """Puts torch's intra-op thread count back after a test changes it."""
    threads = torch.get_num_threads()
    yield threads
    torch.set_num_threads(threads)


# --- Binaries: which symbols they take from torch ---------------------------------

# C++ namespaces of torch's unstable ABI. A library that references any of them
# is tied to the exact torch it was built with ("undefined symbol" after an
# upgrade); one that calls only torch's C shim (aoti_torch_*, torch_*) is not.
UNSTABLE_NAMESPACES = ("at::", "c10::", "torch::", "caffe2::", "aten::")


def undefined_symbols(library: Path) -> list[str]:
    """The undefined dynamic symbols of ``library``, demangled (nm -DC)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("checks ELF dynamic symbols (nm -D): Linux only")
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (GNU binutils) is not installed: cannot list the library's symbols")
    result = subprocess.run(
        [nm, "-DC", "--undefined-only", str(library)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    # Lines look like "                 U aoti_torch_get_dim".
    return [line.split(None, 1)[1] for line in result.stdout.splitlines() if line.strip()]


def needed_libraries(library: Path) -> list[str]:
    """The shared libraries ``library`` names as dependencies (DT_NEEDED)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("reads the ELF dynamic section (readelf -d): Linux only")
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf (GNU binutils) is not installed: cannot list the dependencies")
    result = subprocess.run(
        [readelf, "-d", str(library)], capture_output=True, text=True, check=True, timeout=120
    )
    # Lines look like " 0x...01 (NEEDED)  Shared library: [libc10.so]".
    return [
        line.rsplit("[", 1)[1].rstrip("]")
        for line in result.stdout.splitlines()
        if "(NEEDED)" in line
    ]


def unstable_symbols(symbols: Sequence[str]) -> list[str]:
    """Those of ``symbols`` in torch's unstable C++ ABI (also as template or
    function arguments, e.g. ``foo(c10::IValue)``)."""
    return [s for s in symbols if s.startswith(UNSTABLE_NAMESPACES) or "c10::" in s or "at::" in s]


def assert_worst_case_as_reference(dtype: torch.dtype, device: str = "cpu") -> None:
    """Worst-case (max) error of new_h / new_cell against the float64 oracle,
    at most twice the reference's in the same dtype: wide layers make the
    pre-activations large, where 16-bit rounding costs most. Rounding them to
    16 bits more than once (e.g. after each of two GEMMs into a 16-bit
    buffer) loses here, while RMS errors barely move."""
    import lltm
    from lltm import reference

    for seed in range(3):
        inputs = make_inputs(2, 64, 300, dtype=dtype, device=device, seed=seed)
        ours = lltm.lltm_cell(*inputs)
        theirs = reference.lltm_cell(*inputs)
        expected = reference.lltm_cell(*[t.double() for t in inputs])
        for name, t, r, e in zip(OUTPUT_NAMES, ours, theirs, expected, strict=True):
            err, ref_err = ((x.double() - e).abs().max().item() for x in (t, r))
            assert err <= 2 * ref_err + torch.finfo(dtype).eps / 8, (
                f"{name}: {err:.2e} vs {ref_err:.2e}"
            )
