"""Libraries built with AddressSanitizer or UBSan, and the interpreters that load them.

GCC links a shared library built with ``-fsanitize=address`` (or
``undefined``) against the sanitizer's shared runtime: it needs
``libasan.so.N`` (``libubsan.so.N``). A Python interpreter is no program
built that way, and ASan's runtime refuses to start anywhere but first in the
process's list of libraries ("ASan runtime does not come first in initial
library list"): such a library loads only into an interpreter started with
the runtimes in ``LD_PRELOAD``, ASan's first. The build's library check
(cxx_runtime.py) and ``nox -s sanitize`` start theirs with
:func:`environment`. Clang links its runtimes into programs only, so a
library built by Clang with these flags needs none by name: it is found by
its flags (:func:`requested`), and its runtime named by the compiler.

Standalone (no import of the other helpers): the check passes in what it
read from the library's ELF headers.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

# The flags of lltm's sanitized builds (nox -s sanitize, tests/test_sanitizers.py).
# -fno-sanitize-recover=undefined: UB stops the process (UBSan's default is
# to report and go on, which a passing test would hide); -fno-omit-frame-
# pointer: whole stacks in reports; -g1: line tables, so that a report names
# the file and line of each frame.
FLAGS = (
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=undefined",
    "-fno-omit-frame-pointer",
    "-g1",
)
# The runtimes GCC links such a library against, as the compiler names them
# (-print-file-name), in the order they are preloaded.
COMPILER_RUNTIMES = ("libasan.so", "libubsan.so")
# The sanitizers' shared runtimes, by soname, in the order they must be
# preloaded: ASan's first (it must be the process's first library), UBSan's
# after it.
RUNTIME = re.compile(r"^lib(asan|hwasan|tsan|ubsan)\.so(\.\d+)*$")
PRELOAD_ORDER = ("asan", "hwasan", "tsan", "ubsan")
# Where a build takes the flags that could ask for a sanitizer.
FLAG_VARIABLES = ("CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "LDSHARED", "CC", "CXX")
# Without them a sanitized interpreter fails at exit, or goes on after UB:
# LeakSanitizer counts what CPython and torch keep until the process ends
# (not lltm's leaks: those would be freed or not, the same at every call);
# UBSan's reports stop the process, with the call stack that led there.
ASAN_DEFAULTS = "detect_leaks=0"
UBSAN_DEFAULTS = "halt_on_error=1:print_stacktrace=1"
# What a sanitizer writes to stderr when it stops a process (a report, or
# the refusal to start anywhere but first).
REPORT = re.compile(
    r"ERROR: (Address|Leak|Thread|HWAddress)Sanitizer|runtime error: |"
    r"ASan runtime does not come first|UndefinedBehaviorSanitizer"
)


def runtimes(needed: list[str]) -> list[str]:
    """The sanitizer runtimes among a library's DT_NEEDED sonames, in the
    order they must be preloaded."""
    found = [name for name in needed if RUNTIME.match(name)]
    return sorted(found, key=lambda name: PRELOAD_ORDER.index(RUNTIME.match(name).group(1)))


def requested(environ: Mapping[str, str] | None = None) -> list[str]:
    """``VARIABLE=-fsanitize=...`` for each flag of the environment that asks for a sanitizer."""
    environ = os.environ if environ is None else environ
    return [
        f"{variable}={word}"
        for variable in FLAG_VARIABLES
        for word in environ.get(variable, "").split()
        if word.startswith("-fsanitize=")
    ]


def locate(soname: str, compiler: str | None = None) -> str:
    """The path of the runtime ``soname`` as the compiler (``compiler``, else
    $CXX, else c++) links it, or the soname itself, which the dynamic loader
    then looks up as it would for the library."""
    command = (compiler or os.environ.get("CXX") or "c++").split()
    if not shutil.which(command[0]):
        return soname
    try:
        printed = subprocess.run(
            [*command, f"-print-file-name={soname}"],
            capture_output=True, text=True, timeout=60, check=False,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return soname
    # A compiler that does not have it prints the name back, unchanged.
    return (
        str(Path(printed).resolve())
        if os.path.isabs(printed) and Path(printed).exists()
        else soname
    )


def compiler_runtimes(compiler: str | None = None) -> list[str] | None:
    """The files of COMPILER_RUNTIMES the compiler links, or None where it
    has not all of them (no sanitizer runtimes installed)."""
    found = [locate(name, compiler) for name in COMPILER_RUNTIMES]
    return found if all(os.path.isabs(path) for path in found) else None


def environment(preload: list[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default: this process's) for an interpreter that loads a
    sanitized library: ``preload`` first in LD_PRELOAD, and the options
    ASAN_DEFAULTS and UBSAN_DEFAULTS ahead of those already set (which win)."""
    env = dict(os.environ if environ is None else environ)
    env["LD_PRELOAD"] = " ".join([*preload, *env.get("LD_PRELOAD", "").split()])
    for variable, defaults in (("ASAN_OPTIONS", ASAN_DEFAULTS), ("UBSAN_OPTIONS", UBSAN_DEFAULTS)):
        env[variable] = ":".join(part for part in (defaults, env.get(variable, "")) if part)
    return env


def report(stderr: str) -> str | None:
    """A sanitizer's report in ``stderr``, from its first line on, or None."""
    match = REPORT.search(stderr)
    if match is None:
        return None
    start = stderr.rfind("\n", 0, match.start()) + 1
    return stderr[start:]
