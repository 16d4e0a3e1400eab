#!/usr/bin/env python3
"""The task of the GPU step's ``--malloc`` check (``tests/gpu/tuning_real.py``): prints one
JSON line saying which allocator library is mapped into this process (``/proc/self/maps``),
the ``LD_PRELOAD`` / ``MALLOC_CONF`` it got, and -- with jemalloc mapped -- whether
jemalloc itself read that ``MALLOC_CONF`` (``mallctl("opt.background_thread")``: off by
default, on only through gsrun's ``malloc.jemalloc_conf``)."""

import ctypes
import json
import os

maps = open("/proc/self/maps").read()
libs = sorted({ln.split()[-1] for ln in maps.splitlines() if "jemalloc" in ln or "tcmalloc" in ln})
out = {"mapped": libs, "LD_PRELOAD": os.environ.get("LD_PRELOAD"), "MALLOC_CONF": os.environ.get("MALLOC_CONF"),
       "opt.background_thread": None}
if any("jemalloc" in p for p in libs):
    lib = ctypes.CDLL(next(p for p in libs if "jemalloc" in p))
    val, size = ctypes.c_bool(False), ctypes.c_size_t(1)
    rc = lib.mallctl(b"opt.background_thread", ctypes.byref(val), ctypes.byref(size), None, ctypes.c_size_t(0))
    out["opt.background_thread"] = bool(val.value) if rc == 0 else f"mallctl rc {rc}"
print(json.dumps(out))
