"""What the job asked of the node, from the SPANK plugin (``SPANK_GS_*``) or,
without the plugin, from the job comment ``gsrun`` wrote. Pure apart from
:func:`comment_from_slurm`.

Where the comment comes from, without asking slurmctld (:func:`comment_from_env`):
slurmd hands the prolog/epilog the job credential's fields, among them
``SLURM_JOB_COMMENT`` when the job has a comment (Slurm 22.05 and later: the
environment builder of slurmd's ``prep/script`` plugin; Debian 12's
``prep_script.so`` sets it beside ``SLURM_JOB_RESTART_COUNT``,
``SLURM_JOB_NTASKS`` and ``SLURM_JOB_STDOUT``, which the recorded
``shared/data/slurm-22.05/prolog_slurmd.env`` shows). So an environment with
``SLURM_JOB_RESTART_COUNT`` (always set from the credential) and no
``SLURM_JOB_COMMENT`` means "the job has no comment": no request, and no RPC.
Only an environment without the credential's fields (an older Slurm) makes the
prolog read the record with ``scontrol`` (:func:`comment_from_slurm`). The
user cannot plant either variable: slurmd drops a SPANK job environment with
names not starting ``SPANK_`` and sets these after it.

Trust: every ``SPANK_GS_*`` value and the job comment are written by the
user (a user can submit any ``spank_job_env`` with a modified client), so
they are *requests*, checked by their consumers' allow-lists. Whether the job
holds the node exclusively is a fact only slurmctld knows: it is taken from
the job record alone (:func:`exclusive_from_record`), never from
``SPANK_GS_EXCLUSIVE`` or ``exclusive=1`` in the comment.

What the record says, per release (``scontrol -o show job``; recorded shapes
in ``tests/data/slurm-records/``): Slurm 22.05 to 25.11 print one key,
``OverSubscribe=`` (``NO`` for ``--exclusive`` or a partition
``OverSubscribe=EXCLUSIVE``; ``OK`` for a default job; ``YES`` for
``--oversubscribe`` or a partition ``OverSubscribe=FORCE:n``; ``USER``,
``MCS``, ``TOPO`` for ``--exclusive=user|mcs|topo``). Slurm 26.05 prints
``OverSubscribe=NO|YES|OK Exclusive=NO|NODE|USER|MCS|TOPO``, and there
``OverSubscribe=NO`` is also what a default job on an ``OverSubscribe=NO``
partition gets: only ``Exclusive=`` says whether the node is the job's.
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
    """What the job asked (all str or None unless said): ``tune``; ``mps``
    (None: no MPS; ``""``: the default percentage; ``"50"``); ``mig``;
    ``bind``; ``report``; ``exclusive`` (bool; None: not known, slurmctld
    not asked or did not answer); ``source`` (str); ``exclusive_source``;
    ``comment_from`` (``"prolog environment"``: ``SLURM_JOB_COMMENT`` |
    ``"job record"``: scontrol); ``malloc`` (``gsrun --malloc``, job comment
    ``malloc=``: for the report only). Mutable: the prolog fills in
    ``exclusive`` and ``malloc`` as it learns them."""

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
        """The fields as a dict, in field order; ``malloc`` only when set (records before it had none)."""
        d = asdict(self)
        if d["malloc"] is None:
            del d["malloc"]
        return d

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


#: the record values that mean "the job holds its nodes for itself", per key;
#: ``Exclusive=`` (Slurm 26.05 and later) decides where it is printed
WHOLE_NODE_VALUES = {"Exclusive": ("NODE",), "OverSubscribe": ("NO",)}


def exclusive_from_record(rec: dict[str, str] | None, line: str | None = None) -> tuple[bool | None, str | None]:
    """Whether the job holds its nodes for itself, from its ``scontrol -o
    show job`` record (``rec``, :func:`gsrun.facts.slurm.parse_job_record`)
    and the raw line (``line``; default ``rec["__line__"]``) -> ``(exclusive,
    exclusive_source)``. Pure.

    - no record: ``(None, None)``;
    - the line has ``Exclusive=`` (Slurm 26.05 and later): ``NODE`` -> True,
      anything else -> False; source ``"job record Exclusive"``;
    - else ``OverSubscribe=NO`` -> True, anything else -> False; source
      ``"job record OverSubscribe"``.

    Only node exclusivity counts. ``USER`` and ``MCS`` let other jobs (of the
    same user, or the same MCS label) onto the node, and node-wide settings
    would change under them without their asking; ``TOPO`` does not by itself
    mean whole nodes (``--exclusive=topo`` sets no whole-node flag, and
    ``topology/flat`` has no segments): all three are False, like ``YES``/``OK``
    (a partition ``OverSubscribe=FORCE``, ``--oversubscribe``).

    Forged fields (user text such as a job name ``x Exclusive=NODE`` sits in
    the line, and :func:`parse_job_record` drops a duplicated key): False,
    source ``"job record (ambiguous)"``, without a line, or when it has a
    newline, ``OverSubscribe=`` other than once, ``Exclusive=`` more than once,
    or an ``Exclusive=`` that is not the key Slurm prints right after
    ``OverSubscribe=<value>``.
    """
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


#: set by slurmd from the job credential in every prolog/epilog environment that
#: also carries SLURM_JOB_COMMENT for a job with a comment (see the module doc)
CREDENTIAL_MARKER = "SLURM_JOB_RESTART_COUNT"


def comment_from_env(environ) -> str | None:
    """The job's comment from slurmd's prolog/epilog environment: the text of
    ``SLURM_JOB_COMMENT``; ``""`` when the environment carries the job
    credential's fields (``SLURM_JOB_RESTART_COUNT``) but no comment (the job
    has none); None when it cannot tell (no credential fields: an older Slurm),
    then only slurmctld's record knows."""
    comment = environ.get("SLURM_JOB_COMMENT")
    if comment is not None:
        return comment
    return "" if environ.get(CREDENTIAL_MARKER) is not None else None


def request_from_comment(comment: str, comment_from: str) -> JobRequest:
    """gsrun's requests in a job comment (``gsrun:tune=...;mps=...``, see
    :func:`gsrun.facts.slurm.parse_comment_request`); ``exclusive`` stays None
    (only the job record says it, :func:`exclusive_from_record`). ``source`` is ``"job
    comment"``, or ``"none"`` for a comment without gsrun's requests."""
    c = parse_comment_request(comment)
    return JobRequest(tune=c.get("tune") or None, mps=c.get("mps") if "mps" in c else None,
                      mig=c.get("mig") or None, bind=c.get("bind"), report=c.get("report"),
                      exclusive=None, source="job comment" if c else "none", comment_from=comment_from,
                      malloc=malloc_from_comment(comment))


def malloc_from_comment(comment: str | None) -> str | None:
    """The allocator ``gsrun --malloc`` recorded in the job comment
    (``gsrun:...;malloc=jemalloc``), allow-listed (:data:`gsrun.request.malloc.ALLOCATORS`);
    None when absent or not one of them. Only the report shows it: the job
    script does the preload."""
    v = parse_comment_request(comment or "").get("malloc")
    return v if v in ALLOCATORS else None


def request_from_job_record(rec: dict[str, str], line: str | None = None) -> JobRequest:
    """From ``scontrol -o show job`` fields: ``Comment`` (gsrun's requests)
    and whether the job holds its nodes exclusively (:func:`exclusive_from_record`)."""
    req = request_from_comment(rec.get("Comment", ""), "job record")
    req.source = "job comment"
    req.exclusive, req.exclusive_source = exclusive_from_record(rec, line)
    return req


def comment_from_slurm(job_id: str, timeout_s: float) -> dict[str, str] | None:
    """The job record, read once (bounded: ``scontrol`` and any children it
    has are killed at ``timeout_s``) -- None when slurmctld does not answer,
    or the answer is not this job's record. The raw line is kept
    under the key ``"__line__"`` for :func:`exclusive_from_record`."""
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
