"""JobSpec -> sbatch script text. Pure: no I/O but reading the template.

Every user value passes through the ``sh`` filter (:func:`shlex.quote`);
``#SBATCH`` values are allow-listed by :func:`gsrun.wrapper.spec.validate_fields`
and again by :func:`check_spec`, since a newline in an unquoted value would
start a new script line.
"""

from __future__ import annotations

import re
import shlex

from gsrun.base.errors import InputError
from gsrun.base.templating import render
from gsrun.request.malloc import ALLOCATORS, check_conf_list, check_lib_dirs, check_tcmalloc_env
from gsrun.wrapper.spec import (SBATCH_OPT_RE, SITE_OPTIONS, JobSpec, check_comment, check_text, has_control,
                                parse_sbatch_option, sbatch_word, validate_fields, validate_site)


def _env_name(name: str) -> bool:
    """``[A-Za-z_][A-Za-z0-9_]{0,127}`` (an ASCII identifier is exactly that)."""
    return len(name) <= 128 and name.isascii() and name.isidentifier()


def check_spec(spec: JobSpec) -> None:
    """Everything rendered unquoted is re-checked (defence in depth).

    Raises:
        InputError: naming the field and the value.
    """
    validate_fields(spec.job_name, spec.partition, spec.time, spec.mail_type, spec.mail_user)
    if spec.output is not None and (not spec.output or len(spec.output) > 4096 or has_control(spec.output)
                                    or any(c.isspace() for c in spec.output)
                                    or any(0xd800 <= ord(c) <= 0xdfff for c in spec.output)):
        # an #SBATCH line cannot quote: a space would start another sbatch option
        raise InputError("submit", "bad --output", repr(spec.output)[:80],
                         hint="a path without spaces or control characters (Slurm patterns like %j are fine)")
    for what, pairs in (("NCCL environment", spec.nccl_env), ("environment", spec.extra_env)):
        for name, _value in pairs:
            if not isinstance(name, str) or not _env_name(name):
                raise InputError("submit", f"bad {what} name", repr(name)[:80], hint="letters, digits and _ only")
    c = spec.comment()
    if c is not None and (has_control(c) or " " in c):
        raise InputError("submit", "bad request value", repr(c)[:80])
    if spec.user_comment is not None:
        check_comment(spec.user_comment)
    validate_site({k: getattr(spec, k) for k in SITE_OPTIONS})
    for name, value in spec.sbatch_options:
        parse_sbatch_option(f"--{name}" if value is None else f"--{name}={value}")
        if not re.match(SBATCH_OPT_RE, f"--{name}"):
            raise InputError("submit", "bad --sbatch", repr(name)[:80])
    if spec.python_why is not None:
        check_text("python comment", spec.python_why, 8192)
    if spec.python_env not in (None, "venv", "conda") or (spec.python_env and not (spec.python and spec.python_prefix)):
        raise InputError("submit", "bad python environment", repr((spec.python_env, spec.python_prefix))[:80])
    for value in (spec.python, spec.python_prefix, spec.conda_exe):
        if value is not None and ("\0" in value or not value.startswith("/")):
            raise InputError("submit", "bad interpreter path", repr(value)[:80], hint="an absolute path")
    _check_malloc(spec)
    if spec.launcher not in (None, "torchrun"):
        raise InputError("submit", "bad --launcher", repr(spec.launcher)[:40], hint="torchrun")
    if spec.launcher and not spec.python:
        raise InputError("submit", "no interpreter for the launcher", "--launcher torchrun",
                         hint="pass --python")


def _check_malloc(spec: JobSpec) -> None:
    """The allocator fields against :mod:`gsrun.request.malloc`'s allow-lists.

    Raises:
        InputError: an unknown allocator, a bad library directory, tuning value or name.
    """
    if spec.malloc is not None and spec.malloc not in ALLOCATORS:
        raise InputError("submit", "bad --malloc", repr(spec.malloc)[:40], hint="jemalloc, tcmalloc or none")
    problem = check_lib_dirs(spec.malloc_lib_dirs)
    if problem:
        raise InputError("submit", "bad malloc.lib_dirs", problem)
    for name, value in spec.malloc_env:
        ok = (name == "MALLOC_CONF" and spec.malloc == "jemalloc" and not check_conf_list(value)) or \
             (spec.malloc == "tcmalloc" and not check_tcmalloc_env({name: value}))
        if not ok:
            raise InputError("submit", "bad allocator environment", repr((name, value))[:80])
    if spec.cuda_alloc_conf is not None and (not spec.cuda_alloc_conf or check_conf_list(spec.cuda_alloc_conf)):
        raise InputError("submit", "bad PYTORCH_CUDA_ALLOC_CONF", repr(spec.cuda_alloc_conf)[:80],
                         hint="key:value[,key:value...], e.g. expandable_segments:True")


def render_script(spec: JobSpec) -> str:
    """The sbatch script for ``spec`` (bash). Passes ``bash -n``.

    Raises:
        InputError: a value that would break out of its line (see :func:`check_spec`).
    """
    check_spec(spec)
    site = [f"--{name}" if value is None else f"--{name}={sbatch_word(value)}"
            for name, value in spec.site_lines()]
    return render("sbatch.sh.j2", spec=spec, command=" ".join(shlex.quote(a) for a in spec.command),
                  job_name=sbatch_word(spec.job_name), site_lines=site,
                  comment=sbatch_word(spec.job_comment()) if spec.user_comment else spec.comment())
