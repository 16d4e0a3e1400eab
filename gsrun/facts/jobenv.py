"""The job context as slurmd hands it to the prolog/epilog, validated. Pure.

Source: the hooks' environment (``shared/data/slurm-22.05/prolog_slurmd.env``):
``SLURM_JOB_ID``/``UID``/``GID``/``USER``, ``SLURMD_NODENAME``,
``SLURM_JOB_PARTITION``, ``SLURM_JOB_GPUS`` (gres indices = minor numbers),
the node list, ``SLURM_JOB_CPUS_PER_NODE`` and ``SPANK_GS_*``. Each value is
matched whole against an allow-list (ASCII digits only; expanding lists
bounded first); a bad one is an InputError naming the variable with the
value's ``repr`` cut at 80 characters.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from gsrun.base.errors import InputError
from gsrun.base.ids import check_job_id, is_digits, is_node_name, is_partition, is_user_name
from gsrun.facts.slurm import expand_hostlist, parse_tasks_per_node

SPANK_KEYS = ("SPANK_GS_MPS", "SPANK_GS_MIG", "SPANK_GS_TUNE", "SPANK_GS_BIND", "SPANK_GS_REPORT",
              "SPANK_GS_EXCLUSIVE")
# character sets of the allow-lists, checked with str methods (no regex on the hooks' path):
# ``not value.strip(chars)`` is true exactly when every character of value is in chars
_SPANK_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.,=+:-"   # [A-Za-z0-9_.,=+:-]
_NODELIST_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._,[]-"  # [A-Za-z0-9._,\[\]-]
MAX_NODES = 65536          # longest hostlist / cpus-per-node list accepted
MAX_ENV_LEN = 65536


@dataclass(frozen=True, slots=True)
class JobEnv:
    """The validated job context. ``job_id`` str; ``uid``/``gid`` int;
    ``user``, ``node`` str; ``partition`` str or None; ``gpus``: gres indices
    on this node (list of int), None = unknown (never "all"); ``nodelist``:
    node names; ``cpus_per_node``: CPUs per node of ``nodelist`` (list of
    int); ``cpus_on_node``: int or None; ``spank``: ``SPANK_GS_*`` name ->
    value; ``context``: ``SLURM_SCRIPT_CONTEXT`` or None."""

    job_id: str
    uid: int
    gid: int
    user: str
    node: str
    partition: str | None
    gpus: list[int] | None
    nodelist: list[str]
    cpus_per_node: list[int]
    cpus_on_node: int | None
    spank: dict[str, str] = field(default_factory=dict)
    context: str | None = None

    def to_dict(self) -> dict:
        """The fields as a dict (lists and the ``spank`` dict copied), in field order."""
        return asdict(self)


def is_spank_value(value: str) -> bool:
    """True when ``value`` passes the allow-list of a ``SPANK_GS_*`` value:
    ``[A-Za-z0-9_.,=+:-]{0,512}``, whole."""
    return len(value) <= 512 and not value.strip(_SPANK_CHARS)


def _need(env: Mapping[str, str], name: str) -> str:
    v = env.get(name)
    if v is None or v == "":
        raise InputError("env", f"{name} missing", "slurmd did not set it",
                         hint="run this as Slurm's Prolog/Epilog, or set the variable by hand for a test")
    return v


def _int(env, name, lo=0, hi=2**32 - 1) -> int:
    v = _need(env, name)
    if not is_digits(v) or not lo <= int(v) <= hi:
        raise InputError("env", f"bad {name}", repr(v)[:80])
    return int(v)


def parse_gpu_indices(value: str | None) -> list[int] | None:
    """``SLURM_JOB_GPUS`` (``0,1,3``; Slurm may also write ranges ``0-3``) ->
    indices. None/absent -> None ("unknown", never "all GPUs": field case 9,
    docs/field-cases.md);
    empty -> []."""
    if value is None:
        return None
    if value.strip("0123456789, -"):         # [0-9, -]*
        raise InputError("env", "bad SLURM_JOB_GPUS", repr(value)[:80],
                         hint="expected gres indices like 0,1 (not UUIDs)")
    value = value.strip()
    if not value:
        return []
    if len(value) > 4096:
        raise InputError("env", "bad SLURM_JOB_GPUS", repr(value)[:80], hint="longer than 4096 characters")
    out: list[int] = []
    for tok in value.split(","):
        first, dash, last = tok.strip().partition("-")          # ([0-9]{1,4})(?:-([0-9]{1,4}))?
        if not is_digits(first, 4) or (dash and not is_digits(last, 4)):
            raise InputError("env", "bad SLURM_JOB_GPUS", repr(value)[:80],
                             hint="expected gres indices like 0,1 (not UUIDs)")
        a = int(first)
        b = int(last) if dash else a
        if b < a:
            raise InputError("env", "bad SLURM_JOB_GPUS", repr(value)[:80])
        out.extend(range(a, b + 1))
    return sorted(set(out))


def job_from_env(env: Mapping[str, str]) -> JobEnv:
    """Validate slurmd's prolog/epilog environment into a :class:`JobEnv`.

    Raises:
        InputError: a missing or malformed variable (named in the message).
    """
    job_id = check_job_id(_need(env, "SLURM_JOB_ID"), phase="env", what="SLURM_JOB_ID")
    uid = _int(env, "SLURM_JOB_UID")
    gid = _int(env, "SLURM_JOB_GID") if env.get("SLURM_JOB_GID") else uid
    user = env.get("SLURM_JOB_USER") or str(uid)
    if not is_user_name(user) and not is_digits(user):
        raise InputError("env", "bad SLURM_JOB_USER", repr(user)[:80])
    node = env.get("SLURMD_NODENAME") or ""
    if not is_node_name(node):
        raise InputError("env", "bad SLURMD_NODENAME", repr(node)[:80])
    partition = env.get("SLURM_JOB_PARTITION") or None
    if partition is not None and not is_partition(partition):
        raise InputError("env", "bad SLURM_JOB_PARTITION", repr(partition)[:80])
    nl_text = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or node
    if len(nl_text) > MAX_ENV_LEN or not nl_text or nl_text.strip(_NODELIST_CHARS) \
            or hostlist_size_bound(nl_text) > MAX_NODES:
        raise InputError("env", "bad SLURM_JOB_NODELIST", repr(nl_text)[:80])
    try:
        nodelist = expand_hostlist(nl_text)
    except InputError as e:
        raise InputError("env", "bad SLURM_JOB_NODELIST", f"{repr(nl_text)[:80]}: {e.what}") from None
    cpn_text = env.get("SLURM_JOB_CPUS_PER_NODE", "")
    if len(cpn_text) > MAX_ENV_LEN or cpn_text.strip("0123456789,()x") \
            or _repeat_total(cpn_text) > MAX_NODES:
        raise InputError("env", "bad SLURM_JOB_CPUS_PER_NODE", repr(cpn_text)[:80])
    try:
        cpn = parse_tasks_per_node(cpn_text)
    except InputError:
        raise InputError("env", "bad SLURM_JOB_CPUS_PER_NODE", repr(cpn_text)[:80]) from None
    cpus_on_node = None
    if cpn:
        if node in nodelist and len(cpn) == len(nodelist):
            cpus_on_node = cpn[nodelist.index(node)]
        elif len(set(cpn)) == 1:
            cpus_on_node = cpn[0]
    spank: dict[str, str] = {}
    for k in SPANK_KEYS:
        if k in env:
            v = env[k]
            if not is_spank_value(v):
                raise InputError("env", f"bad {k}", repr(v)[:80], hint="gsrun's SPANK options allow [A-Za-z0-9_.,=+:-]")
            spank[k] = v
    return JobEnv(job_id, uid, gid, user, node, partition, parse_gpu_indices(env.get("SLURM_JOB_GPUS")),
                  nodelist, cpn, cpus_on_node, spank, env.get("SLURM_SCRIPT_CONTEXT"))


_TOP_COMMA_RE = re.compile(r",(?![^\[]*\])")      # a comma outside brackets
_BRACKETS_RE = re.compile(r"\[([^\]]*)\]")
_RANGE_RE = re.compile(r"([0-9]{1,12})-([0-9]{1,12})")
_REPEAT_RE = re.compile(r"\(x([0-9]{1,12})\)|(?:^|,)[^,(]*(?=,|\Z)")     # 4(x2): 2 entries; 1: one


def hostlist_size_bound(text: str) -> int:
    """An upper bound of the names ``text`` expands to (each top-level item
    counts the product of its bracket ranges), computed without expanding,
    so ``n[0-99999],n[0-99999],...`` is refused before it costs memory.
    Malformed input counts as 1 per item (the parser reports it)."""
    if "[" not in text and "]" not in text:     # one name per item
        n = text.count(",") + 1
        return n if n <= MAX_NODES else MAX_NODES + 1

    total = 0
    for item in _TOP_COMMA_RE.split(text):
        n = 1
        for group in _BRACKETS_RE.findall(item):
            count = 0
            for r in group.split(","):
                m = _RANGE_RE.fullmatch(r)
                count += (int(m.group(2)) - int(m.group(1)) + 1) if m and int(m.group(2)) >= int(m.group(1)) else 1
            n *= max(count, 1)
        total += n
        if total > MAX_NODES:
            return total
    return total


def _repeat_total(text: str) -> int:
    """Entries ``4(x2),1`` expands to (``SLURM_JOB_CPUS_PER_NODE`` form), unexpanded."""
    if "(" not in (text or ""):                 # one entry per item
        return (text or "").count(",") + 1

    total = 0
    for m in _REPEAT_RE.finditer(text or ""):
        total += int(m.group(1)) if m.group(1) else 1
    return total
