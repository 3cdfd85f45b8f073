"""lltm with and without its CUDA plugin: ``import lltm`` never fails, ``python
-m lltm info`` says which kernels are active and why, and the op always runs.

The slow tests install the real wheels into real environments (no mocks), one
row of the README's table each, through ``import lltm`` in the environment's
own Python:

* the CPU wheel alone, next to a CUDA build of torch: the plugin is missing
  (and, on a GPU, CUDA tensors run the composite after one warning);
* both wheels next to a CPU-only torch: the plugin cannot be used;
* ``pip install "lltm[cuda13]"`` next to a CUDA torch, resolved from the
  wheels alone: the plugin loads (on this GPU-less machine too);
* both wheels with a damaged library (the plugin's, lltm's own): never loaded,
  a damaged plugin leaves lltm usable, a damaged lltm says what to reinstall;
* a plugin for another CUDA major, or built from another lltm version: real
  importable stand-in packages (``lltm_cuda12``, ``lltm_cuda13``) whose
  ``_C`` is a small module carrying the plugin's constants (and, for another
  version, registering CUDA kernels as the real library does);
* the ``lltm`` console script of an installed wheel.

Wheels come from $LLTM_TEST_WHEELS (a folder holding both, e.g. dist/) or are
built here from a clean copy of the source tree: the CPU wheel against the
CPU-only torch, the CUDA wheel against the CUDA torch with nvcc from
$CUDA_HOME (set TORCH_CUDA_ARCH_LIST to shorten that build). Only the tests
that need the CUDA wheel need nvcc.

Environments: one per torch build, cached in $LLTM_TEST_VENV_CACHE (default
~/.cache/lltm/test-venvs) since a CUDA torch is several GB, and never changed
after they are made: each test gets a fresh virtual environment of its own
that sees the cached torch (a .pth file) and installs lltm into itself. The
CPU-only torch comes from the index $LLTM_TORCH_CPU_INDEX names, the CUDA
torch from $LLTM_TORCH_CUDA_INDEX's (defaults: pyproject.toml's [tool.lltm],
torch's own indexes; "pip": whatever pip is configured with), as in the nox
sessions. Each cached environment's torch build (version, CUDA or not) is
checked, not assumed.

A missing prerequisite (nvcc, nm) skips the tests that need it, with the
reason; with LLTM_TEST_REQUIRE_INSTALLS=1 (CI sets it) it fails them instead,
so a CI run cannot pass without having run them.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import shutil
import subprocess
import sys
import textwrap
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
from conftest import (
    ALL_GRADS,
    GRAD_NAMES,
    assert_all_close,
    make_inputs,
    undefined_symbols,
    unstable_symbols,
)

from lltm import _backends
from lltm.ops.cell_ops import composite as cell_composite

ROOT = Path(__file__).resolve().parents[1]
# The version of the sources the wheels are built from, as setup.py reads it.
VERSION = runpy.run_path(str(ROOT / "src/lltm/_version.py"))["__version__"]
CPU_TORCH = "2.13.0"  # a CPU-only build: what the CPU wheel is built with
CUDA_TORCH = "2.14.1"  # a CUDA 13 build, also what the CUDA wheel is built with
CUDA_MAJOR = "13"
BUILD_REQUIREMENTS = ["setuptools>=77", "wheel", "ninja"]
# Deadline of every command run here: the longest, installing a CUDA torch or
# building the CUDA wheel, takes under two minutes on two cores.
COMMAND_TIMEOUT_S = 1200
CUDA_HOME = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))


# --- The composite kernel and the plugin decisions (fast, in this process) ---


@pytest.mark.parametrize(
    "shape", [(1, 1, 1), (3, 5, 7), (16, 32, 128), (0, 3, 4), (4, 0, 6)], ids=str
)
def test_composite_kernel_matches_native_cpu_kernel(shape):
    inputs = make_inputs(*shape)
    native = torch.ops.lltm.forward(*inputs)
    composite = cell_composite.forward(*inputs)
    assert_all_close(composite, native, ("new_h", "new_cell", "gates"))
    new_h, new_cell, gates = native
    input, weights, _, old_h, _ = inputs
    generator = torch.Generator().manual_seed(1)
    grad_h, grad_cell = (
        torch.randn(t.shape, generator=generator, dtype=t.dtype) for t in (new_h, new_cell)
    )
    args = (grad_h, grad_cell, new_cell, gates, input, old_h, weights, ALL_GRADS)
    assert_all_close(cell_composite.backward(*args), torch.ops.lltm.backward(*args), GRAD_NAMES)


def test_composite_path_warns_once_naming_the_fix(monkeypatch):
    monkeypatch.setattr(_backends, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            _backends._warn_composite(torch.device("cuda"))
    assert len(caught) == 1
    assert caught[0].category is RuntimeWarning
    message = str(caught[0].message)
    assert (
        "composite" in message and (_backends.PLUGIN.fix or "pip install 'lltm[cuda]'") in message
    )


def test_plugin_not_installed_names_the_extra():
    status = _backends._missing_plugin([], "13.0")
    assert (status.loaded, status.module) == (False, None)
    assert "lltm-cuda13" in status.reason and "not installed" in status.reason
    assert status.fix == f"pip install 'lltm[cuda13]=={VERSION}'"


def test_plugin_for_another_cuda_major_is_not_loaded():
    status = _backends._missing_plugin(["lltm_cuda12"], "13.0")
    assert (status.loaded, status.module) == (False, "lltm_cuda12")
    assert "needs lltm_cuda13" in status.reason
    assert status.fix == f"pip install 'lltm[cuda13]=={VERSION}'"


def test_unsupported_cuda_major_says_which_are_supported():
    status = _backends._missing_plugin([], "11.8")
    assert not status.loaded
    assert "CUDA 12 or 13 only" in status.reason


# --- Real installs (slow) ------------------------------------------------------


def _missing_prerequisite(reason: str) -> None:
    """Skips the test, or fails it where CI asks for every install test to run."""
    if os.environ.get("LLTM_TEST_REQUIRE_INSTALLS") == "1":
        pytest.fail(f"{reason} (LLTM_TEST_REQUIRE_INSTALLS=1: install tests must run)")
    pytest.skip(reason)


@dataclass(frozen=True)
class Env:
    """A virtual environment, driven through its own Python."""

    path: Path

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def run(
        self,
        *args: str | Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        executable: Path | None = None,
    ) -> str:
        clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        result = subprocess.run(
            [str(executable or self.python), *map(str, args)],
            capture_output=True,
            text=True,
            env={**clean, **(env or {})},
            cwd=cwd or self.path,  # not the source tree: import the installed lltm
            timeout=COMMAND_TIMEOUT_S,
        )
        assert result.returncode == 0, f"{args} failed:\n{result.stdout}\n{result.stderr}"
        return result.stdout

    def pip(self, *args: str | Path) -> str:
        return self.run("-m", "pip", "--disable-pip-version-check", "--quiet", *args)

    def site_packages(self) -> Path:
        return Path(
            self.run("-c", "import sysconfig; print(sysconfig.get_path('purelib'))").strip()
        )

    def torch_build(self) -> tuple[str, str | None]:
        """(torch.__version__, torch.version.cuda) as this environment imports them."""
        code = "import json, torch; print(json.dumps([torch.__version__, torch.version.cuda]))"
        version, cuda = json.loads(self.run("-c", code).splitlines()[-1])
        return version, cuda


def _torch_is(build: tuple[str, str | None], version: str, cuda_major: str | None) -> bool:
    found, cuda = build
    if found.split("+")[0] != version:
        return False
    return cuda is None if cuda_major is None else (cuda or "").split(".")[0] == cuda_major


# Where each build of torch comes from: the variable, else pyproject.toml's
# [tool.lltm] setting (tools/torch_index.py reads the same for nox).
TORCH_INDEX_VARIABLES = {"cpu": "LLTM_TORCH_CPU_INDEX", "cuda": "LLTM_TORCH_CUDA_INDEX"}


def _torch_index(build: str) -> str:
    """An index's URL, or "pip" (pip's own configuration), for torch's
    ``build``: "cpu" (CPU-only) or "cuda"."""
    value = os.environ.get(TORCH_INDEX_VARIABLES[build])
    if value is None:
        with (ROOT / "pyproject.toml").open("rb") as f:
            value = tomllib.load(f)["tool"]["lltm"][f"torch-{build}-index"]
    return value.strip()


def _cached_env(name: str, torch_version: str, cuda: str | None) -> Env:
    """An environment holding torch ``torch_version``, a CUDA ``cuda`` build
    (None: CPU-only) from that build's index, and BUILD_REQUIREMENTS, and
    nothing of lltm; made once.

    Whether reused or new, its torch must be that build: an index serving
    another build, or a stale cache, fails here rather than silently testing
    something else.
    """
    root = Path(os.environ.get("LLTM_TEST_VENV_CACHE", Path.home() / ".cache/lltm/test-venvs"))
    env = Env(root / f"py{sys.version_info.major}.{sys.version_info.minor}-{name}-base")
    ready = env.path / "lltm-test-requirements.json"
    kind = f"CUDA {cuda}.x" if cuda else "CPU-only"
    build = "cuda" if cuda else "cpu"
    index = _torch_index(build)
    torch_args = [f"torch=={torch_version}"] + ([] if index == "pip" else ["--index-url", index])
    requirements = [*torch_args, *BUILD_REQUIREMENTS]
    reusable = ready.is_file() and json.loads(ready.read_text()) == requirements
    if reusable and _torch_is(env.torch_build(), torch_version, cuda):
        return env
    shutil.rmtree(env.path, ignore_errors=True)
    subprocess.run(
        [sys.executable, "-m", "venv", str(env.path)], check=True, timeout=COMMAND_TIMEOUT_S
    )
    # torch from its index alone; the rest from pip's configuration, torch pinned.
    env.pip("install", *torch_args)
    env.pip("install", f"torch=={torch_version}", *BUILD_REQUIREMENTS)
    found = env.torch_build()
    where = f"pip's configuration ({TORCH_INDEX_VARIABLES[build]}=pip)" if index == "pip" else index
    assert _torch_is(found, torch_version, cuda), (
        f"{env.path}: expected torch {torch_version} ({kind}) from {where}, installed {found[0]} "
        f"with torch.version.cuda={found[1]!r}: {TORCH_INDEX_VARIABLES[build]} names the index "
        f"of torch's {kind} build"
    )
    ready.write_text(json.dumps(requirements))  # written last: marks a complete install
    return env


@pytest.fixture(scope="session")
def cpu_torch_env() -> Env:
    # Also the build environment of the CPU wheel.
    return _cached_env(f"torch{CPU_TORCH}", CPU_TORCH, None)


@pytest.fixture(scope="session")
def cuda_torch_env() -> Env:
    # Also the build environment of the CUDA wheel.
    return _cached_env(f"torch{CUDA_TORCH}", CUDA_TORCH, CUDA_MAJOR)


def _fresh_env(base: Env, path: Path) -> Env:
    """A new virtual environment at ``path`` that imports the base's packages
    (torch, and pip and setuptools too: a venv's own, older setuptools would
    shadow the one torch requires) through a .pth file, and installs into
    itself: tests never change the cached environments, nor see each other's
    installs."""
    subprocess.run(
        [str(base.python), "-m", "venv", "--without-pip", str(path)],
        check=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    env = Env(path)
    purelib = env.site_packages()
    (purelib / "lltm_test_base.pth").write_text(f"{base.site_packages()}\n")
    return env


@pytest.fixture
def cpu_env(cpu_torch_env, tmp_path) -> Env:
    return _fresh_env(cpu_torch_env, tmp_path / "venv")


@pytest.fixture
def cuda_env(cuda_torch_env, tmp_path) -> Env:
    return _fresh_env(cuda_torch_env, tmp_path / "venv")


def _given_wheel(pattern: str) -> Path | None:
    given = os.environ.get("LLTM_TEST_WHEELS")
    if not given:
        return None
    found = sorted(Path(given).glob(pattern))
    if not found:
        pytest.fail(f"LLTM_TEST_WHEELS={given} holds no {pattern}")
    return found[-1]


def _build_wheel(env: Env, variant: str, out: Path, scratch: Path) -> Path:
    # A fresh copy per variant: setuptools packs whatever ./build holds.
    source = scratch / f"src-{variant}"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".nox", "build", "dist", "*.so", "__pycache__", "*.egg-info"
        ),
    )
    build_env = {
        "LLTM_VARIANT": variant,
        "CUDA_HOME": str(CUDA_HOME),
        "MAX_JOBS": os.environ.get("MAX_JOBS", "2"),
    }
    env.run(
        "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", out, source, env=build_env
    )
    pattern = f"lltm-{VERSION}-*.whl" if variant == "cpu" else f"lltm_cuda*-{VERSION}-*.whl"
    [wheel] = out.glob(pattern)
    return wheel


@pytest.fixture(scope="session")
def cpu_wheel(cpu_torch_env, tmp_path_factory) -> Path:
    given = _given_wheel(f"lltm-{VERSION}-*.whl")
    if given:
        return given
    scratch = tmp_path_factory.mktemp("cpu-wheel")
    return _build_wheel(cpu_torch_env, "cpu", scratch / "dist", scratch)


@pytest.fixture(scope="session")
def cuda_wheel(tmp_path_factory, request) -> Path:
    given = _given_wheel(f"lltm_cuda*-{VERSION}-*.whl")
    if given:
        return given
    # Checked before the CUDA torch (several GB) is installed for the build.
    if not (CUDA_HOME / "bin" / "nvcc").exists():
        _missing_prerequisite(
            f"no nvcc under CUDA_HOME={CUDA_HOME} to build the CUDA wheel (or set LLTM_TEST_WHEELS)"
        )
    build_env = request.getfixturevalue("cuda_torch_env")
    scratch = tmp_path_factory.mktemp("cuda-wheel")
    return _build_wheel(build_env, "cuda", scratch / "dist", scratch)


def _plugin_name(cuda_wheel: Path) -> str:
    """Import name of the plugin, from the wheel's name: lltm_cuda13."""
    return cuda_wheel.name.split("-")[0]


def _install(env: Env, *wheels: Path) -> None:
    env.pip("install", "--no-deps", *wheels)


def _probe(env: Env, *args: str, pythonpath: Path | None = None) -> dict:
    """What lltm reports in ``env``, after computing one step on the CPU."""
    extra = {"PYTHONPATH": str(pythonpath)} if pythonpath else None
    out = env.run(ROOT / "tests" / "install_probe.py", *args, env=extra)
    report = json.loads(out.splitlines()[-1])
    assert report["max_error"] < 1e-12, "the op gave wrong results"
    assert report["info"]["kernels"]["cpu"] == "native"
    # The installed lltm, in this environment: not a source tree, not the base's.
    assert Path(report["lltm_file"]).is_relative_to(env.path), report["lltm_file"]
    return report


def _info_text(env: Env, pythonpath: Path | None = None) -> str:
    return env.run(
        "-m", "lltm", "info", env={"PYTHONPATH": str(pythonpath)} if pythonpath else None
    )


@pytest.mark.slow
def test_environments_hold_the_torch_builds_they_claim(cpu_env, cuda_torch_env, tmp_path):
    assert _torch_is(cpu_env.torch_build(), CPU_TORCH, None), cpu_env.torch_build()
    cuda_env = _fresh_env(cuda_torch_env, tmp_path / "cuda-venv")
    assert _torch_is(cuda_env.torch_build(), CUDA_TORCH, CUDA_MAJOR), cuda_env.torch_build()
    # The fresh environments start without lltm: what a test installs is what it tests.
    for env in (cpu_env, cuda_env):
        env.run("-c", "import importlib.util as u; assert u.find_spec('lltm') is None")


@pytest.mark.slow
def test_wheels_hold_one_variant_each_and_pin_lltm(cpu_wheel, cuda_wheel):
    plugin = _plugin_name(cuda_wheel)
    with zipfile.ZipFile(cpu_wheel) as cpu, zipfile.ZipFile(cuda_wheel) as cuda:
        assert {n.split("/")[0] for n in cpu.namelist()} == {"lltm", f"lltm-{VERSION}.dist-info"}
        assert {n.split("/")[0] for n in cuda.namelist()} == {
            plugin,
            f"{plugin}-{VERSION}.dist-info",
        }
        metadata = cuda.read(f"{plugin}-{VERSION}.dist-info/METADATA").decode()
    assert re.findall(r"^Requires-Dist: (.*)$", metadata, re.MULTILINE) == [f"lltm=={VERSION}"]
    # Libraries without CPython API: one wheel per platform for every Python.
    assert "-py3-none-" in cpu_wheel.name and "-py3-none-" in cuda_wheel.name


@pytest.mark.slow
def test_cuda_plugin_uses_only_the_stable_abi(cuda_wheel, tmp_path):
    if shutil.which("nm") is None:
        _missing_prerequisite("needs nm (binutils) to list the plugin's symbols")
    with zipfile.ZipFile(cuda_wheel) as cuda:
        library = next(n for n in cuda.namelist() if n.endswith(".so"))
        cuda.extract(library, tmp_path)
    symbols = undefined_symbols(tmp_path / library)
    assert not unstable_symbols(symbols), "\n".join(unstable_symbols(symbols))
    assert not [s for s in symbols if s.startswith(("Py", "_Py"))], symbols
    assert "aoti_torch_cuda_addmm_out" in symbols
    assert "aoti_torch_get_current_cuda_stream" in symbols


@pytest.mark.slow
def test_cpu_wheel_alone_with_cuda_torch(cuda_env, cpu_wheel):
    _install(cuda_env, cpu_wheel)
    report = _probe(cuda_env)
    info = report["info"]
    assert info["cuda_plugin"] is None and report["plugin_modules"] == []
    assert "not installed" in info["cuda_status"]
    assert info["cuda_fix"] == f"pip install 'lltm[cuda{CUDA_MAJOR}]=={VERSION}'"
    assert info["kernels"]["cuda"] == "composite (fallback)"
    assert report["lltm_warnings"] == []  # nothing wrong until a CUDA tensor shows up
    text = _info_text(cuda_env)
    assert "not installed" in text and f"pip install 'lltm[cuda{CUDA_MAJOR}]" in text


@pytest.mark.slow
def test_no_plugin_cuda_tensors_run_the_composite_after_one_warning(cuda_env, cpu_wheel):
    _install(cuda_env, cpu_wheel)
    report = _probe(cuda_env, "--cuda-steps")
    if report["cuda_steps"] is None:
        pytest.skip("needs a GPU: CUDA tensors to run the composite implementation on")
    steps = report["cuda_steps"]
    assert steps["max_error"] < 1e-12
    [warning] = steps["lltm_warnings"]  # three steps, one warning
    assert warning.startswith("RuntimeWarning") and "composite" in warning
    assert f"pip install 'lltm[cuda{CUDA_MAJOR}]=={VERSION}'" in warning


@pytest.mark.slow
def test_both_wheels_with_cpu_only_torch(cpu_env, cpu_wheel, cuda_wheel):
    _install(cpu_env, cpu_wheel, cuda_wheel)
    plugin = _plugin_name(cuda_wheel)
    report = _probe(cpu_env)
    info = report["info"]
    assert info["torch_cuda"] is None
    assert info["cuda_plugin"] == plugin
    assert "CPU-only build" in info["cuda_status"]
    assert info["kernels"]["cuda"] == "composite (fallback)"
    assert "install a CUDA build of torch" in info["cuda_fix"]
    [warning] = report["lltm_warnings"]
    assert warning.startswith("RuntimeWarning") and "CPU-only build" in warning
    assert "CPU-only build" in _info_text(cpu_env)


@pytest.mark.slow
def test_extra_resolves_and_loads_the_plugin(cuda_env, cpu_wheel, cuda_wheel, tmp_path):
    # `pip install "lltm[cuda13]"` as a user types it, resolved for real from
    # a folder holding only the two wheels (no index): the extra must name
    # the plugin built from this very version, and torch, already there,
    # must be kept.
    plugin = _plugin_name(cuda_wheel)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for wheel in (cpu_wheel, cuda_wheel):
        shutil.copy2(wheel, wheels)
    major = plugin.removeprefix("lltm_cuda")
    cuda_env.pip("install", "--no-index", "--find-links", wheels, f"lltm[cuda{major}]")
    installed = json.loads(
        cuda_env.run(
            "-c",
            "import json, importlib.metadata as m; "
            f"print(json.dumps([m.version(n) for n in ('lltm', 'lltm-cuda{major}', 'torch')]))",
        )
    )
    assert installed[:2] == [VERSION, VERSION]
    assert installed[2].split("+")[0] == CUDA_TORCH
    report = _probe(cuda_env)
    info = report["info"]
    assert info["cuda_plugin"] == plugin
    assert info["kernels"]["cuda"] == "native"
    assert f"{plugin} {VERSION} (CUDA {major}." in info["cuda_status"]
    assert report["lltm_warnings"] == []
    assert f"{plugin}._C" in report["plugin_modules"]
    if info["cuda_devices"]:
        assert info["cuda_kernels_active"]
    else:
        assert not info["cuda_kernels_active"]
        assert "no CUDA device or driver" in info["cuda_status"]
    version = cuda_env.run("-c", f"import {plugin} as p; print(p.__version__, p.cuda_version)")
    assert version.split()[0] == VERSION


def _damage(library: Path, how: str) -> None:
    """Truncated to one page (what an interrupted copy leaves: dlopen accepts
    its headers, then the loader faults past the end of the file with
    SIGBUS), or one byte changed in the middle (same size)."""
    if how == "truncated":
        with library.open("r+b") as f:
            f.truncate(4096)
    else:
        data = bytearray(library.read_bytes())
        data[len(data) // 2] ^= 0xFF
        library.write_bytes(bytes(data))


def _run_python(env: Env, code: str) -> subprocess.CompletedProcess:
    """`code` in the environment's Python, away from the source tree."""
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(env.python), "-c", code],
        capture_output=True,
        text=True,
        check=False,
        env=clean,
        cwd=env.path,
        timeout=COMMAND_TIMEOUT_S,
    )


DAMAGE = {
    "truncated": "is 4096 bytes where the installer wrote",
    "flipped": "does not match the installer's sha256",
}


@pytest.mark.slow
@pytest.mark.parametrize("how", DAMAGE)
def test_damaged_plugin_library_leaves_lltm_usable(cuda_env, cpu_wheel, cuda_wheel, how):
    _install(cuda_env, cpu_wheel, cuda_wheel)
    plugin = _plugin_name(cuda_wheel)
    [library] = (cuda_env.site_packages() / plugin / "lib").glob("lltm_cuda.*")
    _damage(library, how)
    report = _probe(cuda_env)  # a crash while loading fails here
    info = report["info"]
    assert info["cuda_plugin"] == plugin
    assert f"{plugin} is damaged" in info["cuda_status"]
    assert DAMAGE[how] in info["cuda_status"]
    assert info["kernels"]["cuda"] == "composite (fallback)"
    assert info["cuda_fix"] == (
        f"pip install --force-reinstall --no-deps '{plugin.replace('_', '-')}=={VERSION}'"
    )
    [warning] = report["lltm_warnings"]
    assert warning.startswith("RuntimeWarning") and "is damaged" in warning
    assert "is damaged" in _info_text(cuda_env)
    # Imported directly, the plugin says the same instead of loading the file.
    direct = _run_python(cuda_env, f"import {plugin}")
    assert direct.returncode == 1, direct
    # lltm._native.DamagedLibrary, an ImportError.
    assert "DamagedLibrary" in direct.stderr and "is damaged" in direct.stderr


@pytest.mark.slow
@pytest.mark.parametrize("how", DAMAGE)
def test_damaged_lltm_library_raises_an_import_error(cpu_env, cpu_wheel, how):
    _install(cpu_env, cpu_wheel)
    [library] = (cpu_env.site_packages() / "lltm" / "lib").glob("lltm_cpu.*")
    _damage(library, how)
    result = _run_python(cpu_env, "import lltm")
    # An exception, not a signal: SIGBUS would be -7 (exit status 135).
    assert result.returncode == 1, result
    assert "DamagedLibrary: lltm: the installed library" in result.stderr
    assert DAMAGE[how] in result.stderr
    assert f"pip install --force-reinstall --no-deps 'lltm=={VERSION}'" in result.stderr


def _stand_in_plugin(root: Path, name: str, lltm_version: str, cuda_version: str) -> Path:
    """An importable package ``name`` under ``root`` in the plugin's shape:
    ``_C`` carries ``lltm_version`` and ``cuda_version`` and, when imported,
    registers kernels for the CUDA dispatch key, as the real library does
    (here lltm's composite ones, counted in ``calls``)."""
    package = root / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        f'"""Stands in for {name}, built from lltm {lltm_version}."""\n'
        f"__version__ = {lltm_version!r}\n"
    )
    (package / "_C.py").write_text(
        textwrap.dedent(
            f"""
            import torch

            import lltm._C  # the op schemas
            import lltm.ops  # the composite kernels, in the operators' table

            lltm_version = {lltm_version!r}
            cuda_version = {cuda_version!r}
            device = "cuda"
            calls = []

            def _counted(kernel):
                def run(*args):
                    calls.append(kernel.__name__)
                    return kernel(*args)
                return run

            _composite = {{op.name: op.composite for op in lltm.ops.OPERATORS}}
            _library = torch.library.Library("lltm", "IMPL")
            for _name in ("forward", "backward", "sequence_forward", "sequence_backward"):
                _library.impl(_name, _counted(_composite[_name]), "CUDA")
            """
        )
    )
    return root


@pytest.mark.slow
def test_plugin_for_another_cuda_major_warns_at_import(cuda_env, cpu_wheel, tmp_path):
    # lltm_cuda12 next to a CUDA 13 torch: never imported, named at import.
    _install(cuda_env, cpu_wheel)
    plugins = _stand_in_plugin(tmp_path / "plugins", "lltm_cuda12", VERSION, "12.8")
    report = _probe(cuda_env, "--cuda-steps", pythonpath=plugins)
    info = report["info"]
    fix = f"pip install 'lltm[cuda{CUDA_MAJOR}]=={VERSION}'"
    [warning] = report["lltm_warnings"]
    assert warning.startswith("RuntimeWarning: lltm: CUDA kernels unavailable")
    assert f"lltm_cuda12 is installed, but torch {CUDA_TORCH}" in warning
    assert f"which needs lltm_cuda{CUDA_MAJOR}" in warning and fix in warning
    assert report["plugin_modules"] == []  # its kernels were not loaded
    assert (info["cuda_plugin"], info["cuda_fix"]) == ("lltm_cuda12", fix)
    assert info["kernels"]["cuda"] == "composite (fallback)"
    assert f"needs lltm_cuda{CUDA_MAJOR}" in _info_text(cuda_env, plugins)
    if report["cuda_steps"] is not None:  # on a GPU: the composite runs, correctly
        assert report["cuda_steps"]["max_error"] < 1e-12


@pytest.mark.slow
def test_plugin_from_another_lltm_version_warns_and_is_used(cuda_env, cpu_wheel, tmp_path):
    _install(cuda_env, cpu_wheel)
    plugin = f"lltm_cuda{CUDA_MAJOR}"
    plugins = _stand_in_plugin(tmp_path / "plugins", plugin, "0.0.1", f"{CUDA_MAJOR}.0")
    report = _probe(cuda_env, "--cuda-steps", pythonpath=plugins)
    info = report["info"]
    [warning] = report["lltm_warnings"]
    assert warning.startswith("RuntimeWarning: lltm: CUDA kernels mismatched")
    assert f"{plugin} 0.0.1 (CUDA {CUDA_MAJOR}.0) is loaded but lltm is {VERSION}" in warning
    assert f"pip install --force-reinstall --no-deps 'lltm-cuda{CUDA_MAJOR}=={VERSION}'" in warning
    # Its kernels serve CUDA tensors: registered for the CUDA key, and no composite.
    assert f"{plugin}._C" in report["plugin_modules"]
    assert info["kernels"]["cuda"] == "native"
    assert "is loaded but lltm is" in _info_text(cuda_env, plugins)
    if report["cuda_steps"] is not None:  # on a GPU: they ran, without a composite warning
        assert report["cuda_steps"]["lltm_warnings"] == []
        calls = cuda_env.run(
            "-c",
            f"import lltm, torch, {plugin}._C as p; from lltm import reference; "
            "lltm.lltm_cell(*reference.example_inputs(device='cuda')); print(p.calls)",
            env={"PYTHONPATH": str(plugins)},
        )
        assert "forward" in calls


@pytest.mark.slow
def test_console_script_of_an_installed_wheel(cpu_env, cpu_wheel):
    # `lltm info` and `lltm bench`, as the wheel's entry point installs them.
    _install(cpu_env, cpu_wheel)
    script = cpu_env.path / "bin" / "lltm"
    assert script.is_file()
    info = json.loads(cpu_env.run("info", "--json", executable=script))
    assert (info["lltm"], info["kernels"]["cpu"]) == (VERSION, "native")
    assert info["cpu_isa"] in ("baseline", "avx2", "avx512")
    assert "kernel [cpu]" in cpu_env.run("info", executable=script)
    tiny = ["-b", "2", "-f", "3", "-s", "4", "-r", "1", "--block-seconds", "0.001"]
    report = json.loads(
        cpu_env.run(
            "bench", *tiny, "--device", "cpu", "--impl", "lltm", "--json", "-", executable=script
        )
    )
    assert [(row["loss"], row["impl"]) for row in report["results"]] == [
        ("sum", "reference"), ("sum", "lltm"), ("dense", "reference"), ("dense", "lltm"),
    ]  # fmt: skip
    assert all(row["error"] is None for row in report["results"])
    sequence = json.loads(
        cpu_env.run(
            "bench", *tiny, "--seq-len", "2", "--impl", "lltm-sequence", "--json", "-",
            executable=script,
        )
    )  # fmt: skip
    assert [(row["loss"], row["impl"]) for row in sequence["results"]] == [
        ("sum", "reference-loop"), ("sum", "lltm-sequence"),
        ("dense", "reference-loop"), ("dense", "lltm-sequence"),
    ]  # fmt: skip
