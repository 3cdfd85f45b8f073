"""lltm on linux-aarch64, built and tested from an x86-64 Linux machine.

``nox -s aarch64`` runs this with nothing prepared (as root, or with sudo):

1. Host tools, from the distribution's packages when missing: qemu's user
   emulation, mmdebstrap, GNU's aarch64 cross toolchain and Clang; arm64
   programs are handed to qemu by the kernel (binfmt_misc, mounted and
   registered here when it is not).
2. An arm64 Debian root (bookworm: CPython 3.11, the Python of torch's cp311
   aarch64 wheel) made of Debian's packages by mmdebstrap, which only
   extracts them (python3, a shell, coreutils, the C++ runtime torch needs,
   and what they depend on): no maintainer script runs under emulation
   (debootstrap's full install took 11 minutes here, this 16 seconds). torch's
   manylinux aarch64 wheel, its dependencies and the test dependencies come
   from PyPI, unpacked by this machine's pip (no emulation needed to unzip
   3 GB). Cached in $LLTM_ARM64_CACHE (default ~/.cache/lltm/arm64), rebuilt
   when what it should hold changes.
3. The CPU sources compiled for arm64 by GCC and by Clang with -Wall -Wextra
   -Werror, and their pointwise spans and the NEON set's fused sequence steps
   checked to be NEON code (objdump): the kernels are vectorised, not only
   correct.
4. lltm's CPU wheel cross-compiled: setup.py run by this Python with the
   aarch64 compilers (the build environment's torch, for x86-64, has the
   same headers) and linked against the root's arm64 torch. On two busy
   cores: 1 to 2.5 minutes, where a native build under emulation spent 15
   minutes on three of its four files.
5. The wheel installed into the root and the core of the test suite run on
   the emulated CPU (core("aarch64"), then BASELINE under LLTM_CPU_ISA=baseline), after
   ``python -m lltm info`` there has named aarch64 and neon.

    python -m tools.machines.emulated_aarch64 [--wheel-dir DIR] [-- PYTEST ARGS...]

The emulated CPU is a Neoverse N1 (AWS Graviton2, Ampere Altra): QEMU_CPU
picks it, and files describing it stand in for /proc/cpuinfo and the CPU
entries of /sys, since qemu 7.2 (Debian bookworm's) shows programs the
host's. Given an x86-64 /proc/cpuinfo, torch's CPU detection (oneDNN's
xbyak_aarch64) crashes at import.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tools import project_facts, torch_index
from tools.core_tests import core
from tools.machines import debian_root
from tools.machines.debian_root import MIRROR, SUITE

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("LLTM_ARM64_CACHE", Path.home() / ".cache" / "lltm" / "arm64"))
PYTHON = "3.11"  # bookworm's python3, and the cp311 of the wheels below
TORCH = os.environ.get("LLTM_ARM64_TORCH", "2.13.0")
TEST_REQUIREMENTS = ["pytest>=8", "pytest-timeout>=2.3", "hypothesis>=6.100", "numpy"]
HOST_PACKAGES = {
    # command that must exist: the Debian/Ubuntu package that brings it
    "qemu-aarch64-static": "qemu-user-static",
    "mmdebstrap": "mmdebstrap",
    "aarch64-linux-gnu-g++": "g++-aarch64-linux-gnu",
    "clang++": "clang",
}
QEMU_CPU = "neoverse-n1"
# /proc/cpuinfo of a Neoverse N1, one entry per CPU (MIDR 0x413fd0c1).
CPUINFO_ENTRY = """processor\t: {index}
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x3
CPU part\t: 0xd0c
CPU revision\t: 1

"""
MIDR = "0x00000000413fd0c1"

# Again with LLTM_CPU_ISA=baseline: on arm64 it differs from neon in the
# sequences' fused steps (register tiles of 4 rows instead of 6).
BASELINE = [
    "tests/test_cpu_isa.py::test_this_process_runs_the_set_the_environment_asks_for",
    "tests/test_fused_steps.py::test_tile_and_vector_edges",
    "tests/test_fused_steps.py::test_blocks_of_rows_per_thread_match_one_thread",
    "tests/test_sequence.py::test_float64_matches_loop_of_reference_cell",
    "tests/test_sequence.py::test_native_equals_composite",
    "tests/test_threads.py::test_split_sequence_matches_loop_of_reference_cells",
]
# The sources of lltm's CPU library, and the functions that must be NEON
# code: (symbol substring, the vector arrangement its float or double
# arithmetic uses: 4s = 4 floats, 2d = 2 doubles).
CPU_SOURCES = [
    "csrc/lltm_ops.cpp",
    "csrc/cpu/cell_kernel.cpp",
    "csrc/cpu/sequence_forward_kernel.cpp",
    "csrc/cpu/sequence_backward_kernel.cpp",
    "csrc/cpu/library_exports.cpp",
]
NEON_FUNCTIONS = [
    ("forward_span_baseline<float>", "4s"),
    ("forward_span_baseline<double>", "2d"),
    ("backward_span_baseline<float>", "4s"),
    ("backward_span_baseline<double>", "2d"),
    # NeonSet, csrc/cpu/fused_steps/dispatch.h's name for the set of 6-row tiles
    ("PortableSet<16, 6>::forward<float>", "4s"),
    ("PortableSet<16, 6>::forward<double>", "2d"),
    ("PortableSet<16, 6>::backward<float>", "4s"),
    ("PortableSet<16, 6>::backward<double>", "2d"),
]
COMPILERS = {
    "gcc": ["aarch64-linux-gnu-g++"],
    "clang": ["clang++", "--target=aarch64-linux-gnu"],
}
WARNINGS = ["-Wall", "-Wextra", "-Werror"]
# ccache before the compilers where the run has it (.ci/run: tools/compiler_cache.py;
# its links cover the compilers installed before it, and these come later).
# The cross build's compiles get it from torch, which puts ccache before the
# compiler when it is on PATH.
LAUNCHER = [found] if (found := shutil.which("ccache")) else []


# sudo keeps QEMU_CPU: the emulated CPU of the programs run in the root.
HOST = debian_root.Host("aarch64", preserve_env=["QEMU_CPU"])
log, run, as_root = HOST.log, HOST.run, HOST.as_root


# --- 1. Host tools -------------------------------------------------------------------


def host_tools() -> None:
    started = time.monotonic()
    if not sys.platform.startswith("linux"):
        sys.exit("aarch64: runs on Linux only (qemu user emulation, mmdebstrap)")
    HOST.install_packages(HOST_PACKAGES)
    binfmt = Path("/proc/sys/fs/binfmt_misc")
    if not (binfmt / "register").exists():
        as_root("mount", "-t", "binfmt_misc", "binfmt_misc", binfmt)
    if not (binfmt / "qemu-aarch64").exists():
        (rule,) = sorted(Path("/usr/lib/binfmt.d").glob("qemu-aarch64*.conf"))[:1]
        as_root("sh", "-c", f"cat {shlex.quote(str(rule))} > {binfmt / 'register'}")
    log(f"arm64 programs run through {interpreter()} ({time.monotonic() - started:.0f} s)")


def interpreter() -> Path:
    """The program the kernel runs arm64 binaries with (binfmt_misc)."""
    text = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").read_text()
    return Path(re.search(r"^interpreter (\S+)", text, re.MULTILINE).group(1))


# --- 2. The arm64 root -----------------------------------------------------------------


def _platform_args() -> list[str]:
    # torch and the CUDA libraries it loads are manylinux_2_17 to _2_28
    # wheels: pip takes only the platform tags it is given.
    tags = [f"manylinux_2_{x}_aarch64" for x in range(28, 16, -1)]
    tags += ["manylinux2014_aarch64", "linux_aarch64"]
    version = PYTHON.replace(".", "")
    args = ["--only-binary=:all:", "--python-version", PYTHON, "--implementation", "cp"]
    args += ["--abi", f"cp{version}", "--abi", "abi3", "--abi", "none"]
    return args + [a for tag in tags for a in ("--platform", tag)]


def site_packages(root: Path) -> Path:
    return root / "opt" / "venv" / "lib" / f"python{PYTHON}" / "site-packages"


def arm64_root() -> Path:
    """The cached root, made or remade when what it should hold changed."""
    root = CACHE / "root"
    wanted = {
        "suite": SUITE,
        "mirror": MIRROR,
        "torch": TORCH,
        "torch_index": torch_index.index("cpu"),
        "tests": TEST_REQUIREMENTS,
        "cpus": os.cpu_count(),
        "layout": 3,
    }
    stamp = CACHE / "root.json"
    if stamp.exists() and json.loads(stamp.read_text()) == wanted and root.is_dir():
        log(f"reusing the arm64 root {root}")
        return root
    started = time.monotonic()
    if root.exists():
        as_root("rm", "-rf", "--one-file-system", root)
    CACHE.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    # The packages' files only: python3 runs from them as they are.
    debian_root.mmdebstrap(
        HOST, root, arch="arm64", variant="extract",
        include=["python3", "python3-venv", "coreutils", "dash", "libstdc++6"],
    )  # fmt: skip
    as_root("mkdir", "-p", root / "proc", root / "sys", root / "root", root / "opt")
    log(f"mmdebstrap: {time.monotonic() - started:.0f} s")
    # The root's own venv, no pip in it: this machine's pip fills it (and
    # compiles the modules, which the emulated Python would otherwise do at
    # the first import, slowly).
    enter(root, ["python3", "-m", "venv", "--without-pip", "/opt/venv"])
    wheels = CACHE / "wheels"
    pip = [sys.executable, "-m", "pip"]
    requirements = [f"torch=={TORCH}", *TEST_REQUIREMENTS]
    # torch's CPU build from where the nox sessions take it (LLTM_TORCH_CPU_INDEX).
    run(
        *pip, "download", "--quiet", "--dest", wheels, *_platform_args(),
        *torch_index.pip_args("cpu"), f"torch=={TORCH}",
    )  # fmt: skip
    run(*pip, "download", "--quiet", "--dest", wheels, *_platform_args(), *TEST_REQUIREMENTS)
    log(f"downloaded: {time.monotonic() - started:.0f} s")
    as_root(
        *pip, "install", "--quiet", "--no-index", "--find-links", wheels, "--target",
        site_packages(root), *_platform_args(), *requirements,
    )  # fmt: skip
    # The CPU the programs see (see the module's docstring).
    cpus = os.cpu_count() or 1
    describe = root / "var" / "lib" / "lltm-arm64"
    as_root("mkdir", "-p", describe)
    cpuinfo = "".join(CPUINFO_ENTRY.format(index=i) for i in range(cpus))
    with tempfile.TemporaryDirectory() as scratch:
        sysfs = Path(scratch) / "sys" / "devices" / "system" / "cpu"
        for i in range(cpus):
            ident = sysfs / f"cpu{i}" / "regs" / "identification"
            ident.mkdir(parents=True)
            (ident / "midr_el1").write_text(MIDR + "\n")
        for name in ("possible", "present", "online"):
            (sysfs / name).write_text(f"0-{cpus - 1}\n")
        (Path(scratch) / "cpuinfo").write_text(cpuinfo)
        as_root("cp", "-r", Path(scratch) / "sys", Path(scratch) / "cpuinfo", describe)
    stamp.write_text(json.dumps(wanted))
    log(f"arm64 root ready in {time.monotonic() - started:.0f} s: {root}")
    return root


def enter(root: Path, command: list[str], env: dict[str, str] | None = None) -> None:
    """`command` run in the arm64 root, on the emulated CPU, with /proc, /dev
    and the CPU's description mounted (debian_root.enter)."""
    describe = root / "var" / "lib" / "lltm-arm64"
    os.environ["QEMU_CPU"] = QEMU_CPU
    if not (describe / "cpuinfo").exists():  # while the root is made
        debian_root.enter(HOST, root, command, dev=False)
        return
    # QEMU_CPU again inside: qemu starts anew, from the program's environment,
    # for each program run there.
    environment = {
        "PATH": "/opt/venv/bin:/usr/bin:/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "QEMU_CPU": QEMU_CPU,
        **(env or {}),
    }
    binds = [(describe / "cpuinfo", "/proc/cpuinfo"), (describe / "sys", "/sys")]
    debian_root.enter(HOST, root, command, environment=environment, binds=binds)


# --- 3. Both compilers, warnings as errors, NEON code -----------------------------------


def compile_check(root: Path) -> None:
    started = time.monotonic()
    torch_include = site_packages(root) / "torch" / "include"
    version = project_facts.version()
    target = re.search(r'^TORCH_TARGET_VERSION = "([^"]+)"', (ROOT / "setup.py").read_text(), re.M)
    flags = [
        "-O3", "-std=c++17", "-fPIC", *WARNINGS,
        # torch's headers are not lltm's to keep warning-free.
        "-isystem", str(torch_include),
        "-isystem", str(torch_include / "torch" / "csrc" / "api" / "include"),
        f"-DTORCH_TARGET_VERSION={target.group(1)}", f"-DLLTM_VERSION={version}",
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch:
        jobs = {
            (name, source): Path(scratch) / name / (Path(source).stem + ".o")
            for name in COMPILERS
            for source in CPU_SOURCES
        }
        for obj in jobs.values():
            obj.parent.mkdir(exist_ok=True)
        with ThreadPoolExecutor(max_workers=int(os.environ.get("MAX_JOBS", "2"))) as pool:
            compiled = [
                pool.submit(
                    run, *LAUNCHER, *COMPILERS[name], *flags, "-c", ROOT / source, "-o", obj
                )
                for (name, source), obj in jobs.items()
            ]
            for job in compiled:
                job.result()  # a compiler's failure, raised here
        for name in COMPILERS:
            objects = [obj for (compiler, _), obj in jobs.items() if compiler == name]
            code = run(
                "aarch64-linux-gnu-objdump", "-d", "--demangle", *objects,
                capture_output=True, text=True,
            ).stdout  # fmt: skip
            for function, arrangement in NEON_FUNCTIONS:
                body = _function_body(code, function)
                vector = re.findall(rf"\bf(?:mla|mul|add|div)\s+v\d+\.{arrangement}", body)
                assert body, f"{name}: no {function} in the objects"
                assert vector, f"{name}: {function} has no NEON .{arrangement} arithmetic"
                log(f"{name}: {function}: {len(vector)} NEON .{arrangement} instructions")
        log(
            "arm64 sources compile warning-free with GCC and Clang; spans and fused steps are NEON "
            f"({time.monotonic() - started:.0f} s)"
        )


def _function_body(disassembly: str, name: str) -> str:
    """The instructions of the functions whose demangled name contains `name`."""
    bodies, current = [], None
    for line in disassembly.splitlines():
        header = re.match(r"[0-9a-f]+ <(.*)>:$", line)
        if header:
            current = name in header.group(1)
        elif current:
            bodies.append(line)
    return "\n".join(bodies)


# --- 4. The cross-compiled wheel ------------------------------------------------------------


def cross_build(root: Path, outdir: Path) -> Path:
    # Beside the wheels, in the checkout: the compiler cache's keys hold
    # paths inside the checkout relative to the compile's folder, the same in
    # every run and clone.
    outdir.mkdir(parents=True, exist_ok=True)
    tree = Path(tempfile.mkdtemp(prefix="lltm-aarch64-src-", dir=outdir.parent))
    for name in ("setup.py", "pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        shutil.copy2(ROOT / name, tree / name)
    (tree / "tools").mkdir()
    shutil.copy2(ROOT / "tools" / "__init__.py", tree / "tools" / "__init__.py")
    for name in ("src", "csrc", "tools/setup_helpers"):
        shutil.copytree(
            ROOT / name,
            tree / name,
            ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.dll", "lib", "*.egg-info"),
        )
    env = {
        **os.environ,
        "LLTM_VARIANT": "cpu",
        "MAX_JOBS": os.environ.get("MAX_JOBS", "2"),
        "CC": "aarch64-linux-gnu-gcc",
        "CXX": "aarch64-linux-gnu-g++",
        "LDSHARED": "aarch64-linux-gnu-g++ -shared",
        # First on the linker's path: the arm64 torch's libraries (those of
        # this machine's torch, for x86-64, come after and are skipped).
        "LDFLAGS": f"-L{site_packages(root) / 'torch' / 'lib'}",
        # The platform the wheel is for (setuptools' and wheel's tag).
        "_PYTHON_HOST_PLATFORM": "linux-aarch64",
    }
    outdir.mkdir(parents=True, exist_ok=True)
    for old in outdir.glob("lltm-*.whl"):
        old.unlink()
    started = time.monotonic()
    run(
        sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps",
        "--no-cache-dir", "-w", outdir, tree, env=env,
    )  # fmt: skip
    shutil.rmtree(tree, ignore_errors=True)
    (wheel,) = outdir.glob("lltm-*-py3-none-linux_aarch64.whl")
    log(f"cross-compiled {wheel.name} in {time.monotonic() - started:.0f} s")
    _check_library(wheel)
    return wheel


def _check_library(wheel: Path) -> None:
    """The wheel's library is arm64 code that uses no CPython API."""
    with tempfile.TemporaryDirectory() as scratch, zipfile.ZipFile(wheel) as archive:
        library = Path(archive.extract("lltm/lib/lltm_cpu.so", scratch))
        header = run(
            "aarch64-linux-gnu-readelf", "-h", "-d", library, capture_output=True, text=True
        )
        symbols = run(
            "aarch64-linux-gnu-nm", "-D", "--undefined-only", library,
            capture_output=True, text=True,
        ).stdout.split()  # fmt: skip
    assert re.search(r"Machine:\s+AArch64", header.stdout), header.stdout
    assert "python" not in header.stdout.lower(), header.stdout
    python = [s for s in symbols if s.startswith(("Py", "_Py"))]
    assert not python, f"the arm64 library uses the CPython API: {python}"


# --- 5. The tests on the emulated CPU -------------------------------------------------------


def test(root: Path, wheel: Path, pytest_args: list[str]) -> None:
    as_root(
        sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--upgrade",
        "--target", site_packages(root), "--platform", "linux_aarch64",
        "--only-binary=:all:", "--python-version", PYTHON, "--implementation", "cp", wheel,
    )  # fmt: skip
    # The tests and pytest's configuration, in a directory of their own (no
    # source tree that could shadow the installed lltm).
    workdir = root / "opt" / "lltm-tests"
    as_root("rm", "-rf", workdir)
    as_root("mkdir", "-p", workdir)
    as_root("cp", "-r", ROOT / "tests", ROOT / "pyproject.toml", workdir)
    # `lltm info`, printed, and its facts kept for the checks below (one
    # interpreter start: each costs a minute or more here).
    show_info = (
        "import json; from lltm import info; facts = info.collect(); print(info.render(facts)); "
        "open('/opt/lltm-tests/info.json', 'w').write(json.dumps(facts))"
    )
    enter(root, ["python", "-c", show_info])
    info = json.loads((workdir / "info.json").read_text())
    assert "aarch64" in info["platform"], info["platform"]
    assert info["cpu_isa"] == "neon" and info["kernels"]["cpu"] == "native", info
    # Not the cuda_host parameters: the CUDA sources built for the host are
    # x86-64's business (nox -s cuda_host), and skipped they would only pad
    # the count.
    pytest = ["python", "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", "--durations=15"]
    pytest += ["-m", "not cuda_host"]
    started = time.monotonic()
    enter(
        root,
        [
            "sh",
            "-c",
            f"cd /opt/lltm-tests && {shlex.join([*pytest, *core('aarch64'), *pytest_args])}",
        ],
    )
    log(f"the core under neon: {time.monotonic() - started:.0f} s")
    started = time.monotonic()
    enter(
        root,
        ["sh", "-c", f"cd /opt/lltm-tests && {shlex.join([*pytest, *BASELINE, *pytest_args])}"],
        env={"LLTM_CPU_ISA": "baseline"},
    )
    log(f"the sequences under baseline: {time.monotonic() - started:.0f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--wheel-dir", type=Path, default=ROOT / "build" / "aarch64", help="where the wheel goes"
    )
    parser.add_argument("pytest_args", nargs="*", help="more arguments for pytest (after --)")
    options = parser.parse_args()
    started = time.monotonic()
    host_tools()
    root = arm64_root()
    compile_check(root)
    wheel = cross_build(root, options.wheel_dir)
    test(root, wheel, options.pytest_args)
    log(f"done in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
