"""The three facts the build reads from an ELF shared library, with nothing
but the standard library: the processor it is for, the libraries it needs
(``DT_NEEDED``) and the names of the symbols it defines.

The build reads them on every machine that builds lltm, including those
where nothing can be installed: a GPU image without a network, a build
without isolation in an environment of someone else's making. A reader of
the ELF format's fixed-layout headers (System V gABI, "Object Files") is a
few dozen lines; a dependency that may be absent would leave the build
unable to name the C++ runtime torch needs, or to check the library it
links. tests/test_cxx_runtime.py holds this reader to pyelftools' answers on
real libraries.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

# e_machine values the build tells apart (cross builds).
MACHINES = {3: "x86", 40: "arm", 62: "x86_64", 183: "aarch64"}

_SHT_SYMTAB, _SHT_DYNAMIC, _SHT_DYNSYM = 2, 6, 11
_DT_NULL, _DT_NEEDED = 0, 1
_SHN_UNDEF = 0


@dataclass(frozen=True)
class ElfLibrary:
    """What an ELF file says of itself."""

    machine: str  # "x86_64", "aarch64", ... or "e_machine=<n>"
    needed: tuple[str, ...]  # DT_NEEDED, in order
    # Symbols of .symtab and .dynsym that are not undefined; empty unless
    # asked for (libtorch_cpu defines about half a million).
    defined: frozenset[str]


class _Reader:
    """Fixed-size records of one ELF file, in its class (32/64-bit) and byte order."""

    def __init__(self, data: mmap.mmap) -> None:
        self.data = data
        self.is64 = data[4] == 2
        self.order = "<" if data[5] == 1 else ">"
        word = "Q" if self.is64 else "I"
        # Elf{32,64}_Ehdr from e_type on; Elf_Shdr; Elf_Dyn; Elf_Sym.
        self.header = self._struct(f"HHI{word}{word}{word}IHHHHHH")
        self.section = self._struct(f"II{word}{word}{word}{word}II{word}{word}")
        self.dynamic = self._struct("qQ" if self.is64 else "iI")
        self.symbol = self._struct("IBBHQQ" if self.is64 else "IIIBBH")

    def _struct(self, layout: str) -> struct.Struct:
        return struct.Struct(self.order + layout)

    def records(self, layout: struct.Struct, offset: int, size: int) -> list[tuple[int, ...]]:
        end = min(offset + size, len(self.data))
        return [
            layout.unpack_from(self.data, at)
            for at in range(offset, end - layout.size + 1, layout.size)
        ]

    def string(self, table_offset: int, index: int) -> str:
        start = table_offset + index
        end = self.data.find(b"\0", start)
        if end < 0:
            raise ValueError("an ELF string runs past the end of the file")
        return self.data[start:end].decode("utf-8", "replace")


def read(path: Path, *, symbols: bool = True) -> ElfLibrary | None:
    """The facts of the ELF file at ``path`` (its defined symbols only with
    ``symbols``); None where it is no ELF file (macOS' Mach-O, Windows' PE)
    or its headers are cut short."""
    with path.open("rb") as stream:
        if path.stat().st_size < 64:
            return None
        with mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _read(data, symbols)


def _read(data: mmap.mmap, symbols: bool) -> ElfLibrary | None:
    if data[:4] != b"\x7fELF" or data[4] not in (1, 2) or data[5] not in (1, 2):
        return None
    elf = _Reader(data)
    try:
        header = elf.header.unpack_from(data, 16)
        machine_number, section_offset, section_count = header[1], header[5], header[11]
        sections = [
            elf.section.unpack_from(data, section_offset + i * elf.section.size)
            for i in range(section_count)
        ]
        # (sh_type, sh_offset, sh_size, sh_link) of each section.
        kinds = [(s[1], s[4], s[5], s[6]) for s in sections]
        needed: list[str] = []
        defined: set[str] = set()
        for kind, offset, size, link in kinds:
            strings = kinds[link][1] if link < len(kinds) else None
            if strings is None:
                continue
            if kind == _SHT_DYNAMIC:
                for tag, value in elf.records(elf.dynamic, offset, size):
                    if tag == _DT_NULL:
                        break
                    if tag == _DT_NEEDED:
                        needed.append(elf.string(strings, value))
            elif symbols and kind in (_SHT_SYMTAB, _SHT_DYNSYM):
                for record in elf.records(elf.symbol, offset, size):
                    name_index = record[0]
                    section_index = record[3] if elf.is64 else record[5]
                    if name_index and section_index != _SHN_UNDEF:
                        defined.add(elf.string(strings, name_index))
    except (struct.error, ValueError, IndexError):
        return None
    machine = MACHINES.get(machine_number, f"e_machine={machine_number}")
    return ElfLibrary(machine=machine, needed=tuple(needed), defined=frozenset(defined))
