"""Which interpreters install a wheel of lltm, asked of the installers themselves.

Run by ``nox -s cibuildwheel`` on each repaired wheel (no free-threaded
interpreter can be had on the machines that run it, so its tags are checked
the ways that need none):

* packaging.tags, the library pip's tag logic comes from: the wheel is
  among the tags of CPython 3.10 to 3.14 and of the free-threaded 3.14t
  (and 3.15t) on its platform; an abi3 wheel of the same platform is not
  among 3.14t's (why lltm's wheels are py3-none);
* pip itself (``pip install --dry-run`` for another interpreter): it takes
  the wheel for each of them, and refuses a copy renamed to cp310-abi3 for
  3.14t;
* cibuildwheel: for its cp314t identifier of the platform it finds this
  wheel compatible, so it tests this very wheel there instead of building
  another.

    python -m tools.check_wheel_tags WHEEL...
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from cibuildwheel.util.packaging import find_compatible_wheel
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import parse_wheel_filename

# (Python version, ABI) of the interpreters the wheel must install in.
INTERPRETERS = [
    ((3, 10), "cp310"),
    ((3, 11), "cp311"),
    ((3, 12), "cp312"),
    ((3, 13), "cp313"),
    ((3, 14), "cp314"),
    ((3, 14), "cp314t"),
    ((3, 15), "cp315t"),
]


def platforms(platform: str) -> list[str]:
    """The platform tags an interpreter on `platform`'s machine accepts:
    manylinux_2_X for X up to the wheel's (a glibc at least that new)."""
    match = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
    if match is None:
        return [platform]
    glibc, arch = int(match.group(1)), match.group(2)
    return [f"manylinux_2_{x}_{arch}" for x in range(glibc, 16, -1)]


def supported(version: tuple[int, int], abi: str, platform: str) -> set[Tag]:
    accepted = platforms(platform)
    return {
        *cpython_tags(version, abis=[abi], platforms=accepted),
        *compatible_tags(version, f"cp{version[0]}{version[1]}", accepted),
    }


def pip_accepts(wheel: Path, version: tuple[int, int], abi: str, platform: str) -> bool:
    with tempfile.TemporaryDirectory() as target:
        result = subprocess.run(
            [
                sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps",
                "--ignore-installed", "--no-index", "--target", target,
                "--python-version", f"{version[0]}.{version[1]}", "--implementation", "cp",
                "--abi", abi, "--only-binary=:all:", "--quiet", "--no-warn-conflicts",
                *(arg for p in platforms(platform) for arg in ("--platform", p)),
                str(wheel),
            ],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    if result.returncode != 0 and "is not a supported wheel" not in result.stderr:
        raise AssertionError(
            f"pip failed otherwise than by refusing {wheel.name}:\n{result.stderr}"
        )
    return result.returncode == 0


def cibuildwheel_identifier(platform: str, abi: str) -> str:
    """cibuildwheel's build identifier for the interpreter `abi` on `platform`."""
    match = re.fullmatch(r"manylinux_2_\d+_(\w+)", platform)
    if match:
        return f"{abi}-manylinux_{match.group(1)}"
    match = re.fullmatch(r"macosx_\d+_\d+_(\w+)", platform)
    if match:
        return f"{abi}-macosx_{match.group(1)}"
    return f"{abi}-{platform}"


def check(wheel: Path) -> None:
    _, _, _, tags = parse_wheel_filename(wheel.name)
    assert {(t.interpreter, t.abi) for t in tags} == {("py3", "none")}, wheel.name
    for tag in tags:
        for version, abi in INTERPRETERS:
            assert tag in supported(version, abi, tag.platform), (wheel.name, abi)
            assert pip_accepts(wheel, version, abi, tag.platform), f"pip refuses it for {abi}"
        # The reason for py3-none: 3.14t takes no abi3 wheel.
        abi3 = Tag("cp310", "abi3", tag.platform)
        assert abi3 in supported((3, 14), "cp314", tag.platform)
        assert abi3 not in supported((3, 14), "cp314t", tag.platform)
        with tempfile.TemporaryDirectory() as scratch:
            renamed = Path(scratch) / wheel.name.replace("-py3-none-", "-cp310-abi3-")
            shutil.copy(wheel, renamed)
            assert pip_accepts(renamed, (3, 14), "cp314", tag.platform)
            assert not pip_accepts(renamed, (3, 14), "cp314t", tag.platform)
        identifier = cibuildwheel_identifier(tag.platform, "cp314t")
        assert find_compatible_wheel([wheel], identifier) == wheel, identifier
        print(
            f"{wheel.name}: installs in CPython {', '.join(a for _, a in INTERPRETERS)} "
            f"(packaging.tags and pip agree; an abi3 wheel would not in cp314t); "
            f"cibuildwheel tests it as {identifier}"
        )


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    for path in paths:
        check(Path(path))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
