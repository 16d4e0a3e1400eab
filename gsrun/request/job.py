"""What the job asked of the node, from the SPANK plugin (``SPANK_GS_*``) or,
without the plugin, from the job comment ``gsrun`` wrote (read once with
``scontrol``). Pure apart from :func:`comment_from_slurm`.

Trust: every ``SPANK_GS_*`` value and the job comment are written by the
user (a user can submit any ``spank_job_env`` with a modified client), so
they are *requests*, checked by their consumers' allow-lists. Whether the job
holds the node exclusively is a fact only slurmctld knows: it is taken from
the job record's ``OverSubscribe=NO`` alone (:func:`exclusive_from_record`),
never from ``SPANK_GS_EXCLUSIVE`` or ``exclusive=1`` in the comment, and a
record in which ``OverSubscribe=`` appears more than once (a job name or
comment containing `` OverSubscribe=NO``) counts as not exclusive.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

import os
import shutil

from gsrun.facts.jobenv import JobEnv
from gsrun.facts.slurm import DEFAULT_PATH, parse_comment_request, parse_job_record


@dataclass
class JobRequest:
    tune: str | None = None
    mps: str | None = None        # None: no MPS; "": default percentage; "50"
    mig: str | None = None
    bind: str | None = None
    report: str | None = None
    exclusive: bool | None = None  # None: not known (slurmctld not asked or did not answer)
    source: str = "none"
    exclusive_source: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    def needs_exclusivity(self) -> bool:
        """True when the answer matters: node tuning or a MIG layout asked."""
        return bool(self.tune or self.mig)


def request_from_spank(job: JobEnv) -> JobRequest | None:
    """The SPANK options of the job (``SPANK_GS_*``), or None without the
    plugin. ``exclusive`` stays None: it comes from the job record."""
    s = job.spank
    if not s:
        return None
    return JobRequest(tune=s.get("SPANK_GS_TUNE") or None,
                      mps=s.get("SPANK_GS_MPS") if "SPANK_GS_MPS" in s else None,
                      mig=s.get("SPANK_GS_MIG") or None, bind=s.get("SPANK_GS_BIND") or None,
                      report=s.get("SPANK_GS_REPORT") or None, exclusive=None, source="spank")


def exclusive_from_record(rec: dict[str, str] | None, line: str | None = None) -> bool | None:
    """``OverSubscribe=NO`` in the job record -> True; any other value ->
    False; no record -> None. ``line`` (the raw ``scontrol -o`` line) is
    checked for a second ``OverSubscribe=`` (forged in a user field): then
    False."""
    if rec is None:
        return None
    if line is not None and (len(re.findall(r"(?:^| )OverSubscribe=", line)) != 1 or "\n" in line.strip()):
        return False
    return rec.get("OverSubscribe", "").upper() == "NO"


def request_from_job_record(rec: dict[str, str], line: str | None = None) -> JobRequest:
    """From ``scontrol -o show job`` fields: ``Comment`` (gsrun's requests)
    and ``OverSubscribe=NO`` (the job holds its nodes exclusively)."""
    c = parse_comment_request(rec.get("Comment", ""))
    return JobRequest(tune=c.get("tune") or None, mps=c.get("mps") if "mps" in c else None,
                      mig=c.get("mig") or None, bind=c.get("bind"), report=c.get("report"),
                      exclusive=exclusive_from_record(rec, line), source="job comment",
                      exclusive_source="job record OverSubscribe")


def comment_from_slurm(job_id: str, timeout_s: float) -> dict[str, str] | None:
    """The job record, read once (bounded: ``scontrol`` and any children it
    has are killed at ``timeout_s``) -- None when slurmctld does not answer,
    or the answer is not this job's record. The raw line is kept
    under the key ``"__line__"`` for :func:`exclusive_from_record`."""
    from gsrun.base.proc import run_bounded   # kills the whole process group on timeout

    exe = shutil.which("scontrol", path=os.environ.get("PATH") or DEFAULT_PATH)
    if exe is None:
        return None
    try:
        rc, out, _err = run_bounded([exe, "-o", "show", "job", job_id], timeout_s)
    except OSError:
        return None
    if rc != 0 or not out.strip():
        return None
    rec = parse_job_record(out, job_id)   # one line, duplicated keys dropped
    if rec is None:
        return None
    rec["__line__"] = out.strip()
    return rec
