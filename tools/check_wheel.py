"""Checks a repaired wheel of either variant: name, version, tags, contents
and metadata.

    python -m tools.check_wheel {cpu,cuda} WHEEL

Run by ``nox -s cibuildwheel`` on each wheel that cibuildwheel's repair
command left, as a release job would publish it.
"""

from __future__ import annotations

import argparse
import re
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import parse_wheel_filename

from tools import project_facts

VERSION = project_facts.version()
# lltm's CMake package and C++ header (lltm.cmake_prefix_path).
CPP_PACKAGE = (
    "lltm/share/cmake/lltm/lltmConfig.cmake",
    "lltm/share/cmake/lltm/lltmConfigVersion.cmake",
    "lltm/include/lltm/lltm.h",
)

# Platforms as environment markers see them: lltm-cuda<major> exists for the
# first only, so lltm's CUDA extras must require it there and nowhere else.
CUDA_WHEEL_PLATFORMS = {
    ("linux", "x86_64"): True,
    ("linux", "aarch64"): False,
    ("darwin", "arm64"): False,
    ("win32", "AMD64"): False,
}


def check_cuda_extras(metadata: str) -> None:
    """lltm[cuda], [cuda12] and [cuda13] require lltm-cuda<major> of the same
    version on Linux x86_64, and add nothing elsewhere."""
    requires = [
        Requirement(line.split(":", 1)[1].strip())
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:")
    ]
    for extra, plugin in (
        ("cuda", "lltm-cuda13"),
        ("cuda12", "lltm-cuda12"),
        ("cuda13", "lltm-cuda13"),
    ):
        assert f"Provides-Extra: {extra}" in metadata, metadata
        for (system, machine), wanted in CUDA_WHEEL_PLATFORMS.items():
            env = {"extra": extra, "sys_platform": system, "platform_machine": machine}
            required = [r for r in requires if r.marker is None or r.marker.evaluate(env)]
            plugins = [r for r in required if r.name.startswith("lltm-cuda")]
            expected = [f"{plugin}=={VERSION}"] if wanted else []
            assert [f"{r.name}{r.specifier}" for r in plugins] == expected, (
                f"lltm[{extra}] on {system} {machine}: requires {plugins}, expected {expected}"
            )


def check_wheel(wheel: Path, variant: str) -> None:
    """Name, tags and contents of a repaired wheel of ``variant``."""
    name, version, _, tags = parse_wheel_filename(wheel.name)
    assert str(version) == VERSION, wheel.name
    # py3-none: the libraries use no CPython API, so every CPython >= 3.10,
    # free-threaded 3.14t included, takes the one wheel (check_wheel_tags.py).
    assert {(t.interpreter, t.abi) for t in tags} == {("py3", "none")}, wheel.name
    assert all(re.fullmatch(r"manylinux_2_\d+_x86_64", t.platform) for t in tags), wheel.name
    with zipfile.ZipFile(wheel) as archive:
        members = archive.namelist()
        metadata_name = next(n for n in members if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(metadata_name).decode()
    # Nothing of torch or CUDA is vendored: auditwheel grafted no library.
    vendored = [m for m in members if ".libs/" in m or re.search(r"/lib[^/]*\.so", m)]
    assert not vendored, f"{wheel.name} vendors {vendored}"
    if variant == "cpu":
        assert name == "lltm", wheel.name
        assert {"lltm/lib/lltm_cpu.so", "lltm/_C.py", "lltm/py.typed", *CPP_PACKAGE} <= set(
            members
        ), members
        assert not [m for m in members if m.startswith("lltm_cuda")], members
        assert "Requires-Dist: torch>=2.10" in metadata, metadata
        check_cuda_extras(metadata)
    else:
        assert re.fullmatch(r"lltm-cuda1[23]", name), wheel.name
        package = name.replace("-", "_")
        assert {f"{package}/lib/lltm_cuda.so", f"{package}/_C.py"} <= set(members), members
        assert not [m for m in members if m.startswith("lltm/")], members
        assert f"Requires-Dist: lltm=={VERSION}" in metadata, metadata


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variant", choices=["cpu", "cuda"])
    parser.add_argument("wheel", type=Path)
    args = parser.parse_args()
    check_wheel(args.wheel, args.variant)
    print(f"{args.wheel.name}: tags, contents and metadata as expected")


if __name__ == "__main__":
    main()
