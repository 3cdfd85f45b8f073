"""Checks the build matrix cibuildwheel derives from the configurations:
one py3-none wheel per platform for lltm and one Linux x86_64 wheel for the
CUDA plugin, each built for cp310 and tested again, unchanged, on cp314t
(cibuildwheel finds the py3-none wheel compatible there and builds nothing:
tools/check_wheel_tags.py).

    python -m tools.check_build_identifiers

Run by ``nox -s cibuildwheel``; needs cibuildwheel on PATH (no Docker: only
``--print-build-identifiers`` is asked of it).
"""

from __future__ import annotations

import os
import subprocess

from tools.cibw_config import CUDA_CONFIG

EXPECTED = {
    ("pyproject.toml", "linux", "x86_64"): "cp310-manylinux_x86_64 cp314t-manylinux_x86_64",
    ("pyproject.toml", "linux", "aarch64"): "cp310-manylinux_aarch64 cp314t-manylinux_aarch64",
    ("pyproject.toml", "macos", None): "cp310-macosx_arm64 cp314t-macosx_arm64",
    ("pyproject.toml", "windows", None): "cp310-win_amd64 cp314t-win_amd64",
    (CUDA_CONFIG.name, "linux", None): "cp310-manylinux_x86_64 cp314t-manylinux_x86_64",
}


def main() -> None:
    # CIBW_* variables of the caller's shell would change the answer.
    env = {k: v for k, v in os.environ.items() if not k.startswith("CIBW_")}
    for (config, platform, archs), identifier in EXPECTED.items():
        args = ["cibuildwheel", "--print-build-identifiers", "--platform", platform]
        if config != "pyproject.toml":
            args += ["--config-file", str(CUDA_CONFIG)]
        if archs:
            args += ["--archs", archs]
        out = subprocess.run(args, env=env, check=True, capture_output=True, text=True).stdout
        assert out.split() == identifier.split(), (args, out)
        print(f"{config} {platform} {archs or ''}: {identifier}")


if __name__ == "__main__":
    main()
