"""lltm with and without its CUDA plugin: ``import lltm`` never fails, ``python
-m lltm info`` says which kernels are active and why, and the op always runs.

The slow tests install the real wheels into real environments (no mocks):

* the CPU wheel alone, next to a CUDA build of torch: the plugin is missing;
* both wheels next to a CPU-only torch: the plugin cannot be used;
* both wheels next to a CUDA torch on this GPU-less machine: the plugin loads;
* both wheels with a damaged library (the plugin's, lltm's own): never loaded,
  a damaged plugin leaves lltm usable, a damaged lltm says what to reinstall.

Wheels come from $LLTM_TEST_WHEELS (a folder holding both, e.g. dist/) or are
built here from a clean copy of the source tree. The environments are cached
in $LLTM_TEST_VENV_CACHE (default ~/.cache/lltm/test-venvs), keyed by Python,
torch and build requirements, since a CUDA torch is several GB; each test
puts the lltm packages it needs into them itself.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import ALL_GRADS, GRAD_NAMES, assert_all_close, make_inputs

from lltm import _backends, _composite

ROOT = Path(__file__).resolve().parents[1]
VERSION = re.search(r'__version__ = "([^"]+)"', (ROOT / "src/lltm/_version.py").read_text())[1]
CPU_TORCH = "2.13.0"  # a CPU-only build here
CUDA_TORCH = "2.14.1"  # a CUDA 13 build, also what the CUDA wheel is built with
BUILD_REQUIREMENTS = ["setuptools>=77", "wheel", "ninja"]
CUDA_HOME = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))


# --- The composite kernel and the plugin decisions (fast, in this process) ---


@pytest.mark.parametrize(
    "shape", [(1, 1, 1), (3, 5, 7), (16, 32, 128), (0, 3, 4), (4, 0, 6)], ids=str
)
def test_composite_kernel_matches_native_cpu_kernel(shape):
    inputs = make_inputs(*shape)
    native = torch.ops.lltm.forward(*inputs)
    composite = _composite.forward(*inputs)
    assert_all_close(composite, native, ("new_h", "new_cell", "gates"))
    new_h, new_cell, gates = native
    input, weights, _, old_h, _ = inputs
    generator = torch.Generator().manual_seed(1)
    grad_h, grad_cell = (
        torch.randn(t.shape, generator=generator, dtype=t.dtype) for t in (new_h, new_cell)
    )
    args = (grad_h, grad_cell, new_cell, gates, input, old_h, weights, ALL_GRADS)
    assert_all_close(_composite.backward(*args), torch.ops.lltm.backward(*args), GRAD_NAMES)


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


@dataclass(frozen=True)
class Env:
    """A virtual environment, driven through its own Python."""

    path: Path

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def run(
        self, *args: str | Path, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> str:
        clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        result = subprocess.run(
            [str(self.python), *map(str, args)],
            capture_output=True,
            text=True,
            env={**clean, **(env or {})},
            cwd=cwd or self.path,  # not the source tree: import the installed lltm
        )
        assert result.returncode == 0, f"{args} failed:\n{result.stdout}\n{result.stderr}"
        return result.stdout

    def pip(self, *args: str | Path) -> str:
        return self.run("-m", "pip", "--disable-pip-version-check", "--quiet", *args)

    def site_packages(self) -> Path:
        return Path(
            self.run("-c", "import sysconfig; print(sysconfig.get_path('purelib'))").strip()
        )


def _cached_env(name: str, requirements: list[str]) -> Env:
    root = Path(os.environ.get("LLTM_TEST_VENV_CACHE", Path.home() / ".cache/lltm/test-venvs"))
    env = Env(root / f"py{sys.version_info.major}.{sys.version_info.minor}-{name}")
    ready = env.path / "lltm-test-requirements.json"
    if ready.is_file() and json.loads(ready.read_text()) == requirements:
        return env
    shutil.rmtree(env.path, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(env.path)], check=True)
    env.pip("install", *requirements)
    ready.write_text(json.dumps(requirements))  # written last: marks a complete install
    return env


@pytest.fixture(scope="session")
def cuda_torch_env() -> Env:
    # Also the build environment of the wheels.
    return _cached_env(f"torch{CUDA_TORCH}", [f"torch=={CUDA_TORCH}", *BUILD_REQUIREMENTS])


@pytest.fixture(scope="session")
def cpu_torch_env() -> Env:
    return _cached_env(f"torch{CPU_TORCH}", [f"torch=={CPU_TORCH}"])


@dataclass(frozen=True)
class Wheels:
    cpu: Path
    cuda: Path

    @property
    def plugin(self) -> str:
        """Import name of the plugin, from the wheel's name: lltm_cuda13."""
        return self.cuda.name.split("-")[0]


def _find_wheels(folder: Path) -> Wheels | None:
    cpu = sorted(folder.glob(f"lltm-{VERSION}-*.whl"))
    cuda = sorted(folder.glob(f"lltm_cuda*-{VERSION}-*.whl"))
    return Wheels(cpu[-1], cuda[-1]) if cpu and cuda else None


def _build_wheel(env: Env, variant: str, out: Path, scratch: Path) -> None:
    # A fresh copy per variant: setuptools packs whatever ./build holds.
    source = scratch / f"src-{variant}"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".nox", "build", "dist", "*.so", "__pycache__", "*.egg-info"
        ),
    )
    build_env = {"LLTM_VARIANT": variant, "CUDA_HOME": str(CUDA_HOME), "MAX_JOBS": "2"}
    env.run(
        "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", out, source, env=build_env
    )


@pytest.fixture(scope="session")
def wheels(cuda_torch_env, tmp_path_factory) -> Wheels:
    given = os.environ.get("LLTM_TEST_WHEELS")
    if given:
        found = _find_wheels(Path(given))
        if found is None:
            pytest.fail(
                f"LLTM_TEST_WHEELS={given} lacks lltm-{VERSION} and lltm_cuda*-{VERSION} wheels"
            )
        return found
    if not (CUDA_HOME / "bin" / "nvcc").exists():
        pytest.skip(
            f"no nvcc under CUDA_HOME={CUDA_HOME} to build the CUDA wheel (or set LLTM_TEST_WHEELS)"
        )
    scratch = tmp_path_factory.mktemp("wheels")
    for variant in ("cpu", "cuda"):
        _build_wheel(cuda_torch_env, variant, scratch / "dist", scratch)
    return _find_wheels(scratch / "dist")


def _install(env: Env, *wheels: Path) -> None:
    env.pip("uninstall", "--yes", "lltm", "lltm-cuda12", "lltm-cuda13")
    env.pip("install", "--no-deps", *wheels)


def _probe(env: Env) -> dict:
    """What lltm reports in ``env``, after computing one step on the CPU."""
    report = json.loads(env.run(ROOT / "tests" / "install_probe.py").splitlines()[-1])
    assert report["max_error"] < 1e-12, "the op gave wrong results"
    assert report["info"]["kernels"]["cpu"] == "native"
    return report


@pytest.mark.slow
def test_wheels_hold_one_variant_each_and_pin_lltm(wheels):
    with zipfile.ZipFile(wheels.cpu) as cpu, zipfile.ZipFile(wheels.cuda) as cuda:
        assert {n.split("/")[0] for n in cpu.namelist()} == {"lltm", f"lltm-{VERSION}.dist-info"}
        assert {n.split("/")[0] for n in cuda.namelist()} == {
            wheels.plugin,
            f"{wheels.plugin}-{VERSION}.dist-info",
        }
        metadata = cuda.read(f"{wheels.plugin}-{VERSION}.dist-info/METADATA").decode()
    assert re.findall(r"^Requires-Dist: (.*)$", metadata, re.MULTILINE) == [f"lltm=={VERSION}"]
    assert "-abi3-" in wheels.cpu.name and "-abi3-" in wheels.cuda.name


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm (binutils)")
def test_cuda_plugin_uses_only_the_stable_abi(wheels, tmp_path):
    with zipfile.ZipFile(wheels.cuda) as cuda:
        library = next(n for n in cuda.namelist() if n.endswith(".so"))
        cuda.extract(library, tmp_path)
    nm = ["nm", "-DC", "--undefined-only", str(tmp_path / library)]
    undefined = subprocess.run(nm, capture_output=True, text=True, check=True).stdout
    assert not re.findall(r"\b(at|c10)::\S+", undefined)
    assert "aoti_torch_cuda_addmm_out" in undefined
    assert "aoti_torch_get_current_cuda_stream" in undefined


@pytest.mark.slow
def test_cpu_wheel_alone_with_cuda_torch(cuda_torch_env, wheels):
    _install(cuda_torch_env, wheels.cpu)
    report = _probe(cuda_torch_env)
    info = report["info"]
    assert info["cuda_plugin"] is None
    assert "not installed" in info["cuda_status"]
    assert info["cuda_fix"] == f"pip install 'lltm[cuda13]=={VERSION}'"
    assert info["kernels"]["cuda"] == "composite (fallback)"
    assert report["lltm_warnings"] == []  # nothing wrong until a CUDA tensor shows up
    text = cuda_torch_env.run("-m", "lltm", "info")
    assert "not installed" in text and "pip install 'lltm[cuda13]" in text


@pytest.mark.slow
def test_both_wheels_with_cpu_only_torch(cpu_torch_env, wheels):
    _install(cpu_torch_env, wheels.cpu, wheels.cuda)
    report = _probe(cpu_torch_env)
    info = report["info"]
    assert info["torch_cuda"] is None
    assert info["cuda_plugin"] == wheels.plugin
    assert "CPU-only build" in info["cuda_status"]
    assert info["kernels"]["cuda"] == "composite (fallback)"
    assert "install a CUDA build of torch" in info["cuda_fix"]
    [warning] = report["lltm_warnings"]
    assert warning.startswith("RuntimeWarning") and "CPU-only build" in warning
    assert "CPU-only build" in cpu_torch_env.run("-m", "lltm", "info")


@pytest.mark.slow
def test_both_wheels_with_cuda_torch_load_the_plugin(cuda_torch_env, wheels):
    _install(cuda_torch_env, wheels.cpu, wheels.cuda)
    report = _probe(cuda_torch_env)
    info = report["info"]
    assert info["cuda_plugin"] == wheels.plugin
    assert info["kernels"]["cuda"] == "native"
    assert f"{wheels.plugin} {VERSION} (CUDA 13." in info["cuda_status"]
    assert report["lltm_warnings"] == []
    if info["cuda_devices"]:
        assert info["cuda_kernels_active"]
    else:
        assert not info["cuda_kernels_active"]
        assert "no CUDA device or driver" in info["cuda_status"]
    version = cuda_torch_env.run(
        "-c", f"import {wheels.plugin} as p; print(p.__version__, p.cuda_version)"
    )
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
    )


DAMAGE = {
    "truncated": "is 4096 bytes where the installer wrote",
    "flipped": "does not match the installer's sha256",
}


@pytest.mark.slow
@pytest.mark.parametrize("how", DAMAGE)
def test_damaged_plugin_library_leaves_lltm_usable(cuda_torch_env, wheels, how):
    _install(cuda_torch_env, wheels.cpu, wheels.cuda)
    [library] = (cuda_torch_env.site_packages() / wheels.plugin).glob("_C*.so")
    _damage(library, how)
    report = _probe(cuda_torch_env)  # a crash while loading fails here
    info = report["info"]
    assert info["cuda_plugin"] == wheels.plugin
    assert f"{wheels.plugin} is damaged" in info["cuda_status"]
    assert DAMAGE[how] in info["cuda_status"]
    assert info["kernels"]["cuda"] == "composite (fallback)"
    assert info["cuda_fix"] == (
        f"pip install --force-reinstall --no-deps '{wheels.plugin.replace('_', '-')}=={VERSION}'"
    )
    [warning] = report["lltm_warnings"]
    assert warning.startswith("RuntimeWarning") and "is damaged" in warning
    assert "is damaged" in cuda_torch_env.run("-m", "lltm", "info")
    # Imported directly, the plugin says the same instead of loading the file.
    direct = _run_python(cuda_torch_env, f"import {wheels.plugin}")
    assert direct.returncode == 1, direct
    assert "ImportError" in direct.stderr and "is damaged" in direct.stderr


@pytest.mark.slow
@pytest.mark.parametrize("how", DAMAGE)
def test_damaged_lltm_library_raises_an_import_error(cpu_torch_env, wheels, how):
    _install(cpu_torch_env, wheels.cpu)
    [library] = (cpu_torch_env.site_packages() / "lltm").glob("_C*.so")
    _damage(library, how)
    result = _run_python(cpu_torch_env, "import lltm")
    # An exception, not a signal: SIGBUS would be -7 (exit status 135).
    assert result.returncode == 1, result
    assert "ImportError: lltm: the installed library" in result.stderr
    assert DAMAGE[how] in result.stderr
    assert f"pip install --force-reinstall --no-deps 'lltm=={VERSION}'" in result.stderr
