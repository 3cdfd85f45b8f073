"""The environments nox sessions make: torch pinned, Pythons found, freed once done.

What every session of noxfile.py shares: torch installed at an exact
version (and build: CPU-only or CUDA) from the index its setting names, and
kept in a wheelhouse across sessions; the dependency groups of
pyproject.toml; the Pythons of the test matrix found as nox finds them, or
named with how to get them; fresh virtual environments for a test step;
and, on CI, each session's environments, and the downloads it made,
deleted once it passes.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import nox

from tools import torch_index
from tools.nox_matrix import COMPAT_PYTHONS, TESTS_PYTHONS

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = nox.project.load_toml(ROOT / "pyproject.toml")


def disposing() -> bool:
    """LLTM_NOX_DISPOSABLE=1 (.ci/run sets it): a run on a machine it leaves
    behind, whose disk is shared, so sessions keep nothing after them."""
    return os.environ.get("LLTM_NOX_DISPOSABLE") == "1"


def disposable(func: Callable[..., None]) -> Callable[..., None]:
    """With LLTM_NOX_DISPOSABLE=1, the session's directory under .nox (its
    virtualenv, and the build trees, extra environments and downloads of its
    tmp/) is deleted once the session passes; a failed session keeps it to
    look at."""

    @functools.wraps(func)
    def run_then_free(session: nox.Session, *args: Any, **kwargs: Any) -> None:
        func(session, *args, **kwargs)
        if disposing():
            location = Path(session.virtualenv.location)
            session.log(f"LLTM_NOX_DISPOSABLE: deleting {location} (in the background)")
            delete_in_background(location)

    return run_then_free


def delete_in_background(location: Path) -> None:
    """Deletes ``location`` without waiting for it: renamed aside at once
    (the session's name is free for the next run of it), then removed by a
    process of its own. Deleting a session's tree, torch with its CUDA
    libraries among it, takes one to two minutes of a busy CI machine's disk,
    minutes the next session need not wait for."""
    if not location.exists():
        return
    aside = location.with_name(f".deleting-{location.name}-{os.getpid()}-{time.time_ns()}")
    location.rename(aside)
    subprocess.Popen(
        ["rm", "-rf", str(aside)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip


def group(name: str) -> list[str]:
    """The requirements of pyproject.toml's dependency group ``name``."""
    return nox.project.dependency_groups(PYPROJECT, name)


# Downloaded torch wheels, kept across sessions and runs: a CUDA build of
# torch is gigabytes, several sessions install the same one, and pip's own
# cache does not keep such downloads on every machine.
TORCH_WHEELHOUSE = Path.home() / ".cache" / "lltm" / "torch-wheels"


def session_cache(session: nox.Session, variable: str, default: Path) -> Path:
    """Where a session keeps what it downloads: the folder the environment
    variable ``variable`` names (unset or empty: none), else ``default``,
    kept across runs; with LLTM_NOX_DISPOSABLE=1 and ``variable`` unset, a
    folder of the session's tmp/, freed with it. A run that leaves the
    machine keeps nothing for a next run, and what it keeps meanwhile adds
    up: five releases of torch with their CUDA libraries are 15 GB of
    wheels, the arm64 root 7.5 GB."""
    if os.environ.get(variable):
        return Path(os.environ[variable])
    if disposing():
        return Path(session.create_tmp()).resolve() / default.name
    return default


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (created if missing) for the block: nox
    processes run side by side (.ci/run starts nox -s aarch64 beside the
    others) fill and read the same wheelhouse where it is shared."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        try:
            import fcntl
        except ImportError:  # Windows: one nox process at a time there
            yield
            return
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def install_torch(
    session: nox.Session,
    version: str,
    *others: str,
    build: str = "cpu",
    python: str = "python",
    env: dict[str, str] | None = None,
) -> None:
    """``torch==version``, then ``others`` beside it, into the session's
    environment or into the one whose interpreter is ``python``; fails unless
    that torch is what the environment has at the end.

    ``build`` says which build of torch: "cpu", a CPU-only build, or "cuda",
    a CUDA build, each from the index its setting names
    (tools/torch_index.py: LLTM_TORCH_CPU_INDEX, LLTM_TORCH_CUDA_INDEX,
    pyproject.toml's [tool.lltm]). The log says which build came, from where.

    torch is pinned in every command, so that nothing installed later (lltm
    requires torch) replaces it: a pip configuration may cap torch below the
    newest release (the development machines' does, at the release their
    local mirror holds), and pip would otherwise "fix" a newer torch by
    installing the capped one. PIP_CONSTRAINT lifts the cap for these
    commands, where the pin says exactly what comes. torch and what it needs
    come through TORCH_WHEELHOUSE (LLTM_TORCH_WHEELHOUSE; on CI, the
    session's own: session_cache): pip downloads only the files it lacks,
    then installs from it alone."""
    env = {**(env or {}), "PIP_CONSTRAINT": os.devnull}
    external = python != "python"
    index = torch_index.pip_args(build)
    # A folder per version and index: one version is a CPU build on one
    # index, a CUDA build on another. Where pip's configuration decides, the
    # version's own folder.
    folder = torch_index.folder_name(build)
    wheelhouse = session_cache(session, "LLTM_TORCH_WHEELHOUSE", TORCH_WHEELHOUSE)
    wheelhouse /= f"{version}-{folder}" if folder else version
    pip = [python, "-m", "pip"]
    # One torch wheel per CPython version; a marker per interpreter says the
    # wheelhouse holds everything it needs (pip's check alone takes ~30 s).
    tag = session.run(
        python, "-c", "import sys; print(sys.implementation.cache_tag)",
        env=env, external=external, silent=True,
    ).strip()  # fmt: skip
    complete = wheelhouse / f".complete-{tag}"
    with locked(wheelhouse / ".lock"):
        if not complete.exists():
            session.run(
                *pip, "download", "--quiet", "--dest", str(wheelhouse), *index,
                f"torch=={version}", env=env, external=external,
            )  # fmt: skip
            complete.touch()
        session.run(
            *pip, "install", "--quiet", "--no-index", "--find-links", str(wheelhouse),
            f"torch=={version}", env=env, external=external,
        )  # fmt: skip
    if others:
        session.run(
            *pip, "install", "--quiet", f"torch=={version}", *others, env=env, external=external
        )
    found, cuda = session.run(
        python, "-c", "import torch; print(torch.__version__, torch.version.cuda)",
        env=env, external=external, silent=True,
    ).split()[-2:]  # fmt: skip
    if found.split("+")[0] != version:
        session.error(f"torch {found} installed where torch {version} was asked for")
    kind = "CPU-only" if cuda == "None" else f"CUDA {cuda}"
    session.log(f"torch {found} ({kind}) from {torch_index.describe(build)}")


def find_python(version: str) -> str | None:
    """The interpreter of Python ``version`` nox would use: found as nox finds
    them (python-discovery: PATH, pyenv's active versions, uv's, the Windows
    registry), or on PATH as python<version> by older nox."""
    try:
        from python_discovery import get_interpreter
    except ImportError:
        return shutil.which(f"python{version}")
    found = get_interpreter(version)
    return str(found.executable) if found is not None else None


def words(items: list[str]) -> str:
    return ", ".join(items[:-1]) + f" and {items[-1]}" if len(items) > 1 else items[0]


def missing_pythons(needed: list[str], who: str) -> str | None:
    """What to tell when a Python of ``needed`` is missing, else None."""
    missing = [version for version in needed if find_python(version) is None]
    if not missing:
        return None
    every = sorted(set(TESTS_PYTHONS) | set(COMPAT_PYTHONS))
    versions = " ".join(missing)
    return (
        f"this machine lacks Python {words(missing)}, which {who} needs (nox -t tests runs "
        f"under Python {words(every)}). Install them with uv (uv python install {versions}) "
        f"or pyenv (pyenv install {versions}, then list them in pyenv global or "
        "PYENV_VERSION); LLTM_OLDEST_PYTHON, LLTM_NEWEST_PYTHON and LLTM_NOX_PYTHONS move "
        "the matrix's Pythons (README.md, Quick start)"
    )


def interpreter(session: nox.Session, version: str) -> str:
    """Python ``version``'s interpreter, for an environment a session makes itself."""
    found = find_python(version)
    if found is None:
        session.error(missing_pythons([version], f"nox -s {session.name}"))
    return found


def fresh_env(
    session: nox.Session, name: str, interpreter: str = "python"
) -> tuple[str, dict[str, str]]:
    """A new virtual environment, as cibuildwheel creates for its test step,
    of the session's Python unless `interpreter` names another: its own
    interpreter, and the environment variables that activate it.

    Commands meant for it name its interpreter: nox finds a bare "python"
    in the session's own environment first, whatever PATH says."""
    # Absolute: the test command runs from another directory.
    venv = Path(session.create_tmp()).resolve() / name
    shutil.rmtree(venv, ignore_errors=True)
    session.run(interpreter, "-m", "venv", str(venv), external=interpreter != "python")
    bindir = venv / ("Scripts" if sys.platform == "win32" else "bin")
    env = {"VIRTUAL_ENV": str(venv), "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    python = str(bindir / "python")
    session.run(
        python, "-m", "pip", "install", "--quiet", "--upgrade", "pip", env=env, external=True
    )
    return python, env
