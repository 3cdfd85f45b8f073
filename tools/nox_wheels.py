"""Wheels for the nox sessions: built once per set of inputs, and the release's steps replayed.

The sessions that build the same sources against the same torch under the
same Python share one CPU wheel (minutes of compiling on two cores). ``nox
-s cibuildwheel`` replays cibuildwheel's build, repair, audit and test
steps for both variants as the release workflow runs them, without its
manylinux containers (no Docker on the development machines).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

import nox

from tools import nox_envs
from tools.cibw_config import CUDA_CONFIG as CIBW_CUDA_CONFIG
from tools.cibw_config import linux_options as cibw_options
from tools.nox_envs import PYPROJECT, fresh_env, group, install_torch
from tools.nox_matrix import BUILD_TORCH, CUDA_TORCH, NEWEST_PYTHON, NEWEST_TORCH
from tools.project_facts import version

ROOT = Path(__file__).resolve().parents[1]
DIST = ROOT / "dist"
VERSION = version()
BUILD_REQUIRES = PYPROJECT["build-system"]["requires"]
# wheels.yml pins the cibuildwheel action to v3.2.1: the same version checks here.
CIBUILDWHEEL = "cibuildwheel==3.2.1"

# setup.py's requirements besides torch: the build group, which the test
# group includes, and build-system.requires say the same.
BUILD_TOOLS = group("build")
assert sorted(BUILD_TOOLS) == sorted(r for r in BUILD_REQUIRES if not r.startswith("torch")), (
    "pyproject.toml: the build dependency group and build-system.requires (torch aside) differ"
)


def source_copy(session: nox.Session) -> Path:
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


def inputs_digest(tree: Path) -> str:
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


# Held by ``nox -s cibuildwheel`` while it builds and repairs the wheels
# ``repaired_wheels`` names: ``nox -s slow`` takes it before it looks there.
REPAIRING_LOCK = WHEEL_CACHE / ".repairing.lock"


def repaired_wheels(session: nox.Session) -> Path:
    """Where ``nox -s cibuildwheel`` keeps the wheels it repaired from this
    checkout's sources: ``nox -s slow`` installs those rather than building
    both variants again (minutes of compiling, the CUDA one for every GPU)."""
    return WHEEL_CACHE / f"repaired-{inputs_digest(source_copy(session))}"


def cpu_wheel_cache(session: nox.Session, torch_version: str, tree: Path) -> Path:
    """Where the CPU wheel built from ``tree`` against ``torch_version`` under
    the session's Python is kept."""
    python = session.python or f"{sys.version_info.major}.{sys.version_info.minor}"
    return WHEEL_CACHE / f"torch{torch_version}-py{python}-{inputs_digest(tree)}"


def keep_cpu_wheel(cache: Path, wheel: Path) -> None:
    # Whole or absent for a session reading the cache beside this one.
    cache.mkdir(parents=True, exist_ok=True)
    partial = cache / f"{wheel.name}.partial"
    shutil.copy2(wheel, partial)
    partial.replace(cache / wheel.name)


def build_wheel(session: nox.Session, torch_version: str, variant: str, outdir: Path) -> Path:
    """Builds one variant's wheel against ``torch_version`` into ``outdir``; a
    CPU wheel already built from the same inputs, torch and Python is reused.
    A build installs torch and the build requirements into the session; a
    reused wheel installs nothing (a CUDA build of torch is 6 GB on disk)."""
    outdir.mkdir(parents=True, exist_ok=True)
    source = source_copy(session)
    cache = None
    if variant == "cpu":
        cache = cpu_wheel_cache(session, torch_version, source)
        cached = sorted(cache.glob("*.whl"))
        if cached:
            session.log(f"reusing {cached[-1].name}, built from the same sources ({cache.name})")
            return Path(shutil.copy2(cached[-1], outdir))
    install_torch(session, torch_version, *BUILD_TOOLS, build=variant)
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
        keep_cpu_wheel(cache, built[-1])
    return built[-1]


# Local stand-in for TORCH_CUDA_ARCH_LIST of the CUDA build when no wheel from
# `nox -s build` is in dist/: one architecture (Hopper) keeps the build short.
LOCAL_CUDA_ARCHS = os.environ.get("LLTM_LOCAL_CUDA_ARCH_LIST", "9.0")


def command(value: str | list[str]) -> str:
    """A cibuildwheel command option (a string, or a list joined with &&)."""
    return value if isinstance(value, str) else " && ".join(value)


def run_test_command(
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
    script = f'PATH="{bindir}{os.pathsep}$PATH"; {command(options["test-command"])}'
    with session.chdir(cwd):
        session.run("bash", "-c", script, env=env, external=True)


def check_wheel(session: nox.Session, wheel: Path, variant: str) -> None:
    """Name, tags, contents and metadata of a repaired wheel, then check-wheel-contents."""
    session.run("python", "-m", "tools.check_wheel", variant, str(wheel))
    session.run("check-wheel-contents", str(wheel))


def built_or_reused(session: nox.Session, variant: str, outdir: Path) -> Path:
    """The variant's wheel from dist/ (``nox -s build``) if there, else a fresh build."""
    pattern = f"lltm-{VERSION}-*.whl" if variant == "cpu" else f"lltm_cuda*-{VERSION}-*.whl"
    found = sorted(DIST.glob(pattern))
    if found:
        session.log(f"reusing {found[-1].name} from dist/")
        return found[-1]
    options = cibw_options(ROOT / "pyproject.toml" if variant == "cpu" else CIBW_CUDA_CONFIG)
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


def replay_cibuildwheel(session: nox.Session) -> None:
    """The steps of ``nox -s cibuildwheel`` (its docstring, in noxfile.py,
    says how they differ from cibuildwheel's own)."""
    session.install(CIBUILDWHEEL, "auditwheel", "check-wheel-contents", "packaging", "pip>=25")

    # The build matrix cibuildwheel derives from the configurations: one wheel
    # per platform, built for cp310 and tested again, unchanged, on cp314t.
    session.run("python", "-m", "tools.check_build_identifiers")

    # setup.py's C++ flags for each compiler, MSVC (the Windows wheel) included.
    install_torch(session, BUILD_TORCH, *BUILD_TOOLS)
    session.run("python", "-m", "tools.check_build_flags")

    # Runner disk: the CUDA build installs two CUDA builds of torch in its
    # container; pip's cache there would hold another copy of each.
    cuda_environment = cibw_options(CIBW_CUDA_CONFIG)["environment"]
    assert cuda_environment.get("PIP_NO_CACHE_DIR") == "1", cuda_environment

    # nox -s slow installs the repaired wheels: where it runs beside this
    # session (.ci/run), it waits for this lock, held until they are in place.
    with nox_envs.locked(REPAIRING_LOCK):
        wheelhouse = Path(session.create_tmp()) / "wheelhouse"
        shutil.rmtree(wheelhouse, ignore_errors=True)
        repaired: dict[str, Path] = {}
        for variant, config_file in (("cpu", ROOT / "pyproject.toml"), ("cuda", CIBW_CUDA_CONFIG)):
            options = cibw_options(config_file)
            built = built_or_reused(
                session, variant, Path(session.create_tmp()) / f"built-{variant}"
            )
            dest = wheelhouse / variant
            dest.mkdir(parents=True)
            # The configured repair command: auditwheel with the exclusions.
            repair = command(options["repair-wheel-command"])
            repair = repair.replace("{wheel}", str(built)).replace("{dest_dir}", str(dest))
            session.run("bash", "-c", repair, external=True)
            (wheel,) = dest.glob("*.whl")
            check_wheel(session, wheel, variant)
            # Who installs it: CPython 3.10 to 3.14 and 3.14t, by pip's own rules.
            session.run("python", "-m", "tools.check_wheel_tags", str(wheel))
            repaired[variant] = wheel
        # Complete or absent for nox -s slow, which may be running beside this
        # session: copied aside, then renamed into place.
        kept = repaired_wheels(session)
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
            nox_envs.interpreter(session, NEWEST_PYTHON),
            NEWEST_TORCH,
            ("cp310-manylinux_x86_64", "cp314t-manylinux_x86_64"),
        ),
    ):
        python, env = fresh_env(session, name, interpreter=interpreter)
        for identifier in identifiers:
            for variant, config_file in (
                ("cpu", ROOT / "pyproject.toml"),
                ("cuda", CIBW_CUDA_CONFIG),
            ):
                options = cibw_options(config_file, identifier)
                groups = [req for name in options.get("test-groups", []) for req in group(name)]
                requires = [*groups, *options.get("test-requires", [])]
                wheel = str(repaired[variant])
                install_torch(
                    session, torch_version, wheel, *requires, build="cuda", python=python, env=env
                )
                session.log(f"{config_file.name}: the test-command of {identifier}")
                run_test_command(session, options, env, ROOT)
        # One CUDA build of torch at a time on the disk (its deletion goes on
        # beside the next steps).
        nox_envs.delete_in_background(Path(env["VIRTUAL_ENV"]))
