"""setup.py gives each compiler family the C++ flags it understands.

Run by ``nox -s cibuildwheel`` in an environment with torch and setuptools.
Windows wheels are built by MSVC, which this machine does not have: the check
runs setup.py (LLTM_VARIANT=cpu, setup() itself stubbed out), then its
build_ext command with a stand-in compiler of each type, and records the
flags each extension would pass to it (torch's own build step stubbed out).
MSVC must see only MSVC options, GCC and Clang only theirs, and both the same
C++ standard; on Linux the extensions also name the shared C++ runtime torch
links (tools/setup_helpers/cxx_runtime.py), whose check of the linked library
is stubbed out too, as nothing is linked here.
"""

from __future__ import annotations

import copy
import os
import runpy
import sys
import types
from pathlib import Path

import setuptools
from setuptools import Distribution
from torch.utils import cpp_extension

ROOT = Path(__file__).resolve().parents[1]
EXPECTED = {"unix": ("-", "-std=c++17"), "msvc": ("/", "/std:c++17")}


def main() -> int:
    captured: dict = {}
    setuptools.setup = lambda **kwargs: captured.update(kwargs)
    os.environ["LLTM_VARIANT"] = "cpu"
    os.chdir(ROOT)
    runpy.run_path(str(ROOT / "setup.py"), run_name="__main__")
    from tools.setup_helpers import cxx_runtime

    cxx_runtime.check_library = lambda *args, **kwargs: None
    runtime = cxx_runtime.link_libraries()

    recorded: list[dict[str, list[str]]] = []
    cpp_extension.BuildExtension.build_extensions = lambda self: recorded.append(
        {ext.name: list(ext.extra_compile_args["cxx"]) for ext in self.extensions}
    )
    linked: list[dict[str, list[str]]] = []
    original = cpp_extension.BuildExtension.build_extensions

    def record(self: cpp_extension.BuildExtension) -> None:
        original(self)
        linked.append({ext.name: list(ext.libraries) for ext in self.extensions})

    cpp_extension.BuildExtension.build_extensions = record
    command_class = captured["cmdclass"]["build_ext"]
    for compiler_type, (prefix, standard) in EXPECTED.items():
        command = command_class(Distribution({"ext_modules": captured["ext_modules"]}))
        command.extensions = copy.deepcopy(captured["ext_modules"])
        command.compiler = types.SimpleNamespace(compiler_type=compiler_type)
        # Where the libraries would go (nothing is written there).
        command.build_lib, command.inplace = str(ROOT / "build" / "check-flags"), 0
        command.build_extensions()
        for name, libraries in linked.pop().items():
            missing = [lib for lib in runtime if lib not in libraries]
            assert not missing, f"{name} does not link torch's C++ runtime {missing}: {libraries}"
        for name, flags in recorded.pop().items():
            foreign = [f for f in flags if not f.startswith(prefix)]
            assert not foreign, f"{compiler_type} would get {foreign} for {name}: {flags}"
            assert standard in flags, f"{compiler_type} gets no {standard} for {name}: {flags}"
            print(f"{name} with {compiler_type}: {' '.join(flags)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
