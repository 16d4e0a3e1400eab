"""``--malloc``: the allocator each task's command preloads, set by
``gsrun-bind`` right before the exec (``LD_PRELOAD`` never reaches the batch
script, ``srun`` or ``torchrun``), and the proof that it is mapped.

The library named by ``GSRUN_MALLOC`` is looked for in
``GSRUN_MALLOC_LIB_DIRS``, then ``ldconfig -p``, each candidate checked
(:func:`gsrun.facts.elf.library_problem`: this node's ELF class and machine);
it goes first in ``LD_PRELOAD``. :func:`watch_preload` waits for the exec (a
close-on-exec pipe's EOF), finds the library in ``/proc/<pid>/maps`` by
device and inode, and writes ``verified`` or why not to the task notes.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from contextlib import suppress

from gsrun.facts.elf import library_problem
from gsrun.request.malloc import ALLOCATORS, check_lib_dirs

MALLOC_ENV = "GSRUN_MALLOC"
LIB_DIRS_ENV = "GSRUN_MALLOC_LIB_DIRS"
LDCONFIG_TIMEOUT_S = 5.0
LDCONFIG_MAX_BYTES = 4 << 20
MAPS_WAIT_S = 2.0          # how long the watcher looks for the library in the task's maps
EXEC_WAIT_S = 30.0         # how long the watcher waits for the exec itself


def ldconfig_paths(text: str, soname: str) -> list[str]:
    """Paths ``ldconfig -p`` gives for ``soname``, in its order: lines like
    ``\\tlibjemalloc.so.2 (libc6,x86-64) => /lib/x86_64-linux-gnu/libjemalloc.so.2``.
    Only absolute paths; the flags are not trusted (the file is checked). Pure."""
    out = []
    for line in text.splitlines()[:100000]:
        name, sep, path = line.strip().partition(" => ")
        if sep and name.split(" (")[0] == soname and path.startswith("/") and "\0" not in path:
            out.append(path.strip())
    return out


def run_ldconfig() -> str:
    """``ldconfig -p``'s output ("" when it cannot run in time)."""
    env = {"PATH": "/usr/sbin:/sbin:/usr/bin:/bin", "LC_ALL": "C"}
    try:
        cp = subprocess.run(["ldconfig", "-p"], capture_output=True, timeout=LDCONFIG_TIMEOUT_S, env=env,
                            check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return cp.stdout[:LDCONFIG_MAX_BYTES].decode("utf-8", "replace")


def find_allocator(name: str, dirs, ldconfig=run_ldconfig, machine: str | None = None
                   ) -> tuple[str | None, list[str], list[str]]:
    """``(path or None, looked, rejected)``: the first usable library of
    allocator ``name`` in ``dirs``, then ``ldconfig()``'s text; where it
    looked, and why candidates were refused."""
    alloc = ALLOCATORS[name]
    looked, rejected = list(dirs), []
    for d in dirs:
        for so in alloc.sonames:
            p = os.path.join(d, so)
            if not os.path.lexists(p):
                continue
            why = library_problem(p, machine)
            if why is None:
                return p, looked, rejected
            rejected.append(why)
    looked.append("ldconfig -p")
    text = ldconfig()
    for so in alloc.sonames:
        for p in ldconfig_paths(text, so):
            why = library_problem(p, machine)
            if why is None:
                return p, looked, rejected
            rejected.append(f"ldconfig -p: {why}")
    return None, looked, rejected


def lib_dirs_from_env(text: str | None) -> tuple[str, ...] | None:
    """``GSRUN_MALLOC_LIB_DIRS`` -> directories, None when it is not a list
    :func:`gsrun.request.malloc.check_lib_dirs` accepts."""
    dirs = tuple((text or "").split(":")) if text else ()
    return None if check_lib_dirs(dirs) else dirs


def preload_value(lib: str, existing: str | None) -> str:
    """``LD_PRELOAD`` with ``lib`` first and the existing entries after it
    (ld.so(8): colon- or space-separated), ``lib`` not repeated."""
    rest = [e for e in (existing or "").replace(" ", ":").split(":") if e and e != lib]
    return ":".join([lib, *rest])


def maps_has(maps_text: str, dev_ino: tuple[int, int] | None, path: str) -> bool:
    """Whether a ``/proc/<pid>/maps`` text maps the file ``path``: a line whose
    inode (5th field) and device (4th, ``major:minor`` hex) are the file's
    (``dev_ino``: its ``st_dev``, ``st_ino``), or whose pathname is ``path`` or
    its real path. Pure."""
    real = os.path.realpath(path)
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        if parts[5].strip() in (path, real):
            return True
        if dev_ino is not None and parts[4].isdigit() and int(parts[4]) == dev_ino[1]:
            ma, _, mi = parts[3].partition(":")
            try:
                if os.makedev(int(ma, 16), int(mi, 16)) == dev_ino[0]:
                    return True
            except ValueError:
                continue
    return False


def write_notes(path: str, notes: dict) -> None:
    """Write the task notes (JSON, mode 0600, via a temp file and rename; no
    link followed). Errors are ignored: notes never stop a task."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(notes, f, separators=(",", ":"))
        os.replace(tmp, path)
    except OSError:
        with suppress(OSError):
            os.unlink(tmp)


def verify_mapped(pid: int, lib: str, wait_s: float = MAPS_WAIT_S, sleep=time.sleep) -> tuple[str, str]:
    """``("verified", how)`` once ``/proc/<pid>/maps`` maps ``lib`` (looked at
    every 20 ms for up to ``wait_s``), else ``("not verified", why)``."""
    try:
        st = os.stat(lib)
        dev_ino = (st.st_dev, st.st_ino)
    except OSError:
        dev_ino = None
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with open(f"/proc/{pid}/maps") as f:
                text = f.read(1 << 22)
        except OSError as e:
            return "not verified", f"/proc/{pid}/maps unreadable ({e.strerror}): the task ended or is not visible"
        if maps_has(text, dev_ino, lib):
            return "verified", f"mapped in local rank 0's /proc/{pid}/maps"
        if time.monotonic() >= deadline:
            return "not verified", (f"not in local rank 0's /proc/{pid}/maps {wait_s:g} s after exec (a static "
                                    "or setuid program ignores LD_PRELOAD)")
        sleep(0.02)


def watch_preload(lib: str, notes: dict, notes_path: str) -> None:
    """Start the watcher for this process's coming exec: a grandchild (no
    zombie is left to the task) that waits until the exec closes a
    close-on-exec pipe, checks the task's maps (:func:`verify_mapped`), sets
    ``notes["malloc"]["state"]``/``["detail"]`` and writes the notes. Returns
    at once; a failure to fork writes the notes as "not verified"."""
    pid = os.getpid()
    try:
        r, w = os.pipe()
        os.set_inheritable(w, False)
        os.set_blocking(w, True)
        first = os.fork()
    except OSError as e:
        notes["malloc"].update(state="not verified", detail=f"no watcher process: {e.strerror}")
        write_notes(notes_path, notes)
        return
    if first:
        os.close(r)
        os.waitpid(first, 0)
        return  # w stays open until the exec closes it
    try:  # child: fork the watcher and leave at once
        os.close(w)
        if os.fork():
            os._exit(0)
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        select.select([r], [], [], EXEC_WAIT_S)
        state, how = verify_mapped(pid, lib)
        notes["malloc"].update(state=state, detail=how)
        write_notes(notes_path, notes)
    finally:
        os._exit(0)
