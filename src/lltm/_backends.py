"""Which kernels serve which device, and why.

lltm always has its CPU kernels (lltm._C). CUDA kernels live in a separate
distribution, ``lltm-cuda<major>``, whose import package ``lltm_cuda<major>``
registers them when imported. At ``import lltm`` this module imports the
plugin matching torch's CUDA major version, if it is there and usable, and
records why not otherwise (never raising: ``import lltm`` must work whatever
is installed).

The composite kernel (each operator family's composite.py, in lltm/ops) is
every operator's default for all devices (registered from the operators'
table, lltm/ops/registration.py). Native kernels are
more specific dispatch entries and win where they exist; elsewhere (CUDA
without the plugin, MPS, XPU, ...) the op still runs on the tensors' own
device, after one warning (:func:`warning_first`) that says why and what
fixes it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from . import _native, _probes
from ._version import __version__

SUPPORTED_CUDA_MAJORS = (12, 13)


@dataclass(frozen=True)
class PluginStatus:
    """Outcome of looking for the CUDA plugin at import time."""

    loaded: bool
    """True when the plugin's CUDA kernels are registered with torch."""
    module: str | None
    """Import name of the plugin found (``lltm_cuda13``), or None."""
    reason: str
    """One sentence: what was found and why the kernels are (not) active."""
    fix: str | None
    """What the user can do about it, when there is something to do."""


def _installed_plugins() -> list[str]:
    return [
        f"lltm_cuda{major}"
        for major in SUPPORTED_CUDA_MAJORS
        if importlib.util.find_spec(f"lltm_cuda{major}") is not None
    ]


def _without_cuda_torch(installed: list[str]) -> PluginStatus:
    found = f"{', '.join(installed)} is installed but " if installed else ""
    if torch.version.hip is not None:
        return PluginStatus(
            loaded=False,
            module=installed[0] if installed else None,
            reason=f"{found}torch {torch.__version__} is a ROCm build; lltm has no ROCm kernels",
            fix=None,
        )
    return PluginStatus(
        loaded=False,
        module=installed[0] if installed else None,
        reason=f"{found}torch {torch.__version__} is a CPU-only build",
        fix="install a CUDA build of torch, then: pip install 'lltm[cuda]'",
    )


def _plugin_for(torch_cuda: str) -> str:
    """Import name of the plugin for torch's CUDA version: '13.0' -> lltm_cuda13."""
    return f"lltm_cuda{torch_cuda.split('.')[0]}"


def _missing_plugin(installed: list[str], torch_cuda: str) -> PluginStatus:
    major = int(torch_cuda.split(".")[0])
    torch_is = f"torch {torch.__version__} uses CUDA {torch_cuda}"
    if major not in SUPPORTED_CUDA_MAJORS:
        supported = " or ".join(str(m) for m in SUPPORTED_CUDA_MAJORS)
        return PluginStatus(
            loaded=False,
            module=installed[0] if installed else None,
            reason=f"{torch_is}; lltm's CUDA kernels exist for CUDA {supported} only",
            fix=f"install a torch built for CUDA {supported}, then: pip install 'lltm[cuda]'",
        )
    fix = f"pip install 'lltm[cuda{major}]=={__version__}'"
    if installed:
        return PluginStatus(
            loaded=False,
            module=installed[0],
            reason=f"{', '.join(installed)} is installed, but {torch_is}, which needs {_plugin_for(torch_cuda)}",
            fix=fix,
        )
    return PluginStatus(
        loaded=False,
        module=None,
        reason=f"the CUDA kernels (lltm-cuda{major}) are not installed",
        fix=fix,
    )


def _load_plugin(name: str) -> PluginStatus:
    # Importing the extension module itself (not just the package) registers
    # the kernels even when `import lltm_cudaNN` is what started `import lltm`.
    distribution = name.replace("_", "-")
    reinstall = f"pip install --force-reinstall --no-deps '{distribution}=={__version__}'"
    try:
        native = importlib.import_module(f"{name}._C")
    except _native.DamagedLibrary as error:  # checked before loading: never loaded
        return PluginStatus(
            loaded=False, module=name, reason=f"{name} is damaged ({error.damage})", fix=reinstall
        )
    except Exception as error:  # noqa: BLE001 - any failure must leave lltm usable
        return PluginStatus(
            loaded=False,
            module=name,
            reason=f"{name} failed to load ({type(error).__name__}: {error})",
            fix=reinstall,
        )
    built_from = getattr(native, "lltm_version", None)
    cuda = getattr(native, "cuda_version", "?")
    if built_from != __version__:
        # Loaded anyway: the kernels implement lltm's schemas, so say it loudly.
        return PluginStatus(
            loaded=True,
            module=name,
            reason=f"{name} {built_from} (CUDA {cuda}) is loaded but lltm is {__version__}",
            fix=reinstall,
        )
    return PluginStatus(
        loaded=True, module=name, reason=f"{name} {built_from} (CUDA {cuda}) loaded", fix=None
    )


def _find_and_load_plugin() -> PluginStatus:
    installed = _installed_plugins()
    torch_cuda = torch.version.cuda
    if torch_cuda is None:
        return _without_cuda_torch(installed)
    if _plugin_for(torch_cuda) not in installed:
        return _missing_plugin(installed, torch_cuda)
    return _load_plugin(_plugin_for(torch_cuda))


def has_native_kernel(device_type: str, op: str = "lltm::forward") -> bool:
    """True when a compiled lltm kernel is registered for ``device_type``."""
    key = {"cpu": "CPU", "cuda": "CUDA"}.get(device_type, device_type.upper())
    found = _probes.has_kernel(op, key)
    if found is None:  # this torch cannot say: what lltm registers
        return device_type == "cpu" or (device_type == "cuda" and PLUGIN.loaded)
    return found


# Per CUDA device: "" when the plugin's kernels run there, else why not.
_device_problems: dict[int, str] = {}
# Held while a device is probed: the first thread to ask about a device
# probes it, the others wait for its answer (with or without a GIL).
_probe_lock = threading.Lock()


def device_problem(index: int) -> str:
    """Why the loaded plugin's kernels cannot run on CUDA device ``index``, or "".

    No code for its architecture, compiled or as PTX the driver can JIT. Asked
    of the plugin until it can tell, then remembered; creates that device's
    context (and no other). Safe from any thread: one probe and at most one
    warning per device.
    """
    known = _device_problems.get(index)
    if known is not None:
        return known
    with _probe_lock:
        known = _device_problems.get(index)
        if known is not None:
            return known  # another thread probed it meanwhile
        native = sys.modules.get(f"{PLUGIN.module}._C") if PLUGIN.loaded else None
        probe = getattr(native, "kernel_image_problem", None)
        try:
            problem = probe(index) if probe is not None else ""
        except RuntimeError:
            # The probe could not tell now (no memory for the context, the
            # device busy): nothing is remembered, and the fused kernels run,
            # reporting their own error should the device stay unusable.
            return ""
        _device_problems[index] = problem
    if problem:
        archs = getattr(native, "cuda_archs", "?").replace("/", ";")
        warnings.warn(
            f"lltm: {PLUGIN.module} cannot run on cuda:{index}: {problem}; CUDA tensors on "
            "that device run the composite PyTorch implementation. For the fused kernels "
            f"there, build {str(PLUGIN.module).replace('_', '-')} with its compute capability in "
            f"TORCH_CUDA_ARCH_LIST (this one has {archs})",
            RuntimeWarning,
            stacklevel=3,
        )
    return problem


# torch.compiler.assume_constant_result returns the function it marks.
_constant_for_compile: Callable[[Callable[[int], bool]], Callable[[int], bool]] = (
    torch.compiler.assume_constant_result
)


@_constant_for_compile
def fused_kernels_run_on(index: int) -> bool:
    """False where lltm's CUDA plugin is loaded but cannot run on device ``index``.

    Its callers then use the composite kernel for that device's tensors.
    (Without a loaded plugin the dispatcher already does.) A constant for
    torch.compile: a graph is traced for one device.
    """
    return not PLUGIN.loaded or not device_problem(index)


def cuda_status() -> tuple[bool, str]:
    """(CUDA kernels usable now, explanation). Queries the driver: not at import."""
    if not PLUGIN.loaded:
        return False, f"{PLUGIN.reason}; CUDA tensors use the composite PyTorch path"
    if not torch.cuda.is_available():
        return False, f"{PLUGIN.reason}, but no CUDA device or driver is available"
    return True, f"{PLUGIN.reason}; {torch.cuda.device_count()} CUDA device(s)"


def sequence_path(index: int, dtype: torch.dtype, batch: int, state: int) -> dict[str, str] | None:
    """How the fused sequence op runs on CUDA device ``index`` for this dtype, batch and state.

    ``{"forward": ..., "backward": ...}``: the persistent kernels' mode and
    split, or the per-step path and why (the rule of
    csrc/cuda/lltm_cuda_persistent_plan.h, as the plugin answers it for that
    device now, in float32 under torch's float32 matmul setting now, as a call
    would pass it (ops/precision.py); ``LLTM_CUDA_PERSISTENT=0`` and a plan
    forced by ``LLTM_CUDA_PLAN``, or why it gave way to the rule's, included). None where the plugin
    is not loaded or predates that rule. Creates that device's context.
    """
    native = sys.modules.get(f"{PLUGIN.module}._C") if PLUGIN.loaded else None
    query: Callable[[int, int, int, int, bool], str] | None = getattr(native, "sequence_path", None)
    if query is None:
        return None
    element_size = torch.empty((), dtype=dtype).element_size()
    tf32 = dtype == torch.float32 and _probes.cuda_matmul_allows_tf32()
    try:
        text = query(index, element_size, batch, state, tf32)
    except RuntimeError as error:
        return {"forward": f"unknown ({error})", "backward": f"unknown ({error})"}
    return dict(line.split(": ", 1) for line in text.splitlines())


# torch.backends.cudnn.benchmark as last passed to the CUDA plugin, which
# starts with it off. The plugin is a stable-ABI library that cannot ask
# torch for it.
_measuring = False


def mirror_benchmark() -> None:
    """Passes ``torch.backends.cudnn.benchmark`` to the CUDA plugin where it changed.

    Set, the plugin's sequence ops time every plan that fits a new kind of
    call on its GPU and keep the fastest (csrc/cuda/lltm_cuda_persistent_
    measuring.h). Called for calls on CUDA tensors, outside torch.compile's
    tracing (a compiled graph runs with the value last seen: it is a speed
    hint, never a change of results): one read of torch's flag per call, one
    C call when it changes. Without a loaded plugin, nothing is called.
    """
    global _measuring
    on = bool(torch.backends.cudnn.benchmark)
    if on is _measuring:
        return
    native = sys.modules.get(f"{PLUGIN.module}._C") if PLUGIN.loaded else None
    setter: Callable[[bool], bool] | None = getattr(native, "set_measuring", None)
    if setter is None:
        return
    setter(on)
    _measuring = on


@dataclass(frozen=True)
class MeasuredPlan:
    """A plan the CUDA plugin measured for one kind of sequence call, and its candidates."""

    pass_: str
    """``forward``, ``inference`` (no gates or cells kept) or ``backward``."""
    dtype: str
    tf32: bool
    batch: int
    state: int
    schedule: str
    """``50 steps``, or ``packed, 50 steps`` (``, reverse``)."""
    chosen: str
    candidates: tuple[tuple[str, float | None], ...]
    """(plan, milliseconds; None where the GPU refused its launch), in the order timed."""

    def render(self) -> str:
        """Lines: the call and the plan chosen, then each candidate's time."""
        precision = ", tf32" if self.tf32 else ""
        lines = [
            f"{self.pass_} {self.dtype}{precision} batch {self.batch} state {self.state} "
            f"({self.schedule}): {self.chosen}"
        ]
        for plan, ms in self.candidates:
            time = "refused by the GPU" if ms is None else f"{ms * 1000:.1f} us"
            lines.append(f"  {time:>18}  {plan}")
        return "\n".join(lines)


def parse_measured_plans(text: str) -> list[MeasuredPlan]:
    """The plugin's listing of measured plans (tab-separated lines) as MeasuredPlans."""
    plans: list[MeasuredPlan] = []
    head: list[str] | None = None
    candidates: list[tuple[str, float | None]] = []

    def close() -> None:
        if head is not None:
            pass_, dtype, tf32, batch, state, schedule, chosen = head
            plans.append(
                MeasuredPlan(
                    pass_,
                    dtype,
                    tf32 == "1",
                    int(batch),
                    int(state),
                    schedule,
                    chosen,
                    tuple(candidates),
                )
            )

    for line in text.splitlines():
        kind, *fields = line.split("\t")
        if kind == "plan" and len(fields) == 7:
            close()
            head, candidates = fields, []
        elif kind == "candidate" and len(fields) == 2 and head is not None:
            ms, plan = fields
            candidates.append((plan, None if ms == "refused" else float(ms)))
    close()
    return plans


def measured_plans() -> list[MeasuredPlan]:
    """The plans the CUDA plugin measured (``torch.backends.cudnn.benchmark``), most recent first.

    Empty where the plugin is not loaded, predates measured plans or measured nothing yet.
    """
    native = sys.modules.get(f"{PLUGIN.module}._C") if PLUGIN.loaded else None
    query: Callable[[], str] | None = getattr(native, "measured_plans", None)
    return parse_measured_plans(query()) if query is not None else []


_warned: set[str] = set()
_warn_lock = threading.Lock()


def _warn_composite(device: torch.device) -> None:
    with _warn_lock:
        if device.type in _warned:
            return
        _warned.add(device.type)
    if device.type == "cuda":
        why, fix = PLUGIN.reason, PLUGIN.fix or "pip install 'lltm[cuda]'"
    else:
        why, fix = f"lltm has no native {device.type} kernel", None
    message = f"lltm: {why}; running the composite PyTorch implementation on {device.type}"
    if fix:
        message += f". For the fused kernels: {fix}"
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def warning_first(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """A forward kernel that warns once per device type before running.

    The composite kernel of a forward operator: the backward ones only run
    after a forward has.
    """

    def run(input: torch.Tensor, *args: Any) -> Any:
        _warn_composite(input.device)
        return kernel(input, *args)

    return run


# Last: importing the plugin imports lltm.ops, which registers the composite
# kernels through warning_first above.
PLUGIN: PluginStatus = _find_and_load_plugin()
if PLUGIN.module is not None and PLUGIN.fix is not None:
    # A plugin is installed yet unusable or mismatched: say so once, at import.
    warnings.warn(
        f"lltm: CUDA kernels {'mismatched' if PLUGIN.loaded else 'unavailable'}: "
        f"{PLUGIN.reason}. Fix: {PLUGIN.fix}",
        RuntimeWarning,
        stacklevel=2,
    )
