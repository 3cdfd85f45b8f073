"""Checks the sdist's members: every file of csrc/, the build inputs, the
wheels' test sources, and no build products.

    python -m tools.check_sdist ARCHIVE

Run by ``nox -s sdist``, which then builds a wheel from the archive and runs
the smoke tests from its own tests/.
"""

from __future__ import annotations

import argparse
import tarfile
from pathlib import Path

from tools import project_facts
from tools.cibw_config import CONFIGS, linux_options

ROOT = project_facts.ROOT


def check_sdist(archive: Path) -> None:
    prefix = f"lltm-{project_facts.version()}/"
    with tarfile.open(archive) as tar:
        members = {m.name.removeprefix(prefix) for m in tar.getmembers() if m.isfile()}
    csrc = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "csrc").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    # The wheels' test sources too: the test command runs from the sdist, and
    # a conda-forge feedstock tests its package with them.
    test_sources = {
        p.relative_to(ROOT).as_posix()
        for config in CONFIGS.values()
        for item in linux_options(config).get("test-sources", [])
        for p in ([ROOT / item] if (ROOT / item).is_file() else (ROOT / item).rglob("*.py"))
    }
    required = csrc | test_sources | {
        "setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "LICENSE",
        "tools/__init__.py", "tools/setup_helpers/__init__.py",
        "tools/setup_helpers/source_build.py", "tools/setup_helpers/cxx_runtime.py",
        "tools/setup_helpers/elf_headers.py",
        "tools/setup_helpers/sanitizers.py",
        "src/lltm/__init__.py", "src/lltm/_C.py", "src/lltm/py.typed",
        "src/lltm/share/cmake/lltm/lltmConfig.cmake",
        "src/lltm/share/cmake/lltm/lltmConfigVersion.cmake", "src/lltm/include/lltm/lltm.h",
        "examples/cpp/CMakeLists.txt", "examples/cpp/main.cpp", "examples/cpp/make_artifacts.py",
        "src/lltm_cuda/__init__.py", "src/lltm_cuda/_C.py",
    }  # fmt: skip
    missing = sorted(required - members)
    assert not missing, f"the sdist lacks {missing}"
    stray = sorted(m for m in members if m.endswith((".so", ".pyd", ".pyc")))
    assert not stray, f"the sdist holds build products: {stray}"
    print(f"{archive.name}: {len(members)} files, all {len(csrc)} of csrc/ among them")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("archive", type=Path)
    check_sdist(parser.parse_args().archive)


if __name__ == "__main__":
    main()
