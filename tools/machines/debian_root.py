"""Debian roots made of Debian's packages, and commands run inside them.

Shared by tools/machines/emulated_aarch64.py (an arm64 root, its programs run by
qemu) and tools/machines/fresh_machine.py (an amd64 root standing in for a new
user's machine). mmdebstrap makes the roots; commands enter them with chroot,
in a mount namespace of their own, so that the mounts they need (/proc,
/dev, ...) go when they end. All of it needs root: as is when this process
is root, else through sudo.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

MIRROR = os.environ.get("LLTM_DEBIAN_MIRROR", "http://deb.debian.org/debian")
SUITE = "bookworm"  # Debian 12; its python3 is CPython 3.11
# mmdebstrap on Ubuntu checks Debian's signatures with this keyring.
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")


class Host:
    """This machine, as the scripts use it: each command logged under the
    script's name before it runs; root's commands through sudo when this is
    not root, keeping the variables named in ``preserve_env``."""

    def __init__(self, name: str, preserve_env: Sequence[str] = ()) -> None:
        self.name = name
        self.preserve_env = list(preserve_env)

    def log(self, message: str) -> None:
        print(f"{self.name}: {message}", flush=True)

    def run(self, *command: str | Path, tee: bool = False, **kwargs) -> subprocess.CompletedProcess:
        """``command``, checked unless ``check=False``. ``tee``: its output
        (stdout and stderr) printed as it comes and kept, as ``stdout``."""
        argv = [str(c) for c in command]
        self.log("$ " + shlex.join(argv))
        check = kwargs.pop("check", True)
        if not tee:
            return subprocess.run(argv, check=check, **kwargs)
        lines = []
        with subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
            **kwargs,
        ) as process:  # fmt: skip
            for line in process.stdout:
                print(line, end="", flush=True)
                lines.append(line)
        result = subprocess.CompletedProcess(argv, process.returncode, "".join(lines))
        if check:
            result.check_returncode()
        return result

    def as_root(self, *command: str | Path, **kwargs) -> subprocess.CompletedProcess:
        """A command that needs root: as is when this is root, else through sudo."""
        if os.geteuid() == 0:
            return self.run(*command, **kwargs)
        if shutil.which("sudo") is None:
            sys.exit(
                f"{self.name}: needs root (or sudo) to install packages and enter Debian roots"
            )
        keep = [f"--preserve-env={','.join(self.preserve_env)}"] if self.preserve_env else []
        return self.run("sudo", *keep, *command, **kwargs)

    def install_packages(self, needed: Mapping[str, str]) -> None:
        """The Debian/Ubuntu packages of ``needed`` (a command that must exist:
        the package that brings it) whose command is missing, and Debian's
        keyring, from apt."""
        missing = [package for command, package in needed.items() if shutil.which(command) is None]
        if not KEYRING.exists():
            missing.append("debian-archive-keyring")
        if not missing:
            return
        if shutil.which("apt-get") is None:
            sys.exit(f"{self.name}: install {', '.join(missing)} (no apt-get here to do it)")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        self.as_root("apt-get", "update", "-q", env=env)
        self.as_root("apt-get", "install", "-y", "-q", "--no-install-recommends", *missing, env=env)


def mmdebstrap(
    host: Host,
    target: Path,
    *,
    arch: str,
    variant: str,
    include: Iterable[str],
    hooks: Iterable[str] = (),
) -> None:
    """A root of Debian ``SUITE`` for ``arch`` at ``target`` (a directory, or
    a tarball when its name ends in .tar), made by mmdebstrap from MIRROR:
    ``variant``'s packages (extract: their files only, no maintainer script;
    minbase: the essential ones installed, as a minimal system has them) and
    those of ``include``. ``hooks``: shell commands mmdebstrap runs once the
    root is complete, with the root's path as "$1" (--customize-hook)."""
    host.as_root(
        "mmdebstrap", "--quiet", "--mode=root", f"--variant={variant}", f"--arch={arch}",
        f"--keyring={KEYRING}", f"--include={','.join(include)}",
        *(f"--customize-hook={hook}" for hook in hooks),
        SUITE, target, MIRROR,
    )  # fmt: skip


def enter(
    host: Host,
    root: Path,
    command: Sequence[str],
    *,
    environment: Mapping[str, str] | None = None,
    dev: bool = True,
    binds: Iterable[tuple[Path, str]] = (),
    user: str | None = None,
    **kwargs,
) -> subprocess.CompletedProcess:
    """``command`` run in ``root`` with /proc mounted, this machine's /dev
    (``dev``) and ``binds`` (a file or directory of this machine: the path
    inside the root it is mounted on), in a mount namespace of its own.

    ``environment`` is the command's whole environment (env -i); without it
    the command inherits this process's. ``user``: "uid:gid" to run as
    (chroot --userspec), root otherwise. ``kwargs`` go to subprocess.run."""
    steps = [f"mount -t proc proc {shlex.quote(str(root / 'proc'))}"]
    if dev:
        steps.append(f"mount --rbind /dev {shlex.quote(str(root / 'dev'))}")
    for source, inside in binds:
        target = root / inside.lstrip("/")
        steps.append(f"mount --bind {shlex.quote(str(source))} {shlex.quote(str(target))}")
    chroot = ["chroot", *([f"--userspec={user}"] if user else []), str(root)]
    if environment is not None:
        chroot += ["/usr/bin/env", "-i", *(f"{k}={v}" for k, v in environment.items())]
    steps.append("exec " + shlex.join([*chroot, *command]))
    # unshare's mount namespace is private: nothing mounted here reaches this
    # machine's, and it all goes with the namespace's last process.
    return host.as_root("unshare", "--mount", "--fork", "sh", "-c", " && ".join(steps), **kwargs)
