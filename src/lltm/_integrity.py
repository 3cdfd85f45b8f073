"""Compiled libraries checked against what the installer recorded, before loading.

A library cut short (an interrupted copy, a full disk) can pass the dynamic
loader's header checks and then crash the interpreter with SIGBUS when the
loader touches pages past the end of the file; no Python exception can catch
that. So before lltm loads a compiled library (its own ``lltm/lib/lltm_cpu``
and the CUDA plugin's; lltm/_native.py) it compares the file with the distribution's RECORD, which
holds each installed file's size and sha256: a mismatch is reported as what
it is, a damaged install, with the command that repairs it.

Libraries no installer recorded (a source checkout, an editable install, a
conda package without RECORD) are not checked. The check reads the file once:
about 4 ms for lltm's library (4.4 MB) on a 2-core x86-64 machine (AMD EPYC), a
truncated file 0.3 ms, against the seconds `import torch` takes.
"""

from __future__ import annotations

import base64
import csv
import hashlib
from pathlib import Path


def _recorded(library: Path, site: Path, distribution: str) -> tuple[str, int] | None:
    """(sha256 digest as RECORD writes it, size) of ``library``, or None.

    Read from the RECORD of ``distribution`` installed in the directory ``site``.
    """
    name = distribution.replace("-", "_")
    relative = library.relative_to(site).as_posix()
    for record in site.glob(f"{name}-*.dist-info/RECORD"):
        try:
            with record.open(newline="", encoding="utf-8") as lines:
                for row in csv.reader(lines):
                    if len(row) == 3 and row[0] == relative and row[1].startswith("sha256="):
                        return row[1].removeprefix("sha256="), int(row[2])
        except (OSError, ValueError):
            continue
    return None


def damage(library: Path, package_dir: Path, distribution: str) -> str | None:
    """How ``library`` differs from what the installer of ``distribution`` recorded.

    ``library`` is a file of the package at ``package_dir``. None where it
    matches, or where nothing recorded it (lltm/_native.py asks before loading).
    """
    recorded = _recorded(library, package_dir.parent, distribution)
    if recorded is None:
        return None
    digest, size = recorded
    actual_size = library.stat().st_size
    if actual_size != size:
        return f"{library.name} is {actual_size} bytes where the installer wrote {size}"
    sha = hashlib.sha256()
    with library.open("rb") as data:
        while chunk := data.read(1 << 20):
            sha.update(chunk)
    if base64.urlsafe_b64encode(sha.digest()).rstrip(b"=").decode() != digest:
        return f"{library.name} does not match the installer's sha256 of it"
    return None
