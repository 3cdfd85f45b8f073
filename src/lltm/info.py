"""``python -m lltm info``: what is installed and which kernel serves which device.

In the spirit of ``python -m torch.utils.collect_env``: one screen to paste
into a bug report.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from . import _C, _backends, _probes, cmake_prefix_path
from ._version import __version__
from .ops import precision

PACKAGE_DIR = Path(__file__).resolve().parent
# (batch, state) of the sequences whose GPU path `info` shows: those of the
# GPU benchmarks (16x32x128, 8x32x256, 64x256x512).
SEQUENCE_SIZES = ((16, 128), (8, 256), (64, 512))
# ... in float32 and in 16 bits, what autocast runs: the rule plans by the
# size of an element, so bfloat16 answers for float16 too.
SEQUENCE_DTYPES = {"float32": torch.float32, "16-bit": torch.bfloat16}


def _target_version(code: str) -> str:
    """0x020a000000000000 -> '2.10'."""
    value = int(code, 16)
    return f"{value >> 56}.{(value >> 48) & 0xFF}"


def _installed_distribution() -> metadata.Distribution | None:
    try:
        return metadata.distribution("lltm")
    except metadata.PackageNotFoundError:
        return None


def _newest_source(root: Path) -> Path | None:
    sources = [p for p in (root / "csrc").rglob("*") if p.suffix in (".h", ".cpp", ".cu", ".cuh")]
    return max(sources, key=lambda p: p.stat().st_mtime, default=None)


def provenance() -> dict[str, Any]:
    """Where lltm and its compiled library were imported from, and what is amiss.

    That is, whether they are what the user most likely meant to run.

    Problems found: an installed distribution shadowed by another copy of
    the package earlier on sys.path (a source checkout, ``src/`` on
    PYTHONPATH); a compiled library built from another lltm version, older
    than the C++ sources next to it (a stale in-place build). (One changed
    since the wheel installed it never gets this far: lltm/_integrity.py
    refuses to load it.)
    """
    library = _C.library.resolve()
    built_from = getattr(_C, "lltm_version", None)
    problems: list[str] = []
    dist = _installed_distribution()
    installed_dir: Path | None = None
    installed_version = None
    mode = "source tree, not installed"
    if dist is not None:
        installed_version = dist.version
        files = {f.as_posix(): f for f in dist.files or []}
        if "lltm/__init__.py" in files:
            located = dist.locate_file(files["lltm/__init__.py"])
            installed_dir = Path(str(located)).resolve().parent
            mode = f"installed: lltm {installed_version} at {installed_dir}"
        else:
            mode = f"editable install of lltm {installed_version}"
    if installed_dir is not None and installed_dir != PACKAGE_DIR:
        problems.append(
            f"lltm is imported from {PACKAGE_DIR}, which shadows the installed lltm "
            f"{installed_version} at {installed_dir} (a source tree earlier on sys.path, e.g. src/ on "
            "PYTHONPATH or the current directory): run from elsewhere, or unset PYTHONPATH"
        )
    if built_from is None:
        problems.append(
            f"{library.name} carries no version: a build of an older lltm; rebuild it "
            "(python setup.py build_ext --inplace) or reinstall lltm"
        )
    elif built_from != __version__:
        problems.append(
            f"{library} was built from lltm {built_from} but the Python package is lltm "
            f"{__version__}: rebuild it (python setup.py build_ext --inplace) or reinstall lltm"
        )
    if installed_dir is None or installed_dir != PACKAGE_DIR:
        # A source tree: the library should be newer than every C++ source.
        newest = _newest_source(PACKAGE_DIR.parent.parent)
        if newest is not None and newest.stat().st_mtime > library.stat().st_mtime:
            problems.append(
                f"{library} is older than {newest}: a stale in-place build; rebuild it "
                "(python setup.py build_ext --inplace)"
            )
    return {
        "package": str(PACKAGE_DIR),
        "library": str(library),
        "library_version": built_from,
        "install": mode,
        "problems": problems,
    }


def _cpu_isa() -> tuple[str | None, str | None]:
    """(instruction set of the CPU kernels, None) or (None, why there is none).

    An invalid LLTM_CPU_ISA is reported here, not raised.
    """
    try:
        return _C.cpu_isa(), None
    except ValueError as error:
        return None, str(error)


def _sequence_paths(index: int) -> dict[str, dict[str, str]]:
    """How sequences of SEQUENCE_SIZES and SEQUENCE_DTYPES run on a CUDA device.

    "BxS dtype" -> {"forward": ..., "backward": ...}, for device ``index``.
    """
    if _backends.device_problem(index):
        return {}
    paths = {}
    for name, dtype in SEQUENCE_DTYPES.items():
        for batch, state in SEQUENCE_SIZES:
            path = _backends.sequence_path(index, dtype, batch, state)
            if path is not None:
                paths[f"{batch}x{state} {name}"] = path
    return paths


def collect() -> dict[str, Any]:
    """Everything ``lltm info`` reports, as a dict (what ``--json`` prints)."""
    cuda_ok, cuda_why = _backends.cuda_status()
    cpu_isa, cpu_isa_error = _cpu_isa()
    devices = {
        device: "native" if _backends.has_native_kernel(device) else "composite (fallback)"
        for device in ("cpu", "cuda")
    }
    return {
        "lltm": __version__,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch_abi_target": _target_version(_C.torch_target_version),
        "cpu_threads": torch.get_num_threads(),
        "kernels": devices,
        "cpu_isa": cpu_isa,
        "cpu_isa_error": cpu_isa_error,
        # What float32 sequences compute in now: torch's float32 matmul setting.
        "float32_sequences": precision.describe(),
        # The private torch names lltm reads that this torch lacks (lltm/_probes.py).
        "torch_internals_missing": list(_probes.MISSING),
        "cuda_plugin": _backends.PLUGIN.module,
        "cuda_kernels_active": cuda_ok,
        "cuda_status": cuda_why,
        "cuda_fix": None if cuda_ok else _backends.PLUGIN.fix,
        "cuda_devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available()
        else [],
        # Per device: "" when the fused kernels run there, else why not.
        "cuda_device_problems": [
            _backends.device_problem(i) for i in range(torch.cuda.device_count())
        ]
        if cuda_ok
        else [],
        # Per device: how sequences of SEQUENCE_SIZES run in float32 and in
        # 16 bits ("BxS float32", "BxS 16-bit" -> {"forward": ...,
        # "backward": ...}); empty where the fused kernels do not run there
        # or the plugin cannot tell.
        "cuda_sequence_paths": [_sequence_paths(i) for i in range(torch.cuda.device_count())]
        if cuda_ok
        else [],
        # The plans this process measured (torch.backends.cudnn.benchmark),
        # most recent first, each with its candidates' times in milliseconds
        # (None: refused by the GPU); empty where nothing was measured.
        "cuda_measured_plans": [dataclasses.asdict(p) for p in _backends.measured_plans()],
        # lltm's CMake package, for C++ programs (lltm.cmake_prefix_path).
        "cmake_prefix_path": cmake_prefix_path,
        **provenance(),
    }


def render(info: dict[str, Any]) -> str:
    """``info`` (from :func:`collect`) as the lines ``lltm info`` prints."""
    rows = [
        ("lltm", info["lltm"]),
        ("package", f"{info['package']} ({info['install']})"),
        ("library", info["library"]),
        ("torch", f"{info['torch']} (CUDA {info['torch_cuda'] or 'none'})"),
        ("Python", f"{info['python']} on {info['platform']}"),
        ("stable ABI target", f"torch >= {info['torch_abi_target']}"),
        ("CPU threads", str(info["cpu_threads"])),
        *((f"kernel [{dev}]", how) for dev, how in info["kernels"].items()),
        ("CPU instruction set", info["cpu_isa"] or f"none: {info['cpu_isa_error']}"),
        (
            "sequence forward",
            "lltm::sequence_inference (no gates or cells kept) where no gradient can be asked "
            "(no_grad, inference_mode, nothing requiring grad); else lltm::sequence_forward",
        ),
        ("float32 sequences", info["float32_sequences"]),
        (
            "torch internals",
            "all found"
            if not info["torch_internals_missing"]
            else "missing: " + ", ".join(info["torch_internals_missing"]) + " (slower fallbacks)",
        ),
        ("CMake prefix (C++)", info["cmake_prefix_path"]),
        ("CUDA plugin", info["cuda_plugin"] or "not installed"),
        (
            "CUDA kernels",
            ("active: " if info["cuda_kernels_active"] else "inactive: ") + info["cuda_status"],
        ),
    ]
    if info["cuda_fix"]:
        rows.append(("to enable CUDA", info["cuda_fix"]))
    problems = info["cuda_device_problems"] or [None] * len(info["cuda_devices"])
    for i, (name, problem) in enumerate(zip(info["cuda_devices"], problems, strict=True)):
        if problem is None:
            rows.append((f"cuda:{i}", name))
        elif problem:
            rows.append((f"cuda:{i}", f"{name}: composite kernels ({problem})"))
        else:
            rows.append((f"cuda:{i}", f"{name}: fused kernels"))
    for i, paths in enumerate(info.get("cuda_sequence_paths") or []):
        for size, path in paths.items():
            rows.append((f"sequence {size} cuda:{i}", f"forward {path['forward']}"))
            rows.append(("", f"backward {path['backward']}"))
    for plan in info.get("cuda_measured_plans") or []:
        first, *candidates = (
            _backends.MeasuredPlan(**{**plan, "candidates": tuple(map(tuple, plan["candidates"]))})
            .render()
            .splitlines()
        )
        rows.append(("measured plan", first))
        rows += [("", line) for line in candidates]
    rows += [("PROBLEM", problem) for problem in info["problems"]]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def parser() -> argparse.ArgumentParser:
    """The command line of ``lltm info``."""
    p = argparse.ArgumentParser(prog="lltm info", description=__doc__)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``lltm info`` with ``argv``; returns the exit status."""
    args = parser().parse_args(argv)
    info = collect()
    print(json.dumps(info, indent=2) if args.json else render(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
