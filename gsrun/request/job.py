"""What the job asked of the node, from the SPANK plugin (``SPANK_GS_*``) or,
without it, from the job comment ``gsrun`` wrote. Pure apart from
:func:`comment_from_slurm`.

The comment needs no RPC where slurmd gives the prolog the credential's
fields (Slurm 22.05+ ``prep/script``; ``shared/data/slurm-22.05/prolog_slurmd.env``):
``SLURM_JOB_RESTART_COUNT`` without ``SLURM_JOB_COMMENT`` means no comment.
Users cannot plant either (slurmd keeps only ``SPANK_*`` from the job).

Trust: ``SPANK_GS_*`` and the comment are user *requests*, checked by their
consumers' allow-lists. Node exclusivity comes from the job record alone
(:func:`exclusive_from_record`; ``tests/data/slurm-records/``): Slurm 22.05
to 25.11 print ``OverSubscribe=`` (``NO`` for ``--exclusive``), 26.05 adds
``Exclusive=NODE|USER|MCS|TOPO``, where ``OverSubscribe=NO`` alone no longer
means a whole node.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import asdict, dataclass

from gsrun.base.proc import run_bounded
from gsrun.facts.jobenv import JobEnv
from gsrun.facts.slurm import DEFAULT_PATH, job_record_argv, parse_comment_request, parse_job_record
from gsrun.request.malloc import ALLOCATORS


@dataclass(slots=True)
class JobRequest:
    """What the job asked: ``mps`` None: no MPS, ``""``: the default
    percentage; ``exclusive`` None: not known; ``comment_from``
    ``"prolog environment"`` or ``"job record"``; ``malloc`` for the report
    only. The prolog fills in ``exclusive`` and ``malloc`` as it learns them."""

    tune: str | None = None
    mps: str | None = None
    mig: str | None = None
    bind: str | None = None
    report: str | None = None
    exclusive: bool | None = None
    source: str = "none"
    exclusive_source: str | None = None
    comment_from: str | None = None
    malloc: str | None = None

    def to_dict(self) -> dict:
        """The fields in order; ``malloc`` only when set (older records had none)."""
        d = asdict(self)
        if d["malloc"] is None:
            del d["malloc"]
        return d

    def needs_exclusivity(self) -> bool:
        return bool(self.tune or self.mig)


def request_from_spank(job: JobEnv) -> JobRequest | None:
    """The job's ``SPANK_GS_*`` options, or None without the plugin."""
    s = job.spank
    if not s:
        return None
    return JobRequest(tune=s.get("SPANK_GS_TUNE") or None,
                      mps=s.get("SPANK_GS_MPS") if "SPANK_GS_MPS" in s else None,
                      mig=s.get("SPANK_GS_MIG") or None, bind=s.get("SPANK_GS_BIND") or None,
                      report=s.get("SPANK_GS_REPORT") or None, exclusive=None, source="spank")


#: record values meaning "the job holds its nodes", per key (``Exclusive=`` decides where printed)
WHOLE_NODE_VALUES = {"Exclusive": ("NODE",), "OverSubscribe": ("NO",)}


def exclusive_from_record(rec: dict[str, str] | None, line: str | None = None) -> tuple[bool | None, str | None]:
    """``(exclusive, exclusive_source)`` from the job record ``rec`` and its
    raw ``line`` (default ``rec["__line__"]``): ``Exclusive=NODE`` where
    printed, else ``OverSubscribe=NO``; ``(None, None)`` without a record.
    ``USER``, ``MCS`` and ``TOPO`` are False (other jobs may share the node).
    A possibly forged line (a job name ``x Exclusive=NODE``: a newline, a key
    not exactly once, ``Exclusive=`` not right after ``OverSubscribe=``) is
    ``(False, "job record (ambiguous)")``."""
    if rec is None:
        return None, None
    if line is None:
        line = rec.get("__line__")
    if line is None:    # duplicated keys were dropped from rec: nothing to check them against
        return False, "job record (ambiguous)"
    line = line.strip()
    over = re.findall(r"(?:^| )OverSubscribe=", line)
    excl = re.findall(r"(?:^| )Exclusive=", line)
    paired = re.search(r"(?:^| )OverSubscribe=[^ ]* Exclusive=", line)
    if "\n" in line or len(over) != 1 or len(excl) > 1 or (excl and not paired):
        return False, "job record (ambiguous)"
    key = "Exclusive" if excl else "OverSubscribe"
    return rec.get(key, "").upper() in WHOLE_NODE_VALUES[key], f"job record {key}"


#: set by slurmd from the credential where SLURM_JOB_COMMENT is too (module doc)
CREDENTIAL_MARKER = "SLURM_JOB_RESTART_COUNT"


def comment_from_env(environ) -> str | None:
    """``SLURM_JOB_COMMENT``; ``""`` when the credential's fields say there is
    none; None when it cannot tell (an older Slurm: ask slurmctld)."""
    comment = environ.get("SLURM_JOB_COMMENT")
    if comment is not None:
        return comment
    return "" if environ.get(CREDENTIAL_MARKER) is not None else None


def request_from_comment(comment: str, comment_from: str) -> JobRequest:
    """gsrun's requests in a job comment; ``source`` ``"none"`` without any."""
    c = parse_comment_request(comment)
    return JobRequest(tune=c.get("tune") or None, mps=c.get("mps") if "mps" in c else None,
                      mig=c.get("mig") or None, bind=c.get("bind"), report=c.get("report"),
                      exclusive=None, source="job comment" if c else "none", comment_from=comment_from,
                      malloc=malloc_from_comment(comment))


def malloc_from_comment(comment: str | None) -> str | None:
    """The allocator ``gsrun --malloc`` recorded in the comment, if one of
    :data:`gsrun.request.malloc.ALLOCATORS` (for the report only)."""
    v = parse_comment_request(comment or "").get("malloc")
    return v if v in ALLOCATORS else None


def request_from_job_record(rec: dict[str, str], line: str | None = None) -> JobRequest:
    """From the job record: ``Comment`` and :func:`exclusive_from_record`."""
    req = request_from_comment(rec.get("Comment", ""), "job record")
    req.source = "job comment"
    req.exclusive, req.exclusive_source = exclusive_from_record(rec, line)
    return req


def comment_from_slurm(job_id: str, timeout_s: float) -> dict[str, str] | None:
    """The job record (``scontrol`` killed at ``timeout_s``), raw line under
    ``"__line__"``; None when slurmctld does not answer or not this job's."""
    exe = shutil.which("scontrol", path=os.environ.get("PATH") or DEFAULT_PATH)
    if exe is None:
        return None
    try:
        rc, out, _err = run_bounded(job_record_argv(job_id, exe), timeout_s)
    except OSError:
        return None
    if rc != 0 or not out.strip():
        return None
    rec = parse_job_record(out, job_id)   # one line, duplicated keys dropped
    if rec is None:
        return None
    rec["__line__"] = out.strip()
    return rec
