"""The ELF identity of a shared library and of this node, from the file's
header (elf(5)): ``e_ident`` (magic ``\\x7fELF``, ``EI_CLASS`` 1 = 32-bit,
2 = 64-bit, ``EI_DATA`` 1 = little-, 2 = big-endian), ``e_type`` (3 =
``ET_DYN``, a shared object) and ``e_machine`` (62 = ``EM_X86_64``, 183 =
``EM_AARCH64``, 21 = ``EM_PPC64``, 3 = ``EM_386``, 40 = ``EM_ARM``). Reads
at most the first 64 bytes of a file, never follows it anywhere else.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ELF_MAGIC = b"\x7fELF"
ET_DYN = 3
MACHINES = {62: "x86-64", 183: "aarch64", 21: "ppc64", 3: "i386", 40: "arm", 243: "riscv", 22: "s390"}
# os.uname().machine -> (EI_CLASS, EI_DATA, e_machine) of the node's own libraries
NODE_ELF = {"x86_64": (2, 1, 62), "aarch64": (2, 1, 183), "ppc64le": (2, 1, 21), "riscv64": (2, 1, 243),
            "s390x": (2, 2, 22)}


@dataclass(frozen=True, slots=True)
class ElfId:
    """``ei_class`` (1 or 2), ``ei_data`` (1 or 2), ``e_type``, ``e_machine``."""
    ei_class: int
    ei_data: int
    e_type: int
    e_machine: int

    def describe(self) -> str:
        """``"ELF 64-bit x86-64"``."""
        bits = {1: "32-bit", 2: "64-bit"}.get(self.ei_class, f"class {self.ei_class}")
        return f"ELF {bits} {MACHINES.get(self.e_machine, f'machine {self.e_machine}')}"


def elf_id(header: bytes) -> ElfId | None:
    """The identity in the first bytes of a file (at least 20), None when it is
    not an ELF header. Pure."""
    if len(header) < 20 or header[:4] != ELF_MAGIC or header[4] not in (1, 2) or header[5] not in (1, 2):
        return None
    order = "little" if header[5] == 1 else "big"
    return ElfId(header[4], header[5], int.from_bytes(header[16:18], order), int.from_bytes(header[18:20], order))


def read_elf_id(path: str) -> tuple[ElfId | None, str]:
    """``(identity, "")`` of the regular file at ``path`` (symlinks resolved, as
    ld.so opens it), or ``(None, why)``: absent, not a regular file, unreadable,
    not ELF."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        return None, e.strerror or str(e)
    try:
        st = os.fstat(fd)
        if not (st.st_mode & 0o170000) == 0o100000:
            return None, "not a regular file"
        head = os.read(fd, 64)
    except OSError as e:
        return None, e.strerror or str(e)
    finally:
        os.close(fd)
    got = elf_id(head)
    return (got, "") if got else (None, "not an ELF file")


def node_elf(machine: str | None = None) -> tuple[int, int, int] | None:
    """``(EI_CLASS, EI_DATA, e_machine)`` of this node's 64-bit libraries from
    ``uname -m`` (``machine``; default this node's), None for a machine not in
    :data:`NODE_ELF`."""
    return NODE_ELF.get(machine if machine is not None else os.uname().machine)


def library_problem(path: str, machine: str | None = None) -> str | None:
    """Why the library at ``path`` cannot be preloaded on this node (None: it
    can): missing, not ELF, not a shared object, or another class, byte
    order or machine than the node's."""
    got, why = read_elf_id(path)
    if got is None:
        return f"{path}: {why}"
    want = node_elf(machine)
    if got.e_type != ET_DYN:
        return f"{path}: {got.describe()} is not a shared object (e_type {got.e_type})"
    if want is not None and (got.ei_class, got.ei_data, got.e_machine) != want:
        m = machine if machine is not None else os.uname().machine
        return f"{path}: {got.describe()}, this node is {m}"
    return None
