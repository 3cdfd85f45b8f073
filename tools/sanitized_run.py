"""Runs a command under the sanitizers and puts every report they write into its log.

A sanitizer writes its report to the stderr of the process it stops, and
pytest captures that stream: a report of a test run in pytest's own process
dies with the process (exit status 1, no word), and one in a pytest-xdist
worker leaves only "worker 'gw0' crashed". A report in a subprocess whose
exit status a test expects to be an error is not even a failure. So each
process of the command writes its reports to files instead (``log_path`` of
ASAN_OPTIONS and UBSAN_OPTIONS, a folder of this run: one file per process
that wrote anything), and once the command ends, whatever its outcome,
every file is printed whole, with its stack, under a header naming it; the
run fails if the command failed or any process reported an error. A file
that holds warnings alone (ASan's about the fibers of the host-built CUDA
kernels, makecontext and swapcontext) is printed and fails nothing.

    python -m tools.sanitized_run -- COMMAND [ARGS ...]

The environment is the caller's (LD_PRELOAD with the sanitizers' runtimes,
tools/nox_sanitize.py's); options after ``log_path`` in it are kept.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tools.setup_helpers import sanitizers

OPTIONS = ("ASAN_OPTIONS", "UBSAN_OPTIONS")


def environment(folder: Path, environ: dict[str, str]) -> dict[str, str]:
    """``environ`` with each sanitizer's ``log_path`` in ``folder``: ASan's
    reports as asan.PID, UBSan's as ubsan.PID. Options are read left to
    right, the last one winning: log_path goes last."""
    env = dict(environ)
    for variable in OPTIONS:
        prefix = variable.split("_")[0].lower()
        options = [part for part in env.get(variable, "").split(":") if part]
        env[variable] = ":".join([*options, f"log_path={folder / prefix}"])
    return env


def written(folder: Path) -> list[Path]:
    """The files the sanitizers wrote in ``folder``, oldest first."""
    return sorted(
        (p for p in folder.iterdir() if p.is_file()), key=lambda p: (p.stat().st_mtime, p.name)
    )


def is_report(path: Path) -> bool:
    """Whether the file holds an error report (sanitizers.REPORT), not warnings alone."""
    return sanitizers.report(path.read_text(errors="replace")) is not None


def show(found: list[Path]) -> str:
    """Every file whole, each under a header naming it and what it holds."""
    parts = []
    for path in found:
        text = path.read_text(errors="replace").rstrip()
        kind = "report" if is_report(path) else "warnings"
        parts.append(f"===== sanitizer {kind}: {path.name} =====\n{text}")
    return "\n".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs=argparse.REMAINDER, help="after --: the command")
    options = parser.parse_args()
    command = options.command[1:] if options.command[:1] == ["--"] else options.command
    if not command:
        parser.error("no command given")
    with tempfile.TemporaryDirectory(prefix="lltm-sanitizer-reports-") as scratch:
        folder = Path(scratch)
        status = subprocess.run(command, env=environment(folder, dict(os.environ))).returncode
        found = written(folder)
        if found:
            # The command's own output first, then the files: stdout, as
            # pytest writes its results there and a log reads in order.
            print(show(found), flush=True)
        reported = [path for path in found if is_report(path)]
        if reported:
            print(
                f"sanitizer reports: {len(reported)} (exit status {status}): "
                + ", ".join(p.name for p in reported),
                flush=True,
            )
            return status or 1
    return status


if __name__ == "__main__":
    sys.exit(main())
