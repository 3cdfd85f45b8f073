"""Every private name of torch that lltm reads, each behind one probe.

torch's public API cannot say everything lltm needs to know: whether a
torch.func transform is running, whether a dispatch mode is active, how to
call a kernel below the autograd key. Those answers come from private names,
which a torch release may rename. Each probe below names what it reads, since
when torch has it, and what lltm does without it; the fallbacks only ever
choose the slower, always-correct path (the operator's own dispatch), never
a different answer. ``import lltm`` never fails because one moved: it warns
once, naming the probes that fell back (:data:`MISSING`).

tests/test_probes.py holds each probe to its contract under every torch of
the test matrix, so a release that moves one shows at once.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import torch
import torch.autograd.forward_ad as _forward_ad

if TYPE_CHECKING:
    from torch._ops import OpOverload


@dataclass(frozen=True)
class Probe:
    """One private name lltm reads, and what it does without it."""

    name: str
    """What the probe answers, as lltm's code calls it."""
    needs: str
    """The private torch names it reads."""
    since: str
    """The oldest torch lltm supports that has them (lltm supports >= 2.10)."""
    fallback: str
    """What lltm does where they are missing."""
    found: bool
    """Whether this torch has them."""


PROBES: dict[str, Probe] = {}


def _lookup(dotted: str) -> Any:
    """The object at ``dotted`` (a path from ``torch``), or None where any part is missing."""
    found: Any = torch
    for part in dotted.split(".")[1:]:
        found = getattr(found, part, None)
        if found is None:
            return None
    return found


def _probe(name: str, needs: str, since: str, fallback: str) -> Any:
    """The object ``needs`` names, recorded as probe ``name`` (None where missing)."""
    found = _lookup(needs)
    PROBES[name] = Probe(name, needs, since, fallback, found is not None)
    return found


# --- What is active ------------------------------------------------------------------

_transforms_active = _probe(
    "functorch_transforms_active",
    "torch._C._are_functorch_transforms_active",
    "2.0",
    "every call is taken to run under a torch.func transform: the operator's full dispatch",
)


# Read on every call of an entry point: torch's own function where it is there
# (no Python frame around it), like the three below.
functorch_transforms_active: Callable[[], bool] = _transforms_active or (lambda: True)
"""Whether a torch.func transform (grad, vmap, jvp, ...) is running."""


_forward_ad_level = _probe(
    "forward_ad_level",
    "torch.autograd.forward_ad._current_level",
    "1.11",
    "every call is taken to run inside a forward-mode AD level: the operator's full dispatch",
)


def forward_ad_active() -> bool:
    """Whether a forward-mode AD level (``torch.autograd.forward_ad.dual_level``) is open."""
    if _forward_ad_level is None:
        return True
    level: int = _forward_ad._current_level  # a module global: read on every call
    return level >= 0


_any_autocast = _probe(
    "any_autocast_enabled",
    "torch._C._is_any_autocast_enabled",
    "2.4",
    "torch.is_autocast_enabled() asked for each device type (slower, same answer)",
)
_AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps", "hpu", "xla", "ipu", "privateuseone")


def _any_autocast_asked_per_device() -> bool:
    for device in _AUTOCAST_DEVICES:
        with contextlib.suppress(RuntimeError):
            if torch.is_autocast_enabled(device):
                return True
    return False


any_autocast_enabled: Callable[[], bool] = _any_autocast or _any_autocast_asked_per_device
"""Whether an autocast region is active for any device type."""


_dispatch_stack_length = _probe(
    "dispatch_modes_active",
    "torch._C._len_torch_dispatch_stack",
    "2.0",
    "every call is taken to run under a TorchDispatchMode: the operator's full dispatch",
)


def dispatch_modes_active() -> bool:
    """Whether a TorchDispatchMode (FakeTensorMode, FlopCounterMode, a user's) is active."""
    return _dispatch_stack_length() > 0 if _dispatch_stack_length is not None else True


_is_tracing = _probe(
    "jit_tracing",
    "torch._C._is_tracing",
    "1.0",
    "torch.jit.is_tracing(), its public wrapper (slower, same answer)",
)


jit_tracing: Callable[[], bool] = _is_tracing or torch.jit.is_tracing
"""Whether ``torch.jit.trace`` is recording."""


# --- float32's matrix products -----------------------------------------------------------

_fp32_precision = _probe(
    "cuda_matmul_fp32_precision",
    "torch._C._get_fp32_precision_getter",
    "2.9",
    "torch.backends.cuda.matmul.fp32_precision, its public wrapper (slower, same answer); "
    "in a torch without that either, torch.get_float32_matmul_precision(), its only setting",
)


def _cuda_matmul_allows_tf32_in_python() -> bool:
    precision = getattr(torch.backends.cuda.matmul, "fp32_precision", None)
    if precision is not None:
        return bool(precision == "tf32")
    return torch.get_float32_matmul_precision() != "highest"


def _cuda_matmul_allows_tf32_in_torch() -> bool:
    return bool(_fp32_precision("cuda", "matmul") == "tf32")


cuda_matmul_allows_tf32: Callable[[], bool] = (
    _cuda_matmul_allows_tf32_in_torch
    if _fp32_precision is not None
    else _cuda_matmul_allows_tf32_in_python
)
"""Whether torch's float32 matrix products on CUDA may use TF32 now (its cuBLAS setting).

What ``torch.backends.cuda.matmul.fp32_precision`` says, resolved through
``torch.backends.cuda.fp32_precision`` and ``torch.backends.fp32_precision``
where it is ``"none"``: the value torch's cuBLAS handles read, and the one
torch.compile's guard on the global state compares.
"""


# --- Calling below autograd ----------------------------------------------------------

_below_autograd = _probe(
    "below_autograd",
    "torch._C._AutoDispatchBelowAutograd",
    "1.9",
    "kernels are called through the Autograd key again (slower, same result)",
)

below_autograd: Callable[[], contextlib.AbstractContextManager[Any]] = (
    _below_autograd if _below_autograd is not None else contextlib.nullcontext
)
"""A context in which the dispatcher skips the Autograd keys, as an Autograd kernel's own
calls do."""

_after_autograd_keyset = _probe(
    "after_autograd_keyset",
    "torch._C._after_autograd_keyset",
    "2.0",
    "an Autograd kernel calls the operator again below the autograd keys instead of "
    "redispatching (the keys before Autograd run again; same result in eager mode)",
)


def redispatch_below_autograd(op: Any, keyset: Any, *args: Any) -> Any:
    """What an Autograd kernel (registered ``with_keyset``) calls for ``op`` below itself."""
    with below_autograd():
        if _after_autograd_keyset is not None:
            return op.redispatch(keyset & _after_autograd_keyset, *args)
        return direct(op)(*args)


_any_requires_grad = _probe(
    "any_requires_grad",
    "torch._C._any_requires_grad",
    "2.0",
    "the same test in Python (slower, same answer)",
)


def _any_requires_grad_in_python(*args: Any) -> bool:
    return any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)


any_requires_grad: Callable[..., bool] = _any_requires_grad or _any_requires_grad_in_python
"""Whether a tensor among its arguments requires grad."""


# --- torch.func --------------------------------------------------------------------------

_SingleLevelFunction = _probe(
    "single_level_function",
    "torch.autograd.function._SingleLevelFunction",
    "2.0",
    "torch.autograd.Function as the base of lltm's Functions: in torch <= 2.13 a "
    "differentiating torch.func transform over lltm's operators then fails with torch's error",
)
_enable_single_level = _probe(
    "enable_single_level_autograd_function",
    "torch._functorch.utils.enable_single_level_autograd_function",
    "2.0",
    "the Functions are applied as they are (see single_level_function)",
)

# The base class of lltm's autograd Functions: one that records its node at
# the level of the torch.func transform running it. (Type checkers read the
# class torch declares; at run time, the probe's answer.)
if TYPE_CHECKING:
    from torch.autograd.function import _SingleLevelFunction as _Declared

    FunctionBase = _Declared
else:
    FunctionBase = (
        _SingleLevelFunction if _SingleLevelFunction is not None else torch.autograd.Function
    )

enable_single_level_function: Callable[[], contextlib.AbstractContextManager[Any]] = (
    _enable_single_level if _enable_single_level is not None else contextlib.nullcontext
)
"""The context in which such a Function may be applied under a torch.func transform."""

_interpreter_stack = _probe(
    "functorch_interpreter_stack",
    "torch._C._functorch.get_interpreter_stack",
    "2.0",
    "every call under a torch.func transform is taken to be nested in a differentiating "
    "one: the plain-torch formulas (unfused, exact)",
)
_transform_types = _probe(
    "functorch_transform_types",
    "torch._C._functorch.TransformType",
    "2.0",
    "as functorch_interpreter_stack",
)
_DIFFERENTIATING = (
    (_transform_types.Grad, _transform_types.Jvp) if _transform_types is not None else ()
)


def nested_differentiation() -> bool:
    """Whether, under torch.func, a differentiating transform encloses the innermost one.

    The differentiating transforms are grad and jvp.
    """
    if _interpreter_stack is None or not _DIFFERENTIATING:
        return True
    enclosing = _interpreter_stack()[:-1]
    return any(level.key() in _DIFFERENTIATING for level in enclosing)


# --- The dispatcher ---------------------------------------------------------------------

_has_kernel = _probe(
    "dispatch_has_kernel",
    "torch._C._dispatch_has_kernel_for_dispatch_key",
    "2.0",
    "the CPU is taken to have a kernel, and CUDA where the plugin loaded (what lltm registers)",
)


def has_kernel(op: str, key: str) -> bool | None:
    """Whether operator ``op`` ("lltm::forward") has a kernel for dispatch key ``key``.

    None where this torch cannot say.
    """
    if _has_kernel is None:
        return None
    try:
        return bool(_has_kernel(op, key))
    except RuntimeError:
        return None


_dispatch_keys = _probe(
    "dispatch_keys",
    "torch._C.DispatchKey",
    "2.0",
    "autocast kernels only for the CPU and CUDA (the keys every torch has); no Python "
    "kernels (see python_kernels)",
)


def has_dispatch_key(name: str) -> bool:
    """Whether this torch has dispatch key ``name`` (e.g. ``AutocastXPU``)."""
    if _dispatch_keys is None:
        return name in ("AutocastCPU", "AutocastCUDA")
    return hasattr(_dispatch_keys, name)


# --- Operators ------------------------------------------------------------------------

# OpOverload._op is set per instance: the probe reads it on one of torch's own.
PROBES["direct_call"] = Probe(
    "direct_call",
    "torch._ops.OpOverload._op",
    "2.0",
    "OpOverload.__call__, which calls the same (one Python frame more per kernel call)",
    hasattr(torch.ops.aten.add.Tensor, "_op"),
)

_Params = ParamSpec("_Params")
_Result = TypeVar("_Result")


def direct(op: OpOverload[_Params, _Result]) -> Callable[_Params, _Result]:
    """What calling ``op`` calls, without the Python frame of ``OpOverload.__call__``.

    The same trip through the dispatcher, which a kernel call would otherwise
    pay a frame for on every call.
    """
    call: Callable[_Params, _Result] = getattr(op, "_op", op)
    return call


# --- Lowering to core ATen (ops/decompositions.py) ---------------------------------------


def _imported(module: str, name: str) -> Any:
    """``module``'s ``name`` (where a package's attribute hides its submodule), or None."""
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None


scan_op: Any = _imported("torch._higher_order_ops.scan", "scan_op")
PROBES["scan"] = Probe(
    "scan",
    "torch._higher_order_ops.scan.scan_op",
    "2.10",
    "a sequence whose length is dynamic cannot be lowered to core ATen (a ValueError says "
    "so); a length fixed at export is unrolled",
    scan_op is not None,
)
"""torch's scan operator (a prototype through 2.15): a loop over a dimension, carrying state."""

PROBES["python_kernels"] = Probe(
    "python_kernels",
    "torch._ops.OpOverload.py_impl, .py_kernels, ._op_dk",
    "2.0",
    "lltm's forward operators are left out of torch.export's default decompositions: "
    "run_decompositions() keeps them, and ONNX and ExecuTorch cannot lower a model holding lltm",
    all(hasattr(torch.ops.aten.add.Tensor, name) for name in ("py_impl", "py_kernels", "_op_dk")),
)


def python_kernels() -> bool:
    """Whether an operator can take Python kernels for the Python dispatcher."""
    return _dispatch_keys is not None and PROBES["python_kernels"].found


def add_python_kernel(op: Any, key: str, kernel: Callable[..., Any]) -> None:
    """Registers ``kernel`` as ``op``'s Python kernel at dispatch key ``key`` (its name)."""
    op.py_impl(getattr(_dispatch_keys, key))(kernel)


def python_kernel(op: Any, key: str) -> Callable[..., Any] | None:
    """``op``'s Python kernel at dispatch key ``key``, or None."""
    kernel: Callable[..., Any] | None = op.py_kernels.get(getattr(_dispatch_keys, key))
    return kernel


def call_kernel(op: Any, key: str, *args: Any) -> Any:
    """Calls ``op``'s kernel at dispatch key ``key`` as the dispatcher would resolve it."""
    return op._op_dk(getattr(_dispatch_keys, key), *args)


def dispatch_key_names(names: tuple[str, ...]) -> list[str]:
    """Those of ``names`` that this torch has as dispatch keys."""
    return [name for name in names if hasattr(_dispatch_keys, name)]


PROBES["inductor_decompositions"] = Probe(
    "inductor_decompositions",
    "torch._inductor.decomposition.decompositions, .fast_random_decomps",
    "2.0",
    "lltm's entries stay in Inductor's tables, read only where Inductor was imported",
    importlib.util.find_spec("torch._inductor") is not None,
)


def inductor_decomposition_tables() -> list[dict[Any, Any]]:
    """Inductor's decomposition tables, where Inductor was imported (never imports it)."""
    inductor = sys.modules.get("torch._inductor.decomposition")
    if inductor is None:
        return []
    tables = [getattr(inductor, "decompositions", {})]
    fast_random = getattr(inductor, "fast_random_decomps", None)
    if fast_random is not None:
        tables.append(fast_random())
    return tables


# A traced size's ShapeEnv exists only once torch.fx.experimental.symbolic_shapes
# is imported (it imports sympy): the method is read from the instance at hand,
# and the probe only asks whether this torch has the module.
PROBES["symbolic_upper_bound"] = Probe(
    "symbolic_upper_bound",
    "torch.fx.experimental.symbolic_shapes.ShapeEnv.bound_sympy",
    "2.1",
    "the upper bounds of traced sizes are taken as unknown: lowering a sequence whose length "
    "and batch size are both dynamic raises a ValueError (torch.onnx.export needs no bound)",
    importlib.util.find_spec("torch.fx.experimental.symbolic_shapes") is not None,
)


def upper_bound(size: Any) -> int | None:
    """The largest value a size of the program being traced can take; None if unbounded."""
    if isinstance(size, int):
        return size
    node: Any = getattr(size, "node", None)
    bound_sympy = getattr(getattr(node, "shape_env", None), "bound_sympy", None)
    if bound_sympy is None:
        return None
    upper = bound_sympy(node.expr).upper
    # A sympy Integer, or an infinity (which sympy also calls an integer).
    return int(upper) if getattr(upper, "is_Integer", False) else None


# --- The report ------------------------------------------------------------------------

MISSING: tuple[str, ...] = tuple(name for name, probe in PROBES.items() if not probe.found)
"""The probes this torch lacks, each falling back as its Probe says."""

if MISSING:
    warnings.warn(
        f"lltm: this torch ({torch.__version__}) lacks what lltm reads for "
        f"{', '.join(MISSING)}; lltm falls back to slower paths that compute the same "
        "(python -m lltm info lists them)",
        RuntimeWarning,
        stacklevel=2,
    )
