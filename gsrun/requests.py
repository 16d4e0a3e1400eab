"""What the job asked of the node, from the SPANK plugin (``SPANK_GS_*``) or,
without the plugin, from the job comment ``gsrun`` wrote (read once with
``scontrol``). Pure apart from :func:`comment_from_slurm`."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .jobenv import JobEnv
from .slurm import parse_comment_request, parse_oneliner, run_slurm


@dataclass
class JobRequest:
    tune: str | None = None
    mps: str | None = None        # None: no MPS; "": default percentage; "50"
    mig: str | None = None
    bind: str | None = None
    report: str | None = None
    exclusive: bool | None = None
    source: str = "none"

    def to_dict(self) -> dict:
        return asdict(self)


def request_from_spank(job: JobEnv) -> JobRequest | None:
    s = job.spank
    if not s:
        return None
    return JobRequest(tune=s.get("SPANK_GS_TUNE") or None,
                      mps=s.get("SPANK_GS_MPS") if "SPANK_GS_MPS" in s else None,
                      mig=s.get("SPANK_GS_MIG") or None, bind=s.get("SPANK_GS_BIND") or None,
                      report=s.get("SPANK_GS_REPORT") or None,
                      exclusive=(s.get("SPANK_GS_EXCLUSIVE") == "1") if "SPANK_GS_EXCLUSIVE" in s else None,
                      source="spank")


def request_from_job_record(rec: dict[str, str]) -> JobRequest:
    """From ``scontrol -o show job`` fields: ``Comment`` (gsrun's requests)
    and ``OverSubscribe=NO`` (the job holds its nodes exclusively)."""
    c = parse_comment_request(rec.get("Comment", ""))
    excl = rec.get("OverSubscribe", "").upper() == "NO" or c.get("exclusive") == "1"
    return JobRequest(tune=c.get("tune") or None, mps=c.get("mps") if "mps" in c else None,
                      mig=c.get("mig") or None, bind=c.get("bind"), report=c.get("report"),
                      exclusive=excl, source="job comment")


def comment_from_slurm(job_id: str, timeout_s: float) -> dict[str, str] | None:
    """The job record, read once (bounded) -- None when slurmctld does not answer."""
    try:
        cp = run_slurm(["scontrol", "-o", "show", "job", job_id], timeout_s, check=False)
    except Exception:  # noqa: BLE001 - the prolog goes on with defaults
        return None
    if cp.returncode != 0 or not cp.stdout.strip():
        return None
    return parse_oneliner(cp.stdout.splitlines()[0])
