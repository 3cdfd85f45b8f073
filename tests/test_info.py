"""``lltm info`` says where lltm was imported from, and what is wrong with it:
an installed lltm shadowed by a source tree, a stale in-place build of the
library, a library of another version; and a damaged installed library is never loaded.

Each case is laid out for real in a temporary directory (a copy of this lltm,
installed the way pip installs a wheel: the package next to a dist-info with
METADATA and RECORD) and examined by ``python -m lltm info --json`` in a
fresh interpreter.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lltm

PACKAGE = Path(lltm.__file__).resolve().parent
VERSION = lltm.__version__


def _copy_package(dest: Path) -> Path:
    target = dest / "lltm"
    shutil.copytree(PACKAGE, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def _record_line(path: Path, root: Path) -> str:
    data = path.read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path.relative_to(root).as_posix()},sha256={digest},{len(data)}"


def _install(site: Path) -> Path:
    """This lltm as pip lays out an installed wheel, in `site`."""
    package = _copy_package(site)
    dist_info = site / f"lltm-{VERSION}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: lltm\nVersion: {VERSION}\n")
    (dist_info / "INSTALLER").write_text("pip\n")
    lines = [_record_line(p, site) for p in sorted(package.rglob("*")) if p.is_file()]
    lines += [_record_line(dist_info / n, site) for n in ("METADATA", "INSTALLER")]
    lines.append(f"lltm-{VERSION}.dist-info/RECORD,,")
    (dist_info / "RECORD").write_text("\n".join(lines) + "\n")
    return package


def _info(tmp_path: Path, *path: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, path))}
    result = subprocess.run(
        [sys.executable, "-m", "lltm", "info", "--json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    return json.loads(result.stdout)


def _library(package: Path) -> Path:
    (library,) = (package / "lib").glob("lltm_cpu.*")
    return library


def test_installed_package_has_no_problem(tmp_path):
    site = tmp_path / "site"
    package = _install(site)
    info = _info(tmp_path, site)
    assert info["package"] == str(package)
    assert info["install"] == f"installed: lltm {VERSION} at {package}"
    assert info["library_version"] == VERSION
    assert info["problems"] == []


def test_source_tree_shadowing_the_installed_package(tmp_path):
    site, tree = tmp_path / "site", tmp_path / "checkout" / "src"
    installed = _install(site)
    shadow = _copy_package(tree)
    info = _info(tmp_path, tree, site)
    assert info["package"] == str(shadow)
    (problem,) = info["problems"]
    assert f"lltm is imported from {shadow}, which shadows the installed lltm {VERSION} " in problem
    assert str(installed) in problem and "PYTHONPATH" in problem


@pytest.mark.parametrize("damage", ["truncated", "appended", "flipped"])
def test_damaged_library_is_never_loaded(tmp_path, damage):
    # Cut to one page, dlopen accepts the file and the loader then faults
    # (SIGBUS) past its end; lltm checks it against RECORD first.
    site = tmp_path / "site"
    library = _library(_install(site))
    data = bytearray(library.read_bytes())
    if damage == "truncated":
        data = data[:4096]
    elif damage == "appended":
        data += b"\0"  # would still load: no segment reaches the new byte
    else:
        data[len(data) // 2] ^= 0xFF
    library.write_bytes(bytes(data))
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = subprocess.run(
        [sys.executable, "-c", "import lltm"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 1, result  # an exception, not a signal
    # lltm._native.DamagedLibrary, an ImportError.
    assert f"DamagedLibrary: lltm: the installed library {library} is damaged" in result.stderr
    assert f"pip install --force-reinstall --no-deps 'lltm=={VERSION}'" in result.stderr


def test_stale_in_place_build(tmp_path):
    root = tmp_path / "checkout"
    package = _copy_package(root / "src")
    source = root / "csrc" / "cpu" / "cell_kernel.cpp"
    source.parent.mkdir(parents=True)
    source.write_text("// edited after the build\n")
    library = _library(package)
    built = library.stat().st_mtime
    os.utime(source, (built + 60, built + 60))
    problems = _info(tmp_path, root / "src")["problems"]
    assert any(f"{library} is older than {source}: a stale in-place build" in p for p in problems)
    # Rebuilt (here: touched after the edit), the warning goes.
    os.utime(library, (built + 120, built + 120))
    problems = _info(tmp_path, root / "src")["problems"]
    assert not any("a stale in-place build" in p for p in problems), problems


def test_library_of_another_version(tmp_path):
    package = _copy_package(tmp_path / "src")
    version_file = package / "_version.py"
    version_file.write_text(version_file.read_text().replace(VERSION, "9.9.9"))
    problems = _info(tmp_path, tmp_path / "src")["problems"]
    assert any(
        f"was built from lltm {VERSION} but the Python package is lltm 9.9.9" in p for p in problems
    ), problems


def test_info_prints_the_problems(tmp_path):
    site, tree = tmp_path / "site", tmp_path / "tree"
    _install(site)
    _copy_package(tree)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, (tree, site)))}
    out = subprocess.run(
        [sys.executable, "-m", "lltm", "info"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    assert f"{tree / 'lltm'} (installed: lltm {VERSION} at {site / 'lltm'})" in out
    assert "PROBLEM" in out and "shadows the installed lltm" in out


def test_info_names_the_float32_precision_of_the_moment():
    from lltm import info

    try:
        torch.set_float32_matmul_precision("high")
        allowed = info.render(info.collect())
    finally:
        torch.set_float32_matmul_precision("highest")
    exact = info.render(info.collect())

    def row(text):
        (line,) = [line for line in text.splitlines() if line.startswith("float32 sequences")]
        return line[len("float32 sequences") :].strip()

    assert row(exact) == "exact float32 (torch's float32 matmul precision: highest)"
    assert row(allowed).startswith("TF32 allowed on CUDA, exact float32 on the CPU")
