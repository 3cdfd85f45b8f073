"""The README's quick start on a machine that is not ours.

``nox -s fresh`` runs this (as root, or with sudo; it downloads gigabytes):

1. What the README asks of a machine, read from its Quick start: the
   Debian/Ubuntu packages (the `sudo apt install ...` it names) and the two
   commands (its first bash block): the benchmark's and the test suite's.
2. A minimal Debian 12 amd64 system (mmdebstrap's minbase variant: what a
   minimal install or a container image of Debian holds) with those
   packages and an unprivileged user, made of Debian's packages; kept as a
   tarball in $LLTM_FRESH_CACHE (default ~/.cache/lltm/fresh), made again
   when what it should hold changes.
3. The tarball unpacked afresh, and a clean clone of this checkout's HEAD
   (its uncommitted changes left out) in the user's home.
4. The two commands, each as the README writes it, run by the user in a
   login shell, with nothing of this machine: Debian's python3, no pyenv,
   no pip configuration nor PIP_* variable. Of the network's settings,
   /etc/resolv.conf goes in, and the certificate authorities this machine
   trusts beyond Debian's (a network that intercepts TLS needs its own),
   added with update-ca-certificates. PyPI and torch's indexes serve all;
   with --torch-from-pypi, PyPI alone (LLTM_TORCH_CPU_INDEX=pip and
   LLTM_TORCH_CUDA_INDEX=pip: pip there knows no index but PyPI), for
   machines that cannot reach torch's indexes.
5. The verdict: the benchmark's command succeeds and prints its table; the
   test command succeeds, or fails before any session runs, having said
   what the machine lacks and how to get it (nox's pythons-* sessions). The
   unpacked system is deleted when the check passes (kept with --keep), kept
   to look at when it fails.

    python -m tools.machines.fresh_machine [--torch-from-pypi] [--keep]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tools.machines import debian_root
from tools.machines.debian_root import MIRROR, SUITE

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("LLTM_FRESH_CACHE", Path.home() / ".cache" / "lltm" / "fresh"))
USER, UID = "lltm", 1000
HOME = f"/home/{USER}"
CHECKOUT = f"{HOME}/lltm"
# Certificate authorities of this machine's own, besides Debian's.
LOCAL_CAS = Path("/usr/local/share/ca-certificates")
HOST = debian_root.Host("fresh")
log = HOST.log


# --- 1. What the README asks ------------------------------------------------------


def quick_start() -> tuple[list[str], list[str]]:
    """README.md's Quick start: the Debian packages it asks for, and its two commands."""
    text = (ROOT / "README.md").read_text()
    section = re.search(r"^## Quick start\n(.*?)(?=^## )", text, re.MULTILINE | re.DOTALL)
    assert section, "README.md has no Quick start section"
    packages = re.search(r"`sudo apt install ([^`]+)`", section.group(1))
    assert packages, "README.md's Quick start names no `sudo apt install ...`"
    block = re.search(r"```bash\n(.*?)```", section.group(1), re.DOTALL)
    assert block, "README.md's Quick start has no bash block"
    commands = [line for line in block.group(1).splitlines() if line.strip()]
    assert len(commands) == 2, f"README.md's Quick start: two commands expected, not {commands}"
    bench, tests = commands
    assert "nox -s bench" in bench and "nox -t tests" in tests, commands
    return packages.group(1).split(), commands


# --- 2. The system, cached ------------------------------------------------------------


def system_tarball(packages: list[str]) -> Path:
    """The tarball of the minimal system with ``packages``, made if missing."""
    wanted = {
        "suite": SUITE,
        "mirror": MIRROR,
        "variant": "minbase",
        "packages": sorted(packages),
        "user": [USER, UID],
    }
    digest = hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()[:12]
    tarball = CACHE / f"debian-{SUITE}-amd64-{digest}.tar"
    if tarball.exists():
        log(f"reusing {tarball} ({', '.join(packages)})")
        return tarball
    CACHE.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    partial = CACHE / f"partial-{digest}.tar"  # mmdebstrap writes a tarball for a .tar name
    debian_root.mmdebstrap(
        HOST, partial, arch="amd64", variant="minbase", include=packages,
        hooks=[f'chroot "$1" useradd --create-home --shell /bin/bash --uid {UID} {USER}'],
    )  # fmt: skip
    for old in CACHE.glob(f"debian-{SUITE}-amd64-*.tar"):
        old.unlink()
    partial.rename(tarball)
    log(f"made {tarball} in {time.monotonic() - started:.0f} s")
    return tarball


# --- 3. The machine ------------------------------------------------------------------


def unpack(tarball: Path) -> Path:
    """The system, unpacked afresh, with a clean clone of this checkout's HEAD."""
    root = CACHE / "root"
    if root.exists():
        HOST.as_root("rm", "-rf", "--one-file-system", root)
    HOST.as_root("mkdir", "-p", root)
    HOST.as_root("tar", "--extract", "--numeric-owner", "--file", tarball, "--directory", root)
    # The network as this machine meets it: names resolve as they do here,
    # and the certificate authorities this machine trusts beyond Debian's
    # (a network that intercepts TLS has one) are trusted there too, added
    # the Debian way. Nothing else of this machine goes in.
    HOST.as_root(
        "cp",
        "--dereference",
        "--remove-destination",
        "/etc/resolv.conf",
        root / "etc" / "resolv.conf",
    )
    local_cas = sorted(LOCAL_CAS.glob("*.crt"))
    if local_cas:
        HOST.as_root("cp", *local_cas, root / LOCAL_CAS.relative_to("/"))
        environment = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
        debian_root.enter(HOST, root, ["update-ca-certificates"], environment=environment)
    pip_config = ["etc/pip.conf", "etc/xdg/pip", f"{HOME}/.config/pip", f"{HOME}/.pip"]
    found = [path for path in pip_config if (root / path.lstrip("/")).exists()]
    assert not found, f"the system has pip configuration: {found}"
    head = _git("rev-parse", "HEAD")
    if _git("status", "--porcelain"):
        log(f"uncommitted changes are left out: the check runs the commit {head[:12]}")
    # Cloned by this process's user (git refuses root a repository of
    # another's), then moved in. --no-local: files of the clone's own, not
    # hard links to this repository's objects (chown would change those too).
    staging = CACHE / "clone"
    shutil.rmtree(staging, ignore_errors=True)
    HOST.run("git", "clone", "--quiet", "--no-local", ROOT, staging)
    cloned = subprocess.run(
        ["git", "-C", str(staging), "rev-parse", "HEAD"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert cloned == head, f"the clone is at {cloned}, this checkout at {head}"
    checkout = root / CHECKOUT.lstrip("/")
    HOST.as_root("mv", staging, checkout)
    HOST.as_root("chown", "-R", f"{UID}:{UID}", checkout)
    return root


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def as_user(root: Path, command: str, torch_from_pypi: bool) -> subprocess.CompletedProcess:
    """``command`` as the user types it in the checkout, in a login shell, and
    with an environment of its own (the login shell's PATH from /etc/profile)."""
    environment = {
        "HOME": HOME,
        "USER": USER,
        "LOGNAME": USER,
        "SHELL": "/bin/bash",
        "LANG": "C.UTF-8",
        "PATH": "/usr/local/bin:/usr/bin:/bin",
    }
    if torch_from_pypi:
        environment |= {"LLTM_TORCH_CPU_INDEX": "pip", "LLTM_TORCH_CUDA_INDEX": "pip"}
    return debian_root.enter(
        HOST, root, ["bash", "-lc", f"cd {shlex.quote(CHECKOUT)} && {command}"],
        environment=environment, binds=[(Path("/sys"), "/sys")], user=f"{UID}:{UID}",
        tee=True, check=False,
    )  # fmt: skip


# --- 5. The verdict -----------------------------------------------------------------


def bench_table(output: str) -> tuple[list[str], list[str]]:
    """The benchmark's table (its title line to the end; empty if it printed
    none), and its rows of cases that failed."""
    lines = output.splitlines()
    titles = [i for i, line in enumerate(lines) if re.match(r"\s*lltm \S+, torch \S+: ", line)]
    table = lines[titles[-1] :] if titles else []
    # To the end of the benchmark's output, where nox's own lines start.
    table = table[: next((i for i, line in enumerate(table) if line.startswith("nox > ")), None)]
    if not any("impl" in line and "speed-up" in line for line in table):
        return [], []
    return table, [line for line in table if "failed:" in line]


def stopped_for_prerequisites(output: str) -> list[str] | None:
    """What the test command said the machine lacks, if it stopped there:
    a pythons-* check failed saying so, and every other session was aborted
    for it, having run nothing."""
    summary = dict(re.findall(r"^nox > \* (.+?): (\w+)", output, re.MULTILINE))
    checks = {name for name in summary if name.startswith("pythons-")}
    lacks = re.findall(
        r"^nox > Session (pythons-\S+) aborted: (this machine lacks .*)$", output, re.MULTILINE
    )
    prerequisite = set(
        re.findall(
            r"^nox > Session (.+?) aborted: Prerequisite session pythons-\S+ was not successful",
            output,
            re.MULTILINE,
        )
    )
    others = set(summary) - checks
    if not lacks or not others or others != prerequisite:
        return None
    return [f"{name}: {message}" for name, message in lacks]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--torch-from-pypi",
        action="store_true",
        help="torch from PyPI (LLTM_TORCH_CPU_INDEX=pip, LLTM_TORCH_CUDA_INDEX=pip in the root)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the unpacked system")
    options = parser.parse_args()
    started = time.monotonic()
    if not sys.platform.startswith("linux") or os.uname().machine != "x86_64":
        sys.exit("fresh: runs on x86-64 Linux only (a Debian amd64 root, entered with chroot)")
    packages, (bench, tests) = quick_start()
    log(f"README.md asks for: sudo apt install {' '.join(packages)}")
    HOST.install_packages({"mmdebstrap": "mmdebstrap"})
    root = unpack(system_tarball(packages))
    python = as_user(root, "python3 --version && command -v python3", False).stdout.split()
    log(f"the machine: Debian {SUITE} amd64, {' '.join(python)}, user {USER}")
    log(f"machine ready in {time.monotonic() - started:.0f} s")

    results = []
    for command in (bench, tests):
        log(f"as {USER}, in {CHECKOUT}: {command}")
        began = time.monotonic()
        result = as_user(root, command, options.torch_from_pypi)
        results.append((command, result, time.monotonic() - began))

    (_, bench_run, bench_s), (_, tests_run, tests_s) = results
    table, failed = bench_table(bench_run.stdout)
    bench_ok = bench_run.returncode == 0 and table and not failed
    lacks = None if tests_run.returncode == 0 else stopped_for_prerequisites(tests_run.stdout)
    passed = bench_ok and (tests_run.returncode == 0 or lacks is not None)

    log("--- the README's quick start on a fresh Debian 12 ---")
    if bench_ok:
        log(f"{bench} -> exit 0 in {bench_s:.0f} s, its table:")
    elif table:
        log(f"{bench} -> FAILED (exit {bench_run.returncode}, {bench_s:.0f} s): a case failed:")
    else:
        log(f"{bench} -> FAILED (exit {bench_run.returncode}, {bench_s:.0f} s): no table")
    for line in table:
        print(f"    {line}")
    if tests_run.returncode == 0:
        log(f"{tests} -> passed in {tests_s:.0f} s")
    elif lacks is not None:
        log(f"{tests} -> stopped at once (exit {tests_run.returncode}, {tests_s:.0f} s), saying:")
        for line in lacks:
            print(f"    {line}")
    else:
        log(f"{tests} -> FAILED (exit {tests_run.returncode}, {tests_s:.0f} s), not for a stated")
        log("prerequisite: its last lines are above")
    if passed and not options.keep:
        HOST.as_root("rm", "-rf", "--one-file-system", root)
    elif root.exists():
        log(f"the machine is kept in {root}")
    log(f"{'passed' if passed else 'FAILED'} in {time.monotonic() - started:.0f} s")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
