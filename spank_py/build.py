"""Build and install the gsrun SPANK plugin (``gsrun-node spank build|install``).

The plugin embeds the CPython it was built against and records the Slurm
headers' ``SLURM_VERSION_NUMBER`` (it refuses another major.minor: rebuild).
:func:`options_header` compiles :data:`gsrun.spank_py.hooks.OPTIONS` and the
node daemon's default socket into a C header, so the shim registers the
options without starting Python.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from gsrun.base.errors import ConfigError, InputError, NodeError
from gsrun.base.fsutil import atomic_write
from gsrun.base.paths import DAEMON_SOCKET_NAME, DEFAULT_STATE_DIR
from gsrun.base.templating import render
from gsrun.spank_py.hooks import OPTIONS, REMOTE_OPTIONS

SRC_DIR = Path(__file__).resolve().parent
C_SOURCE = SRC_DIR / "gsrun_spank.c"
VERSION_SCRIPT = SRC_DIR / "gsrun_spank.map"
PY_VERSION_SCRIPT = SRC_DIR / "gsrun_spank_py.map"
SO_NAME = "gsrun_spank.so"
PY_PART_NAME = "gsrun_spank_py.so"   # the Python half, loaded by gsrun_spank.so from its own folder
OPTIONS_HEADER = "gsrun_spank_options.h"
SPANK_OPTION_MAXLEN = 75          # slurm/spank.h
MAX_OPTIONS = 32
_OPTION_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,74}")
SLURM_INCLUDE_DIRS = ("/usr/include", "/usr/local/include")
BEGIN_MARKER = "# BEGIN gsrun spank (managed by gsrun-node spank install)"
END_MARKER = "# END gsrun spank"
# daemon/ beside this folder: client.h
DAEMON_CLIENT_DIR = Path(__file__).resolve().parent.parent / "daemon"
HARDENING = ["-shared", "-fPIC", "-O2", "-fstack-protector-strong", "-D_FORTIFY_SOURCE=2",
             "-Wall", "-Werror=implicit-function-declaration", "-Werror=format-security"]
LINK_HARDENING = ["-Wl,-z,relro,-z,now", "-Wl,-z,nodelete", "-Wl,-z,noexecstack"]
SYSTEM_LIBDIRS = ("/usr/lib", "/usr/lib64", "/lib", "/lib64")
ARG_KEYS = ("pythonpath", "on_error", "bind", "config", "daemon")
_SAFE_ARG = re.compile(r"^[A-Za-z0-9_./+@-]{1,4000}$")
_TIMEOUT_S = 120.0

_PROBE = r"""
import json, sys, sysconfig
v = sysconfig.get_config_vars()
print(json.dumps({
    "version": v.get("VERSION"), "abiflags": v.get("ABIFLAGS") or "",
    "py_version": sys.version.split()[0], "hexversion": sys.hexversion,
    "include": sysconfig.get_path("include"), "platinclude": sysconfig.get_path("platinclude"),
    "libdir": v.get("LIBDIR"), "ldlibrary": v.get("LDLIBRARY"), "instsoname": v.get("INSTSONAME"),
    "shared": v.get("Py_ENABLE_SHARED"), "libs": v.get("LIBS") or "", "syslibs": v.get("SYSLIBS") or "",
    "base_prefix": sys.base_prefix, "executable": sys.executable,
    "purelib": sysconfig.get_path("purelib"),
}))
"""


def _run(argv: list[str], what: str, timeout_s: float = _TIMEOUT_S, phase: str = "spank build") -> str:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError as e:
        raise NodeError(phase, what, f"{argv[0]} not found",
                        hint="install a C compiler (cc) and the Python/Slurm development headers") from e
    except subprocess.TimeoutExpired as e:
        raise NodeError(phase, what, f"{argv[0]} did not finish in {timeout_s:.0f} s") from e
    if p.returncode != 0:
        raise NodeError(phase, what, f"{' '.join(argv[:3])}... exited {p.returncode}: "
                        f"{(p.stderr or p.stdout).strip()[-2000:]}")
    return p.stdout


def python_info(python: str) -> dict:
    """Facts about the Python to embed (:data:`_PROBE`'s keys: ``version``
    "3.11", ``instsoname`` "libpython3.11.so.1.0", ``base_prefix`` the plugin's
    Python home, ``purelib`` the default ``pythonpath=``, ...).
    Raises NodeError when it cannot be run or has no shared libpython.
    """
    out = _run([python, "-I", "-c", _PROBE], "python")
    info = json.loads(out)
    if str(info.get("shared")) != "1" or not info.get("instsoname"):
        raise NodeError("spank build", "python", f"{python} has no shared libpython (Py_ENABLE_SHARED=0)",
                        hint="build against a Python configured with --enable-shared "
                             "(Debian's /usr/bin/python3 is)")
    return info


def python_flags(python: str, info: dict) -> tuple[list[str], list[str]]:
    """(cflags, ldflags) to embed ``python``: ``python3.X-config --embed``, else sysconfig's."""
    real = Path(os.path.realpath(python))
    config = real.parent / f"python{info['version']}{info['abiflags']}-config"
    if config.is_file() and os.access(config, os.X_OK):
        cflags = _run([str(config), "--embed", "--cflags"], "python3-config").split()
        ldflags = _run([str(config), "--embed", "--ldflags"], "python3-config").split()
        if f"-lpython{info['version']}{info['abiflags']}" in ldflags:
            return cflags, ldflags
    cflags = [f"-I{info['include']}"]
    if info.get("platinclude") and info["platinclude"] != info["include"]:
        cflags.append(f"-I{info['platinclude']}")
    ldflags = [f"-L{info['libdir']}", f"-lpython{info['version']}{info['abiflags']}"]
    ldflags += (info["libs"] + " " + info["syslibs"]).split()
    return cflags, ldflags


def slurm_version_number(include_dir: str | os.PathLike) -> int:
    """``SLURM_VERSION_NUMBER`` of ``<include_dir>/slurm/slurm_version.h`` (0x160508: 22.05.8).
    Raises NodeError when absent (no libslurm-dev)."""
    p = Path(include_dir) / "slurm" / "slurm_version.h"
    try:
        text = p.read_text()
    except OSError as e:
        raise NodeError("spank build", "slurm headers", f"cannot read {p}: {e.strerror}",
                        hint="install the Slurm development headers (Debian: libslurm-dev)") from e
    m = re.search(r"^#define\s+SLURM_VERSION_NUMBER\s+(0x[0-9a-fA-F]+|\d+)", text, re.M)
    if not m:
        raise NodeError("spank build", "slurm headers", f"{p} has no SLURM_VERSION_NUMBER")
    return int(m.group(1), 0)


def format_slurm_version(number: int) -> str:
    """0x160508 -> "22.05.8"."""
    return f"{(number >> 16) & 0xff}.{(number >> 8) & 0xff:02d}.{number & 0xff}"


def find_slurm_include(candidates=SLURM_INCLUDE_DIRS) -> Path:
    """The include dir holding ``slurm/spank.h``."""
    for d in candidates:
        if (Path(d) / "slurm" / "spank.h").is_file():
            return Path(d)
    raise NodeError("spank build", "slurm headers", f"slurm/spank.h not found under {', '.join(candidates)}",
                    hint="install the Slurm development headers (Debian: libslurm-dev)")


def _c_string(value: str, what: str) -> str:
    if not re.match(r"^[A-Za-z0-9_./+@-]*$", value):
        raise NodeError("spank build", what, f"{value!r} has characters the build will not quote")
    return f'"{value}"'


def _c_text(value: str, what: str) -> str:
    """``value`` as a C string literal: printable ASCII only, ``\\`` and ``"`` escaped."""
    if not all(" " <= ch <= "~" for ch in value):
        raise NodeError("spank build", "option table", f"{what} {value!r} has characters outside printable ASCII")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def options_header(options=None) -> str:
    """``gsrun_spank_options.h``: the option table (default
    :data:`gsrun.spank_py.hooks.OPTIONS`), the remote options and the node
    daemon's socket name and default path. Pure.

    Raises NodeError naming the row: a name not ``[a-z0-9-]{1,75}`` or
    repeated, has_arg not 0-2, text not printable ASCII, 0 or over 32 rows.
    """
    rows = list(OPTIONS if options is None else options)
    if not 1 <= len(rows) <= MAX_OPTIONS:
        raise NodeError("spank build", "option table", f"{len(rows)} options; 1 to {MAX_OPTIONS} allowed")
    lines = []
    seen: set[str] = set()
    for i, row in enumerate(rows):
        try:
            name, arginfo, usage, has_arg = row
        except (TypeError, ValueError):
            raise NodeError("spank build", "option table", f"row {i} is not (name, arginfo|None, usage, has_arg)") \
                from None
        if not isinstance(name, str) or not _OPTION_NAME.fullmatch(name) or name in seen:
            raise NodeError("spank build", "option table", f"row {i}: bad or repeated option name {name!r}",
                            hint=f"[a-z0-9-], at most {SPANK_OPTION_MAXLEN} characters, each name once")
        if has_arg not in (0, 1, 2) or isinstance(has_arg, bool):
            raise NodeError("spank build", "option table", f"--{name}: has_arg {has_arg!r} must be 0, 1 or 2")
        if not isinstance(usage, str) or (arginfo is not None and not isinstance(arginfo, str)):
            raise NodeError("spank build", "option table", f"--{name}: usage/arginfo must be text")
        seen.add(name)
        info = "NULL" if arginfo is None else _c_text(arginfo, f"--{name} arginfo")
        lines.append(f"\t{{ {_c_text(name, 'name')}, {info}, {_c_text(usage, f'--{name} usage')}, {has_arg} }},")
    # the options a step's plan reads, each followed by a comma (the shim ends the list with NULL)
    forwards = "#define GSRUN_REMOTE_OPTIONS " + "".join(_c_text(n, "name") + ", " for n in REMOTE_OPTIONS
                                                          if n in seen) + "\n"
    forwards += (f"#define GSRUN_DAEMON_SOCKET_NAME {_c_text(DAEMON_SOCKET_NAME, 'daemon socket name')}\n"
                 "#define GSRUN_DEFAULT_DAEMON_SOCKET "
                 f"{_c_text(os.path.join(DEFAULT_STATE_DIR, DAEMON_SOCKET_NAME), 'daemon socket')}\n")
    return ("/* Generated by spank_py/build.py from gsrun.spank_py.hooks: do not edit. */\n"
            "#ifndef GSRUN_SPANK_OPTIONS_H\n#define GSRUN_SPANK_OPTIONS_H\n"
            + forwards +
            f"#define GSRUN_N_OPTS {len(rows)}\n"
            "static const struct gs_opt_def {\n\tconst char *name;\n\tconst char *arginfo;\n"
            "\tconst char *usage;\n\tint has_arg;\n} gs_opt_defs[GSRUN_N_OPTS] = {\n"
            + "\n".join(lines) + "\n};\n#endif\n")


def compile_command(out_so: Path, python: str, info: dict, include_dir: Path,
                    cc: str = "cc", gen_dir: Path | None = None, part: str = "plugin") -> list[str]:
    """The compiler argv; ``gen_dir`` holds the generated header; ``part``:
    ``"plugin"`` (``gsrun_spank.so``, dlopen()s the Python half when needed) or
    ``"python"`` (``gsrun_spank_py.so``, linked to libpython)."""
    libdir = os.path.normpath(info["libdir"] or "")
    defines = [
        f"-DGSRUN_LIBPYTHON={_c_string(info['instsoname'], 'libpython soname')}",
        f"-DGSRUN_LIBPYTHON_PATH={_c_string(os.path.join(libdir, info['instsoname']), 'libpython path')}",
        f"-DGSRUN_PY_VERSION={_c_string(info['py_version'], 'python version')}",
        f"-DGSRUN_PYTHON_HOME={_c_string(info['base_prefix'], 'python home')}",
        f"-DGSRUN_PYTHON_EXE={_c_string(info['executable'], 'python executable')}",
        f"-DGSRUN_DEFAULT_PYTHONPATH={_c_string(info['purelib'] or '', 'site-packages')}",
    ]
    gen = [f"-I{gen_dir}"] if gen_dir is not None else []
    slurm_inc = [] if str(include_dir) == "/usr/include" else [f"-I{include_dir}"]
    if part == "plugin":
        daemon_inc = [f"-I{DAEMON_CLIENT_DIR}"]
        return ([cc] + HARDENING + gen + daemon_inc + slurm_inc + defines + [str(C_SOURCE), "-o", str(out_so)]
                + LINK_HARDENING + [f"-Wl,-soname,{SO_NAME}", f"-Wl,--version-script={VERSION_SCRIPT}", "-ldl"])
    cflags, ldflags = python_flags(python, info)
    rpath = []
    if libdir and not any(libdir == d or libdir.startswith(d + "/") for d in SYSTEM_LIBDIRS):
        rpath = [f"-Wl,-rpath,{libdir}"]
    # Python's cflags may carry -O3/-g/-DNDEBUG; ours come after and win.
    return ([cc] + cflags + HARDENING + gen + slurm_inc + defines + ["-DGSRUN_PY_PART"]
            + [str(C_SOURCE), "-o", str(out_so)]
            + LINK_HARDENING + [f"-Wl,-soname,{PY_PART_NAME}", f"-Wl,--version-script={PY_VERSION_SCRIPT}"]
            + rpath + ldflags)


def build(out_dir: str, python: str = sys.executable, cc: str | None = None,
          slurm_include: str | os.PathLike | None = None) -> Path:
    """Compile ``gsrun_spank.so`` and ``gsrun_spank_py.so`` into ``out_dir``
    with ``gsrun_spank.json`` (versions) -> the plugin's path. ``cc``: default
    ``$CC`` or ``cc``; ``slurm_include``: default the first of
    :data:`SLURM_INCLUDE_DIRS` with ``slurm/spank.h``.
    Raises NodeError with the compiler output when something is missing."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    include_dir = find_slurm_include((str(slurm_include),) if slurm_include else SLURM_INCLUDE_DIRS)
    slurm_num = slurm_version_number(include_dir)
    info = python_info(python)
    so = out / SO_NAME
    header = options_header()
    with tempfile.TemporaryDirectory(prefix="gsrun-spank-gen-") as gen:
        (Path(gen) / OPTIONS_HEADER).write_text(header)
        # the Python half first: a plugin is never left without the half it loads
        for part, name in (("python", PY_PART_NAME), ("plugin", SO_NAME)):
            tmp = out / f".{name}.build-{os.getpid()}"
            argv = compile_command(tmp, python, info, include_dir, cc or os.environ.get("CC") or "cc", Path(gen),
                                   part=part)
            try:
                _run(argv, f"compile {name}")
                os.chmod(tmp, 0o755)
                os.replace(tmp, out / name)
            finally:
                if tmp.exists():
                    tmp.unlink()
    meta = {"slurm_version_number": slurm_num, "slurm_version": format_slurm_version(slurm_num),
            "python": info["executable"], "python_version": info["py_version"],
            "libpython": info["instsoname"], "python_home": info["base_prefix"],
            "default_pythonpath": info["purelib"],
            "options": [row[0] for row in OPTIONS]}
    atomic_write(out / "gsrun_spank.json", json.dumps(meta, indent=1, sort_keys=True) + "\n")
    return so


def read_build_info(so_path: str | os.PathLike) -> dict:
    """What the build recorded: ``gsrun_spank.json`` next to the .so, else its
    ``built-for`` string ({} if unknown)."""
    so = Path(so_path)
    meta = so.with_name("gsrun_spank.json")
    try:
        return json.loads(meta.read_text())
    except (OSError, ValueError):
        pass
    try:
        data = so.read_bytes()
    except OSError:
        return {}
    m = re.search(rb"gsrun_spank built-for slurm=(0x[0-9a-fA-F]+) python=([0-9.a-z+]+)", data)
    if not m:
        return {}
    num = int(m.group(1), 16)
    return {"slurm_version_number": num, "slurm_version": format_slurm_version(num),
            "python_version": m.group(2).decode()}


def plugstack_args(args: dict | None) -> list[tuple[str, str]]:
    """Install ``args`` (``pythonpath`` str or list, ``on_error`` fail|ignore,
    ``bind`` auto|none, ``config`` and ``daemon`` paths) -> ``(key, value)``
    pairs. Raises InputError (unknown key, relative path, bad value)."""
    args = dict(args or {})
    unknown = sorted(set(args) - set(ARG_KEYS))
    if unknown:
        raise InputError("spank install", "plugstack argument", f"unknown keys {unknown}",
                         hint=f"allowed: {', '.join(ARG_KEYS)}")
    pairs: list[tuple[str, str]] = []
    paths = args.get("pythonpath") or []
    if isinstance(paths, str):
        paths = [paths]
    if len(paths) > 8:
        raise InputError("spank install", "pythonpath", f"{len(paths)} entries; at most 8")
    for key, v in [("pythonpath", p) for p in paths] + [(k, args[k]) for k in ("config", "daemon")
                                                          if args.get(k) is not None]:
        if not isinstance(v, str) or not v.startswith("/") or not _SAFE_ARG.match(v):
            raise InputError("spank install", key, f"{v!r} must be an absolute path of "
                             "[A-Za-z0-9_./+@-] (plugstack.conf has no quoting)")
        pairs.append((key, v))
    for key, allowed in (("on_error", ("fail", "ignore")), ("bind", ("auto", "none"))):
        v = args.get(key)
        if v is None:
            continue
        if v not in allowed:
            raise InputError("spank install", key, f"{v!r} must be one of {', '.join(allowed)}")
        pairs.append((key, v))
    return pairs


def render_plugstack(so_path: str, args: list[tuple[str, str]], slurm_version: str = "?",
                     python_version: str = "?") -> str:
    """The managed plugstack block (``templates/plugstack.conf.j2``, StrictUndefined)."""
    if not so_path.startswith("/") or not _SAFE_ARG.match(so_path):
        raise InputError("spank install", "plugin path", f"{so_path!r} must be an absolute plain path")
    return render("plugstack.conf.j2", so_path=so_path, args=args, slurm_version=slurm_version,
                      python_version=python_version, begin_marker=BEGIN_MARKER, end_marker=END_MARKER)


def merge_plugstack(existing: str, block: str) -> str:
    """Replace the managed block in ``existing`` plugstack text (or append it).
    Raises ConfigError when a BEGIN marker has no END (hand-edited file)."""
    lines = existing.splitlines(keepends=True)
    out: list[str] = []
    i = 0
    placed = False
    while i < len(lines):
        if lines[i].rstrip("\n") == BEGIN_MARKER:
            j = i
            while j < len(lines) and lines[j].rstrip("\n") != END_MARKER:
                j += 1
            if j == len(lines):
                raise ConfigError("spank install", "plugstack", "managed block has no end marker",
                                  hint=f"remove the lines from '{BEGIN_MARKER}' by hand")
            if not placed:
                out.append(block)
                placed = True
            i = j + 1
            continue
        out.append(lines[i])
        i += 1
    if not placed:
        if out and not out[-1].endswith("\n"):
            out[-1] += "\n"
        out.append(block)
    return "".join(out)


def install(so_path: str | os.PathLike, dest_dir: str | os.PathLike, plugstack_path: str | os.PathLike,
            args: dict | None = None) -> Path:
    """Copy the plugin and its Python half to ``dest_dir`` (0755) and write its
    block into ``plugstack_path``, atomically. -> the installed .so path.
    Raises InputError (bad ``args``), NodeError (cannot copy/write)."""
    src = Path(so_path)
    pairs = plugstack_args(args)
    if not src.is_file():
        raise NodeError("spank install", "plugin", f"{src} does not exist", hint="run gsrun-node spank build first")
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    # plugstack.conf.d first: a failure leaves no half install
    Path(plugstack_path).parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    target = dest / SO_NAME
    info = read_build_info(src)
    block = render_plugstack(str(target.resolve()), pairs, info.get("slurm_version", "?"),
                             info.get("python_version", "?"))
    owner = (0, 0) if os.geteuid() == 0 else (None, None)
    py_src = src.with_name(PY_PART_NAME)
    if not py_src.is_file():
        raise NodeError("spank install", "plugin", f"{py_src} does not exist (the plugin's Python half)",
                        hint="run gsrun-node spank build first")
    # the Python half first: the plugin loads it from its own folder
    for s_path, t_path in ((py_src, target.with_name(PY_PART_NAME)), (src, target)):
        try:
            atomic_write(t_path, s_path.read_bytes(), 0o755, *owner)
        except OSError as e:
            raise NodeError("spank install", "plugin", f"cannot install {t_path}: {e.strerror}") from e
    meta = src.with_name("gsrun_spank.json")
    if meta.is_file() and meta.resolve() != target.with_name("gsrun_spank.json").resolve():
        atomic_write(target.with_name("gsrun_spank.json"), meta.read_text(), 0o644, *owner)
    ps = Path(plugstack_path)
    try:
        existing = ps.read_text() if ps.exists() else ""
    except OSError as e:
        raise NodeError("spank install", "plugstack", f"cannot read {ps}: {e.strerror}") from e
    try:
        atomic_write(ps, merge_plugstack(existing, block), 0o644, *owner)
    except OSError as e:
        raise NodeError("spank install", "plugstack", f"cannot write {ps}: {e.strerror}") from e
    return target

