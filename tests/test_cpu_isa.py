"""Every instruction-set variant of the CPU kernels, not just the widest one
this machine runs by default: LLTM_CPU_ISA lowers the runtime choice, so the
parity suite runs again in a subprocess per variant."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

PARITY = Path(__file__).with_name("test_parity.py")


@pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64"),
    reason="the AVX2/AVX-512 variants exist on x86-64 only",
)
@pytest.mark.parametrize("isa", ["baseline", "avx2"])
def test_parity_suite_passes_with_lower_isa(isa: str) -> None:
    env = {**os.environ, "LLTM_CPU_ISA": isa}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(PARITY)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout
