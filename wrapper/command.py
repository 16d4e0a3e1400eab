"""What each task runs: the user's interpreter, SCRIPT / ``-m MODULE`` /
``-- CMD``, and the per-GPU launchers gsrun refuses as a CMD.

Decided at submit time on the submitting host: the job's nodes may have
another ``PATH``, so every interpreter is an absolute path here. Nothing
here reaches a shell: the argv is quoted by the template.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shutil import which

from gsrun.base.errors import InputError

# control characters -> "?" (a newline would end the script's comment line)
_CONTROL_TO_QMARK = {**{c: "?" for c in range(0x20)}, 0x7f: "?"}

# launchers that start one process per GPU themselves: as a gsrun CMD they would run N x N processes
_LAUNCHER_EXES = {"torchrun": "torchrun", "deepspeed": "deepspeed", "accelerate": "accelerate launch"}
_LAUNCHER_MODULES = {"torch.distributed.run": "torchrun", "torch.distributed.launch": "torchrun",
                     "deepspeed": "deepspeed", "deepspeed.launcher.runner": "deepspeed",
                     "accelerate.commands.launch": "accelerate launch",
                     "accelerate.commands.accelerate_cli": "accelerate launch"}


@dataclass(frozen=True, slots=True)
class Python:
    """The interpreter of a ``.py`` SCRIPT or ``-m MODULE``, and why; ``env``
    ``"venv"``/``"conda"`` for the active environment's (``prefix``, and
    ``conda`` = ``$CONDA_EXE`` to activate it in the job)."""

    path: str
    why: str
    env: str | None = None
    prefix: str | None = None
    conda: str | None = None

    def comment(self) -> str:
        """One comment line's text: no control characters (a newline would end the comment)."""
        return f"{self.path}: {self.why}".translate(_CONTROL_TO_QMARK)


def _abs_exe(name: str, path: str) -> str | None:
    """``name`` (a path, or a name looked up on ``path``) made absolute, when it is an executable file."""
    p = which(name, path=path)
    return os.path.abspath(p) if p else None


def choose_python(flag: str | None, environ: Mapping[str, str]) -> Python:
    """The interpreter ``python3`` would be here: ``--python``, else
    ``$GSRUN_PYTHON``, the active venv, the active conda env, ``PATH``,
    gsrun's own. Made absolute, symlinks kept (resolving loses the venv).

    Raises:
        InputError: ``--python`` / ``GSRUN_PYTHON`` names no executable.
    """
    for value, source in ((flag, "--python"), (environ.get("GSRUN_PYTHON"), "GSRUN_PYTHON")):
        if value:
            p = _abs_exe(value, environ.get("PATH", os.defpath))
            if p is None:
                raise InputError("submit", f"bad {source}", f"{value!r}: no such executable"[:120],
                                 hint="an interpreter path or a name on PATH, e.g. --python ~/venv/bin/python3")
            return Python(p, f"from {source}")
    skipped = []
    for var, what, env in (("VIRTUAL_ENV", "the active virtualenv", "venv"),
                           ("CONDA_PREFIX", "the active conda env", "conda")):
        prefix = environ.get(var)
        if prefix:
            bindir = os.path.join(prefix, "bin")
            p = _abs_exe("python3", bindir) or _abs_exe("python", bindir)
            if p:
                conda = environ.get("CONDA_EXE") if env == "conda" else None
                if conda and not (os.path.isabs(conda) and os.access(conda, os.X_OK)):
                    conda = None
                return Python(p, f"{what} (${var})", env, os.path.abspath(prefix), conda)
            skipped.append(f"${var} has no bin/python3")
    p = _abs_exe("python3", environ.get("PATH", os.defpath))
    if p:
        why = "the first python3 on PATH at submit"
        return Python(p, why + (f" ({'; '.join(skipped)})" if skipped else ""))
    return Python(sys.executable, "gsrun's own Python (no python3 on PATH at submit)")


def is_gsrun_own(python: str) -> bool:
    """``python`` is the interpreter of this gsrun installation (same bin directory as ``sys.prefix``)."""
    try:
        return os.path.realpath(os.path.dirname(python)) == os.path.realpath(os.path.join(sys.prefix, "bin"))
    except OSError:
        return False


def torch_warning(python: str) -> str | None:
    """A warning when ``python`` is gsrun's own installation and cannot import torch."""
    if not is_gsrun_own(python) or importlib.util.find_spec("torch") is not None:
        return None
    return (f"{python} is gsrun's own Python ({sys.prefix}) and cannot import torch; "
            "activate your environment before gsrun, or pass --python")


def launcher_in(argv: Sequence[str]) -> str | None:
    """The per-GPU launcher ``argv`` starts (``torchrun``, ``python -m
    torch.distributed.run``, ``accelerate launch``, ``deepspeed``), else None."""
    if not argv:
        return None
    exe = os.path.basename(argv[0])
    if exe in _LAUNCHER_EXES:
        if exe == "accelerate" and (len(argv) < 2 or argv[1] != "launch"):
            return None
        return _LAUNCHER_EXES[exe]
    if exe.startswith("python") and exe[6:].strip("0123456789.") == "":   # python, python3, python3.11
        rest = list(argv[1:])
        while rest and rest[0].startswith("-") and rest[0] != "-m":
            rest.pop(0)   # interpreter flags like -u, -X
        if len(rest) >= 2 and rest[0] == "-m":
            return _LAUNCHER_MODULES.get(rest[1])
        if rest and rest[0].startswith("-m") and len(rest[0]) > 2:
            return _LAUNCHER_MODULES.get(rest[0][2:])
    return None


def refuse_launcher(argv: Sequence[str], module: str | None = None) -> None:
    """A per-GPU launcher as what each GPU's task runs: N x N processes.

    Raises:
        InputError: naming the launcher, with ``--launcher torchrun`` as the hint.
    """
    found = _LAUNCHER_MODULES.get(module) if module else launcher_in(argv)
    if found:
        what = f"-m {module}" if module else " ".join(argv[:3])
        hint = ("gsrun --launcher torchrun --gpus N SCRIPT runs one torchrun per node "
                "(each worker still bound to its GPU)" if found == "torchrun" else
                f"{found} starts one process per GPU itself: run it with sbatch, "
                "or let gsrun start one task per GPU (gsrun --gpus N SCRIPT)")
        raise InputError("submit", f"{found} would start a process per GPU in every one of gsrun's "
                         "per-GPU tasks", what[:80], hint=hint)


def check_script(path: str) -> str:
    """The absolute path of a SCRIPT that exists and can be read.

    Raises:
        InputError: it does not exist, is not a file, or cannot be read.
    """
    ap = os.path.abspath(path)
    if not os.path.exists(ap):
        raise InputError("submit", "no such script", repr(path)[:200],
                         hint="check the path; it is relative to the directory you run gsrun in")
    if not os.path.isfile(ap):
        raise InputError("submit", "not a file", repr(path)[:200], hint="SCRIPT is a file to run")
    if not os.access(ap, os.R_OK):
        raise InputError("submit", "script not readable", repr(path)[:200], hint=f"chmod u+r {path}")
    return ap


def build_command(mode: str, words: Sequence[str], python: Python | None, module: str | None = None) -> tuple[str, ...]:
    """The argv each worker runs (after ``gsrun-bind --``) for ``mode``
    ``script``, ``module`` (``python -m``) or ``cmd`` (as given).

    Raises:
        InputError: a missing or unreadable script, nothing to run.
    """
    if mode == "module":
        assert python is not None and module
        return (python.path, "-m", module, *words)
    if not words:
        raise InputError("submit", "nothing to run", "no SCRIPT, -m MODULE or -- CMD",
                         hint="gsrun --gpus N SCRIPT [ARGS], gsrun --gpus N -m MODULE, gsrun --gpus N -- CMD")
    first, args = words[0], tuple(words[1:])
    if mode == "cmd":
        return (os.path.abspath(first) if os.sep in first else first, *args)
    if first.endswith(".py"):
        assert python is not None
        return (python.path, check_script(first), *args)
    if os.sep in first or os.path.exists(first):
        ap = check_script(first)
        if not os.access(ap, os.X_OK):
            raise InputError("submit", "script not executable", repr(first)[:200],
                             hint=f"chmod +x {first}, or name its interpreter: gsrun ... -- bash {first}")
        return (ap, *args)
    return (first, *args)
