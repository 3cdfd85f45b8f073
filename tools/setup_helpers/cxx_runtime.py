"""lltm's libraries and torch share one C++ runtime, or the build stops.

A kernel reports a bad argument by throwing a C++ exception
(csrc/lltm_errors.h), and torch's stable ABI has no other way: a boxed
kernel returns nothing, and the exception unwinds out of lltm's library,
through torch's boxed call, into libtorch, which catches it and Python
raises it. That unwinding is only sound when lltm and libtorch use one C++
runtime (one libstdc++, one unwinder, libgcc_s): a library linked with its
own copy (``-static-libstdc++ -static-libgcc``, which some compiler
wrappers add without a word) throws with its private unwinder, which then
runs libtorch's personality routine from the shared runtime on a context
the shared runtime never initialised: abort() or SIGSEGV at the first bad
argument. With ``-static-libstdc++`` alone the exception survives, but the
private copy's iostreams do not format numbers (the shared runtime's
locale ids answer the private copy's facets): the message loses its
figures. torch's own stable-ABI extensions report errors the same way
(``STD_TORCH_CHECK`` throws ``std::runtime_error``), so they share the
constraint.

So setup.py does two things (:func:`link_libraries`, :func:`check_library`):

* it links the shared C++ runtime libraries that torch's ``libtorch_cpu``
  needs, by file name (``-l:libstdc++.so.6``), ahead of anything the
  compiler driver adds: a later ``-static-libstdc++``, or a static
  ``libstdc++.a`` in a compiler wrapper's ``-B`` folder, then finds every
  symbol already resolved and adds nothing (GCC and Clang on Linux; macOS has only the shared libc++, and
  MSVC's ``/MD``, setuptools' default, is the runtime DLL torch uses);
* after linking, it checks the library: on ELF platforms, that it defines
  none of the runtime's own symbols and needs the runtime torch needs, and
  everywhere the library can be loaded, that a bad argument raised by one
  of its kernels reaches Python as lltm's tagged error, in a subprocess, so
  that a crash fails the build with the reason instead of a user's
  interpreter at run time.

Both read ELF headers (torch's ``libtorch_cpu``, the library just linked)
with tools/setup_helpers/elf_headers.py, which needs nothing installed.
"""

from __future__ import annotations

import json
import os
import platform
import re
import signal
import subprocess
import sys
from pathlib import Path

from tools.setup_helpers import elf_headers, sanitizers

# The libraries of a C++ runtime, by soname: lltm must need the ones torch
# needs, and no other.
RUNTIME_SONAMES = ("libstdc++.so.6", "libgcc_s.so.1", "libc++.so.1", "libc++abi.so.1")
# Symbols only a C++ runtime or its unwinder defines: a library that defines
# one carries a private copy of the runtime.
RUNTIME_SYMBOL = re.compile(r"^(__cxa_|__gxx_personality_|_Unwind_|_ZSt9terminatev$)")
# Flags that ask for a private runtime, looked for where a build takes flags.
STATIC_RUNTIME_FLAGS = ("-static-libstdc++", "-static-libgcc", "-static", "-stdlib=libc++")
FLAG_VARIABLES = ("LDFLAGS", "LDSHARED", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "CC", "CXX")
# The runtime's symbols a reader recognises, named first in the error.
TELLING_SYMBOLS = (
    "__cxa_throw",
    "__gxx_personality_v0",
    "_Unwind_RaiseException",
    "_Unwind_Resume",
)
# What every failure says to do.
FIX = (
    "link the C++ runtime shared: take -static-libstdc++ and -static-libgcc out of "
    "LDFLAGS, CXXFLAGS and CFLAGS, or point CXX at a compiler that links it shared "
    "(the system's g++ or clang++, not a wrapper that adds those flags)"
)


class RuntimeMismatch(SystemExit):
    """The library just built would crash, or garble, lltm's errors."""


class UnloadableLibrary(SystemExit):
    """The library just built fails its check for a reason other than its C++
    runtime: it does not load, or a sanitizer stops it."""


def torch_library_dir() -> Path:
    """torch/lib of the torch the build compiles against, found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeMismatch("lltm: torch is not importable here; setup.py builds against it")
    return Path(next(iter(spec.submodule_search_locations))) / "lib"


def torch_runtime() -> list[str]:
    """The C++ runtime libraries torch's libtorch_cpu needs (Linux), e.g.
    ``["libstdc++.so.6", "libgcc_s.so.1"]``; [] where it is no ELF file."""
    torch_cpu = elf_headers.read(torch_library_dir() / "libtorch_cpu.so", symbols=False)
    return [name for name in (torch_cpu.needed if torch_cpu else ()) if name in RUNTIME_SONAMES]


def link_libraries() -> list[str]:
    """The libraries to link (setuptools' ``libraries``, each given to the
    linker as ``-l<name>``) so that the library's C++ runtime is torch's: on
    Linux the shared runtime libtorch_cpu needs, by its file name.

    ``-l:libstdc++.so.6`` (GNU ld, gold and lld look the exact name up in
    every folder) rather than ``-lstdc++``: a compiler wrapper whose ``-B``
    folder holds a static ``libstdc++.a`` answers ``-lstdc++`` with that
    archive before the system's shared library is ever looked at, and the
    library then carries a private runtime."""
    if not sys.platform.startswith("linux"):
        return []
    return [":" + soname for soname in torch_runtime()]


def requested_static_runtime(environ: dict[str, str] | None = None) -> list[str]:
    """``VARIABLE=flag`` for each flag of the environment that asks for a
    private C++ runtime (what :func:`check_library` names if the link did
    not overcome it)."""
    environ = dict(os.environ if environ is None else environ)
    found = []
    for variable in FLAG_VARIABLES:
        for word in environ.get(variable, "").split():
            if word in STATIC_RUNTIME_FLAGS:
                found.append(f"{variable}={word}")
    return found


def static_problems(library: Path) -> list[str]:
    """What the ELF file ``library`` shows of a private C++ runtime ([] if
    none, or if it is no ELF file: macOS, Windows)."""
    elf = elf_headers.read(library)
    if elf is None:
        return []
    problems = []
    defined = sorted(name for name in elf.defined if RUNTIME_SYMBOL.match(name))
    if defined:
        rank = {name: i for i, name in enumerate(TELLING_SYMBOLS)}
        defined.sort(key=lambda name: (rank.get(name, len(rank)), name))
        shown = ", ".join(defined[:4]) + (
            f" and {len(defined) - 4} more" if len(defined) > 4 else ""
        )
        problems.append(f"it carries a copy of the C++ runtime of its own (it defines {shown})")
    wanted = torch_runtime()
    runtime = [name for name in elf.needed if name in RUNTIME_SONAMES]
    missing = [name for name in wanted if name not in runtime]
    foreign = [name for name in runtime if name not in wanted]
    if missing:
        problems.append(f"it does not link {', '.join(missing)}, which torch uses")
    if foreign and wanted:
        problems.append(f"it links {', '.join(foreign)}, a C++ runtime torch does not use")
    return problems


# The subprocess of :func:`load_problem`: loads the library, makes one of
# its kernels refuse an argument, prints what Python saw as JSON.
_PROBE = r"""
import json, re, sys, warnings
warnings.filterwarnings("ignore")
import torch
library, variant, ops_source = sys.argv[1:4]
if variant == "cuda":
    # The plugin implements schemas lltm's CPU library declares: the same
    # declarations, read from where they are written.
    text = open(ops_source).read()
    body = text[text.index("LLTM_LIBRARY(m)"):]
    lib = torch.library.Library("lltm", "DEF")
    for call in re.findall(r'm\.def\(((?:\s*"[^"]*")+)\s*\)', body):
        lib.define("".join(re.findall(r'"([^"]*)"', call)))
try:
    torch.ops.load_library(library)
except OSError as error:
    # torch's message names the file; the loader's, chained to it, says why.
    print(json.dumps({"unloadable": str(error.__cause__ or error)}))
    sys.exit(0)
args = (torch.randn(2, 5), torch.randn(12, 7), torch.randn(12), torch.randn(2, 4), torch.randn(2, 4))
op = torch.ops.lltm.forward.default
try:
    if variant == "cuda":
        # The CUDA kernel itself, on CPU tensors: no GPU needed; its argument
        # checks run before anything touches a device.
        op.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA), *args)
    else:
        op(*args)
except Exception as error:
    print(json.dumps({"raised": type(error).__name__, "message": str(error)}))
else:
    print(json.dumps({"raised": None, "message": ""}))
"""
# What the probe's kernel must say, the figures included (csrc/lltm_checks.h).
EXPECTED = "lltm: [ValueError] input has input_features = 5; the weights expect 3"


def _runs_here(library: Path) -> bool:
    """False for a library built for another processor (a cross build)."""
    elf = elf_headers.read(library, symbols=False)
    if elf is None:
        return True  # not ELF: built by the platform's own toolchain, for it
    here = platform.machine().lower()
    here = {"amd64": "x86_64", "arm64": "aarch64"}.get(here, here)
    # A processor the reader does not name is taken to be this one's.
    return here not in elf_headers.MACHINES.values() or elf.machine == here


def _sanitizer_runtimes(library: Path) -> list[str]:
    """The sanitizer runtimes ``library`` needs, in the order they are preloaded."""
    elf = elf_headers.read(library, symbols=False)
    return sanitizers.runtimes(list(elf.needed) if elf else [])


def _probe(library: Path, variant: str, ops_source: Path) -> tuple[str | None, bool]:
    """What went wrong loading ``library`` and calling a kernel with a bad
    argument (None: nothing), and whether it is the C++ runtime's doing.
    A sanitized build is loaded under its sanitizers' runtimes
    (sanitizers.py): without them it cannot load into an interpreter at all."""
    preload = _sanitizer_runtimes(library)
    env = sanitizers.environment([sanitizers.locate(name) for name in preload]) if preload else None
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, str(library), variant, str(ops_source)],
        capture_output=True, text=True, timeout=600, check=False, env=env,
    )  # fmt: skip
    found = sanitizers.report(result.stderr)
    if found is not None:
        # A report, or a runtime that did not start: the sanitizer's own words.
        lines = found.strip().splitlines()
        shown = " / ".join(lines[:6]) + (" / ..." if len(lines) > 6 else "")
        return f"a sanitizer stopped the check's interpreter: {shown}", False
    tail = " / ".join(result.stderr.strip().splitlines()[-3:])
    if result.returncode < 0:
        name = signal.Signals(-result.returncode).name
        return (
            f"a kernel's argument error killed the interpreter ({name}){': ' + tail if tail else ''}",
            True,
        )
    if result.returncode != 0:
        # An exception in Python: the library did not load (an undefined
        # symbol, a missing library), which no C++ runtime flag explains.
        return f"it could not be loaded and called (exit status {result.returncode}): {tail}", False
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    if "unloadable" in seen:
        return f"it cannot be loaded: {seen['unloadable']}", False
    if seen["raised"] is None:
        return "a bad argument raised nothing", True
    if EXPECTED not in seen["message"]:
        return (
            f"a bad argument reached Python as {seen['raised']}({seen['message'][:200]!r}), "
            f"not lltm's message ({EXPECTED!r} expected)"
        ), True
    return None, False


def load_problem(library: Path, variant: str, ops_source: Path) -> str | None:
    """Loads ``library`` in a fresh interpreter (under its sanitizers'
    runtimes, for a sanitized build) and has one of its kernels refuse a bad
    argument; what went wrong, or None when Python saw lltm's error, whole."""
    return _probe(library, variant, ops_source)[0]


def check_library(library: Path, variant: str, ops_source: Path, log=print) -> None:
    """Stops the build when ``library`` does not share torch's C++ runtime or
    its errors do not reach Python whole (RuntimeMismatch), or when it cannot
    be loaded for another reason (UnloadableLibrary, which names it)."""
    problems = static_problems(library)
    other = None
    if _runs_here(library):
        problem, runtime_cause = _probe(library, variant, ops_source)
        if problem and runtime_cause:
            problems.append(problem)
        other = None if runtime_cause else problem
        checked = "its C++ runtime is torch's, and a kernel's error reaches Python whole"
        preload = _sanitizer_runtimes(library)
        if preload:
            checked += f" (under the sanitizers' runtimes: LD_PRELOAD of {', '.join(preload)})"
    else:
        checked = "its C++ runtime is torch's (built for another processor: not loaded here)"
    if not problems and not other:
        log(f"lltm: checked {library.name}: {checked}")
        return
    if not problems:
        sanitized = sanitizers.requested()
        asked = (
            f" The build's flags ask for a sanitizer ({', '.join(sanitized)}): a sanitized "
            "library loads into an interpreter started with the sanitizer's runtime first "
            "in LD_PRELOAD (CONTRIBUTING.md, nox -s sanitize)."
            if sanitized
            else ""
        )
        raise UnloadableLibrary(
            f"lltm: the library just built, {library}, failed its check: {other}.{asked}"
        )
    if other:
        problems.append(other)
    flags = requested_static_runtime()
    asked = (
        f" The build's environment asks for a private runtime: {', '.join(flags)}."
        if flags
        else (
            " No flag of the environment asks for it: the compiler (CXX, or a wrapper around it) "
            "links the runtime statically by itself."
        )
    )
    raise RuntimeMismatch(
        f"lltm: the library just built, {library}, would crash or garble lltm's errors: "
        + "; ".join(problems)
        + ". lltm's kernels report a bad argument by a C++ exception that unwinds into torch, "
        "which needs one C++ runtime shared by both." + asked + f"\n  Fix: {FIX}."
    )
