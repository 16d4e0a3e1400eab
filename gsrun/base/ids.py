"""Slurm identifiers, checked in one place: job ids, user, node and
partition names. Pure. Every check is an ASCII ``fullmatch`` (no newline,
NUL, ``/``, ``..``, ``"²"``), so a checked value is a safe path component,
log tag and argument. Job ids are 32-bit; ``array=True`` also takes
``<job>_<task>``. User names may end in ``$`` (sssd).
"""

from __future__ import annotations

import re

from gsrun.base.errors import InputError

JOB_ID_RE = re.compile(r"[0-9]{1,10}")
USER_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?")
NODE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
PARTITION_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def is_digits(value: str, most: int | None = 10) -> bool:
    """``value`` is ``[0-9]{1,most}`` whole (``most`` None: any length): ASCII
    digits only (``str.isdigit`` alone takes ``"²"``, ``"٤"`` and ``"４２"``,
    which ``int`` refuses or reads as another number)."""
    return 0 < len(value) and (most is None or len(value) <= most) and value.isascii() and value.isdigit()


_JOB_HINT = "a Slurm job id is digits, e.g. 4242"
_ARRAY_HINT = "a Slurm job id is digits, e.g. 4242, or an array task, e.g. 4242_7"
_RAW_HINT = ("a Slurm job id is digits, e.g. 4242; for an array task use the raw job id "
             "($SLURM_JOB_ID or sacct JobIDRaw), not ARRAYID_TASK")


def _ok(pattern: re.Pattern, value) -> bool:
    return isinstance(value, str) and pattern.fullmatch(value) is not None


def is_job_id(value, *, array: bool = False) -> bool:
    """True when ``value`` is a str job id (``"4242"``; with ``array`` also
    ``"4242_7"``)."""
    if not isinstance(value, str):
        return False
    if array and "_" in value:
        job, _, task = value.partition("_")
        return is_digits(job) and is_digits(task)
    return is_digits(value)


def check_job_id(value, *, array: bool = False, phase: str = "input", what: str = "job id") -> str:
    """``value`` if it is a job id (see :func:`is_job_id`).

    Raises:
        InputError: ``gsrun: <phase>: bad <what>: <repr>``, e.g. a non-str,
            an empty string, a newline, non-ASCII digits, more than 10
            digits, or (without ``array``) an array task id.
    """
    if not is_job_id(value, array=array):
        hint = _ARRAY_HINT if array else (_RAW_HINT if is_job_id(value, array=True) else _JOB_HINT)
        raise InputError(phase, f"bad {what}", repr(value)[:80], hint=hint)
    return value


def is_user_name(value) -> bool:
    """True when ``value`` is a str user name (``alice``, ``j.doe``, ``host$``)."""
    return _ok(USER_NAME_RE, value)


UPPER = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
DIGITS = frozenset("0123456789")
ALNUM = UPPER | frozenset("abcdefghijklmnopqrstuvwxyz") | DIGITS


def is_chars(value: str, chars: frozenset, most: int | None = None) -> bool:
    """``value`` is 1 to ``most`` (None: any number of) characters, each in
    ``chars``: a ``[...]{1,most}`` character class."""
    return 0 < len(value) and (most is None or len(value) <= most) and chars.issuperset(value)


def is_node_name(value) -> bool:
    """True when ``value`` is a str Slurm node name (``gpu01``, ``gpu-node01.ib``)."""
    return _ok(NODE_NAME_RE, value)


def is_partition(value) -> bool:
    """True when ``value`` is a str Slurm partition name (``gpu``, ``h200_long``)."""
    return _ok(PARTITION_RE, value)

