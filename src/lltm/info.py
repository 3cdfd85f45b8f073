"""``python -m lltm info``: what is installed and which kernel serves which device.

In the spirit of ``python -m torch.utils.collect_env``: one screen to paste
into a bug report.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from collections.abc import Sequence
from typing import Any

import torch

from . import _C, _backends
from ._version import __version__


def _target_version(code: str) -> str:
    """0x020a000000000000 -> '2.10'."""
    value = int(code, 16)
    return f"{value >> 56}.{(value >> 48) & 0xFF}"


def _cpu_isa() -> tuple[str | None, str | None]:
    """(instruction set of the CPU kernels, None) or (None, why there is none):
    an invalid LLTM_CPU_ISA is reported here, not raised."""
    try:
        return _C.cpu_isa(), None
    except ValueError as error:
        return None, str(error)


def collect() -> dict[str, Any]:
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
        "cuda_plugin": _backends.PLUGIN.module,
        "cuda_kernels_active": cuda_ok,
        "cuda_status": cuda_why,
        "cuda_fix": None if cuda_ok else _backends.PLUGIN.fix,
        "cuda_devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available()
        else [],
    }


def render(info: dict[str, Any]) -> str:
    rows = [
        ("lltm", info["lltm"]),
        ("torch", f"{info['torch']} (CUDA {info['torch_cuda'] or 'none'})"),
        ("Python", f"{info['python']} on {info['platform']}"),
        ("stable ABI target", f"torch >= {info['torch_abi_target']}"),
        ("CPU threads", str(info["cpu_threads"])),
        *((f"kernel [{dev}]", how) for dev, how in info["kernels"].items()),
        ("CPU instruction set", info["cpu_isa"] or f"none: {info['cpu_isa_error']}"),
        ("CUDA plugin", info["cuda_plugin"] or "not installed"),
        (
            "CUDA kernels",
            ("active: " if info["cuda_kernels_active"] else "inactive: ") + info["cuda_status"],
        ),
    ]
    if info["cuda_fix"]:
        rows.append(("to enable CUDA", info["cuda_fix"]))
    rows += [(f"cuda:{i}", name) for i, name in enumerate(info["cuda_devices"])]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lltm info", description=__doc__)
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)
    info = collect()
    print(json.dumps(info, indent=2) if args.json else render(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
