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


def collect() -> dict[str, Any]:
    cuda_ok, cuda_why = _backends.cuda_status()
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
    }


def render(info: dict[str, Any]) -> str:
    rows = [
        ("lltm", info["lltm"]),
        ("torch", f"{info['torch']} (CUDA {info['torch_cuda'] or 'none'})"),
        ("Python", f"{info['python']} on {info['platform']}"),
        ("stable ABI target", f"torch >= {info['torch_abi_target']}"),
        ("CPU threads", str(info["cpu_threads"])),
        *((f"kernel [{dev}]", how) for dev, how in info["kernels"].items()),
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
