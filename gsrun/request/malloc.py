"""``gsrun --malloc jemalloc|tcmalloc``: the allocator a job preloads, and its
environment, for the command line and ``malloc.*`` in the site config. The
job script finds the library on the node (:data:`LIB_DIRS`, then ``ldconfig
-p``; absent, the batch step exits 1 before ``srun``). Every value reaching
the script is allow-listed here: no user text reaches a shell.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gsrun.base.errors import InputError


@dataclass(frozen=True, slots=True)
class Allocator:
    """One preloadable allocator: its library names (first found wins), the
    environment variable family that tunes it, and the packages that provide it."""

    name: str
    sonames: tuple[str, ...]
    debian: str          # Debian/Ubuntu package
    rhel: str            # RHEL/Rocky package (EPEL for jemalloc)


ALLOCATORS: dict[str, Allocator] = {
    # libjemalloc.so.2: Debian libjemalloc2, RHEL jemalloc (EPEL)
    "jemalloc": Allocator("jemalloc", ("libjemalloc.so.2",), "libjemalloc2", "jemalloc"),
    # gperftools' tcmalloc without the heap profiler first (what PyTorch and IPEX docs preload)
    "tcmalloc": Allocator("tcmalloc", ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4"),
                          "libtcmalloc-minimal4", "gperftools-libs"),
}
MALLOC_CHOICES = (*ALLOCATORS, "none")

# standard library directories, multiarch first (Debian/Ubuntu), then RHEL's lib64
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
            "/usr/local/lib")
# jemalloc's opt.* names (man jemalloc, "MALLOC_CONF"): return dirty pages from a background
# thread instead of the allocating thread, THP for metadata when THP is on, and keep freed
# pages for 10 s before returning them (fewer page faults in the step loop)
JEMALLOC_CONF = "background_thread:true,metadata_thp:auto,dirty_decay_ms:10000,muzzy_decay_ms:10000"
# gperftools (docs/tcmalloc.html, "Modifying Runtime Behavior"): no stderr line for every
# allocation over 1 GiB (pinned batches are), 256 MiB of thread caches for DataLoader threads
TCMALLOC_ENV = {"TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": "68719476736",
                "TCMALLOC_MAX_TOTAL_THREAD_CACHE_BYTES": "268435456"}

# allow-lists
_CONF_LIST = (r"[A-Za-z_][A-Za-z0-9_]{0,63}:[A-Za-z0-9_.+-]{1,64}"
              r"(,[A-Za-z_][A-Za-z0-9_]{0,63}:[A-Za-z0-9_.+-]{1,64}){0,31}")
_TCMALLOC_NAME = r"TCMALLOC_[A-Z0-9_]{1,64}"
_WORD = r"[A-Za-z0-9_.+-]{1,64}"
_LIB_DIR = r"/[A-Za-z0-9_.+/-]{0,254}"


def parse_malloc(value: str, phase: str = "submit") -> str | None:
    """``--malloc VALUE`` -> the allocator name, or None for ``none``.

    Raises:
        InputError: not one of jemalloc, tcmalloc, none.
    """
    if value not in MALLOC_CHOICES:
        raise InputError(phase, "bad --malloc", repr(value)[:80], hint="jemalloc, tcmalloc or none")
    return None if value == "none" else value


def check_conf_list(value: str) -> str | None:
    """A ``MALLOC_CONF`` / ``PYTORCH_CUDA_ALLOC_CONF`` value (``key:value,...`` of plain
    words) or ``""``: None when good, else the problem."""
    if value == "" or re.fullmatch(_CONF_LIST, value):
        return None
    return "must be key:value[,key:value...] of letters, digits and _ . + -"


def check_tcmalloc_env(table: dict) -> str | None:
    """``{"TCMALLOC_NAME": "value"}`` with plain-word values: None when good, else the problem."""
    for k, v in table.items():
        if not isinstance(k, str) or not re.fullmatch(_TCMALLOC_NAME, k) or not isinstance(v, str) \
                or not re.fullmatch(_WORD, v):
            return f"entry {k!r} must be TCMALLOC_NAME = \"value\" (value: letters, digits, _ . + -)"
    return None


def check_lib_dirs(dirs) -> str | None:
    """A non-empty list of absolute directory paths of plain characters: None when good."""
    if not dirs or len(dirs) > 32:
        return "must list 1 to 32 directories"
    for d in dirs:
        if not isinstance(d, str) or not re.fullmatch(_LIB_DIR, d) or "/../" in d + "/":
            return f"{d!r} must be an absolute path of letters, digits and _ . + - /"
    return None


def malloc_env(allocator: str, jemalloc_conf: str, tcmalloc_env: dict) -> tuple[tuple[str, str], ...]:
    """The tuning environment exported with the preload: ``(("MALLOC_CONF", conf),)``
    for jemalloc (nothing when ``conf`` is empty), the sorted ``TCMALLOC_*`` pairs for tcmalloc.

    Raises:
        InputError: an unknown allocator or a value outside the allow-lists.
    """
    if allocator == "jemalloc":
        if check_conf_list(jemalloc_conf):
            raise InputError("submit", "bad malloc.jemalloc_conf", repr(jemalloc_conf)[:80])
        return (("MALLOC_CONF", jemalloc_conf),) if jemalloc_conf else ()
    if allocator == "tcmalloc":
        if check_tcmalloc_env(tcmalloc_env):
            raise InputError("submit", "bad malloc.tcmalloc_env", repr(tcmalloc_env)[:80])
        return tuple(sorted(tcmalloc_env.items()))
    raise InputError("submit", "bad --malloc", repr(allocator)[:80], hint="jemalloc or tcmalloc")
