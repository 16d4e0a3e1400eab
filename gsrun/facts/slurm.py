"""Slurm through its commands: only :func:`run_slurm` starts processes (a
timeout, list arguments, no shell); the rest parses recorded-testable text."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence

from gsrun.base.errors import InputError, SlurmError
from gsrun.base.ids import check_job_id, is_digits
from gsrun.base.proc import SAFE_PATH, run_bounded

MAX_HOSTS = 100000
DEFAULT_PATH = SAFE_PATH        # slurmd/slurmctld run hooks with an almost empty environment (no PATH)

#: Final base states (squeue(1) "JOB STATE CODES"; slurm.h JOB_COMPLETE .. JOB_OOM).
TERMINAL_STATES = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                             "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"})
#: Final states that mean the job failed (what ``--mail-type=FAIL`` is for).
FAILED_STATES = frozenset({"FAILED", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"})
#: Not final: waiting to (re)start ...
PENDING_STATES = frozenset({"PENDING", "RESV_DEL_HOLD"})
REQUEUE_STATES = frozenset({"REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD"})
#: ... or holding its allocation.
RUNNING_STATES = frozenset({"RUNNING", "SUSPENDED", "STOPPED", "COMPLETING", "CONFIGURING", "RESIZING",
                            "STAGE_OUT", "SIGNALING", "REQUEUE_CRON"})
ACTIVE_STATES = PENDING_STATES | REQUEUE_STATES | RUNNING_STATES
#: Ended here but not final: held for an admin (SPECIAL_EXIT) or run on another cluster (REVOKED).
ENDED_HELD_STATES = frozenset({"SPECIAL_EXIT", "REVOKED"})


def run_slurm(argv: Sequence[str], timeout_s: float = 15.0, env: Mapping[str, str] | None = None,
              input_text: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run a Slurm command.

    Raises:
        SlurmError: the command is not installed, timed out (slurmctld
            unreachable or wedged), or exited non-zero with ``check``.
    """
    path = (env or {}).get("PATH") or os.environ.get("PATH") or DEFAULT_PATH
    exe = shutil.which(argv[0], path=path)
    if exe is None:
        raise SlurmError("slurm", f"{argv[0]} not found", "Slurm client commands are not on PATH",
                         hint="install slurm-client or put Slurm's bin directory on PATH")
    rc, out, err = run_bounded([exe, *argv[1:]], timeout_s, input_text=input_text, env=env)
    if rc is None:
        raise SlurmError("slurm", f"{argv[0]} timed out", f"no answer in {timeout_s:g} s",
                         hint="is slurmctld up? check SLURM_CONF")
    cp = subprocess.CompletedProcess([exe, *argv[1:]], rc, out, err)
    if check and cp.returncode != 0:
        msg = (cp.stderr or cp.stdout).strip().splitlines()
        raise SlurmError("slurm", f"{argv[0]} failed", msg[-1] if msg else f"exit {cp.returncode}")
    return cp


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist (``gpu[01-03,07],login1``), zero padding kept.

    Raises:
        InputError: unbalanced brackets or a bad range.
    """
    if len(expr) > 65536:
        raise InputError("slurm", "hostlist too long", f"{len(expr)} characters")
    out: list[str] = []
    for item in _split_top(expr.strip()):
        if not item:
            continue
        out.extend(_expand_one(item))
    return out


def compress_hostlist(names) -> str:
    """The inverse of :func:`expand_hostlist`, sorted, duplicates dropped."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    for n in sorted(set(names)):
        m = re.fullmatch(r"(.*?)([0-9]+)", n)
        if m:
            groups.setdefault((m.group(1), len(m.group(2))), []).append(int(m.group(2)))
        else:
            plain.append(n)
    out = []
    for (prefix, width), nums in sorted(groups.items()):
        nums = sorted(set(nums))
        if len(nums) == 1:
            out.append(f"{prefix}{nums[0]:0{width}d}")
            continue
        runs, lo = [], nums[0]
        for a, b in zip(nums, nums[1:] + [None]):
            if b != a + 1:
                runs.append(f"{lo:0{width}d}" if lo == a else f"{lo:0{width}d}-{a:0{width}d}")
                lo = b
        out.append(f"{prefix}[{','.join(runs)}]")
    return ",".join(sorted(out + plain))


def _split_top(expr: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise InputError("slurm", "bad hostlist", repr(expr))
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise InputError("slurm", "bad hostlist", repr(expr))
    parts.append(cur)
    return parts


_BRACKET_ITEM_RE = re.compile(r"^([^\[]*)\[([^\]]+)\](.*)\Z")       # prefix[ranges]rest
_TASKS_RE = re.compile(r"([0-9]{1,10})(?:\(x([0-9]{1,10})\))?")      # N, or N(xR): R nodes
_COMMENT_REQUEST_RE = re.compile(r"(?:^|\s)gsrun:(\S+)")


def _expand_one(item: str) -> list[str]:
    if "[" not in item:
        return [item]
    m = _BRACKET_ITEM_RE.match(item)
    if not m:
        return [item]
    prefix, ranges, rest = m.groups()
    tails = _expand_one(rest) if rest else [""]
    out = []
    for r in ranges.split(","):
        if "-" in r:
            a, b = r.split("-", 1)
            if not (a.isdigit() and b.isdigit()) or int(b) < int(a) or int(b) - int(a) > 100000:
                raise InputError("slurm", "bad hostlist range", repr(item))
            width = len(a)
            nums = [str(i).zfill(width) for i in range(int(a), int(b) + 1)]
        else:
            if not r.isdigit():
                raise InputError("slurm", "bad hostlist range", repr(item))
            nums = [r]
        for n in nums:
            for t in tails:
                out.append(f"{prefix}{n}{t}")
            if len(out) > MAX_HOSTS:
                raise InputError("slurm", "hostlist too large", f"more than {MAX_HOSTS} hosts in {item[:80]!r}")
    return out


def parse_tasks_per_node(text: str) -> list[int]:
    """``SLURM_TASKS_PER_NODE`` / ``SLURM_JOB_CPUS_PER_NODE`` form
    (``4(x2),1``) -> ``[4, 4, 1]``."""
    out: list[int] = []
    for tok in (text or "").split(","):
        tok = tok.strip()
        if not tok:
            continue
        m = _TASKS_RE.fullmatch(tok)
        if not m:
            raise InputError("slurm", "bad tasks-per-node value", repr(text))
        reps = int(m[2] or 1)
        if len(out) + reps > MAX_HOSTS:
            raise InputError("slurm", "tasks-per-node value too large", repr(text)[:80])
        out += [int(m[1])] * reps
    return out


def parse_oneliner(text: str) -> dict[str, str]:
    """``scontrol -o show job``/``node`` line -> ``{Key: value}``; values may
    hold spaces: a key starts at a space followed by ``Name=``."""
    text = text.strip()
    out: dict[str, str] = {}
    pos = [m.start() for m in re.finditer(r"(?:^| )([A-Za-z][A-Za-z0-9_:/]*)=", text)]
    for i, p in enumerate(pos):
        seg = text[p:pos[i + 1]] if i + 1 < len(pos) else text[p:]
        seg = seg.strip()
        k, _, v = seg.partition("=")
        out.setdefault(k, v)
    return out


def parse_job_record(text: str, job_id: str) -> dict[str, str] | None:
    """``scontrol -o show job ID`` output -> the fields a user's text (a job
    named ``x OverSubscribe=NO``) cannot forge: ONE line starting
    ``JobId=<job_id> `` (else None), keys seen twice dropped."""
    lines = [ln for ln in (text or "").splitlines() if ln.strip()]
    if len(lines) != 1 or not lines[0].startswith(f"JobId={job_id} "):
        return None
    line = lines[0].strip()
    keys = re.findall(r"(?:^| )([A-Za-z][A-Za-z0-9_:/]*)=", line)
    dup = {k for k in keys if keys.count(k) > 1}
    return {k: v for k, v in parse_oneliner(line).items() if k not in dup}


#: ``squeue -O`` fields of the idle-cancel exemptions, each unpadded and ``|``-ended:
#: none holds user free text (an unenforced account's ``|`` makes it unparsable).
EXEMPTION_FIELDS = ("JobID", "Partition", "QOS", "UserName", "Account", "BatchFlag")


def exemption_argv(job_id: str) -> list[str]:
    """``squeue -h -j ID -O JobID:0|,Partition:0|,...`` (:data:`EXEMPTION_FIELDS`)."""
    return ["squeue", "-h", "-j", check_job_id(job_id, array=True), "-O",
            ",".join(f"{f}:0|" for f in EXEMPTION_FIELDS)]


def parse_exemption_record(text: str, job_id: str) -> dict | None:
    """:func:`exemption_argv`'s output -> ``{"partition", "qos", "user",
    "account", "interactive"}`` (batch flag 0); None unless exactly one
    record of ``job_id``."""
    lines = (text or "").splitlines()
    if len(lines) != 1:
        return None
    parts = lines[0].split("|")
    if len(parts) != len(EXEMPTION_FIELDS) + 1 or parts[-1].strip() or parts[0] != job_id \
            or parts[5] not in ("0", "1"):
        return None

    def val(v):
        return None if v in ("", "(null)", "None", "N/A") else v
    return {"partition": val(parts[1]), "qos": val(parts[2]), "user": val(parts[3]), "account": val(parts[4]),
            "interactive": parts[5] == "0"}


def parse_gres_count(gres: str, name: str = "gpu") -> int:
    """Total count of ``name`` in a node's gres (``gpu:h200:8(S:0-1)``, ``gpu:a100:2,gpu:v100:1``)."""
    total = 0
    for item in _split_top(gres or ""):
        item = re.sub(r"\(.*?\)", "", item.strip())
        parts = item.split(":")
        if not parts or parts[0] != name:
            continue
        last = parts[-1]
        if last.isdigit() and len(parts) >= 2:
            total += int(last)
        elif len(parts) == 1:
            total += 1
    return total


def gpus_per_node(partition: str | None, timeout_s: float = 15.0) -> int:
    """The most GPUs any node of ``partition`` (None: default) has (``sinfo -h -o %G``).

    Raises:
        SlurmError: sinfo failed, or no node in the partition has gres/gpu.
    """
    argv = ["sinfo", "-h", "-o", "%G"]
    if partition:
        argv += ["-p", partition]
    cp = run_slurm(argv, timeout_s)
    counts = [parse_gres_count(line) for line in cp.stdout.splitlines() if line.strip()]
    best = max(counts, default=0)
    if best <= 0:
        raise SlurmError("submit", "no GPUs in partition", partition or "(default)",
                         hint="gsrun runs GPU jobs: choose a partition with GPUs (-p; sinfo -o '%P %G' lists them); "
                              "for a CPU-only job use sbatch or srun. An admin: check gres.conf / Gres= in slurm.conf")
    return best


#: ``PARTITION|NODE|GRES`` per node and partition (default marked ``*``; ``%N``: NodeName)
NODE_GRES_ARGV = ("sinfo", "-h", "-N", "-o", "%P|%N|%G")
PARTITIONS_ARGV = ("scontrol", "-o", "show", "partition")


def parse_node_gres(text: str) -> tuple[dict[str, dict[str, int]], str | None]:
    """:data:`NODE_GRES_ARGV`'s output -> ``({partition: {node: GPUs}}, default or None)``."""
    parts: dict[str, dict[str, int]] = {}
    default = None
    for line in (text or "").splitlines():
        fields = line.strip().split("|")
        if len(fields) != 3 or not fields[0] or not fields[1]:
            continue
        name = fields[0]
        if name.endswith("*"):
            name = name[:-1]
            default = name
        parts.setdefault(name, {})[fields[1]] = parse_gres_count(fields[2])
    return parts, default


def parse_partitions(text: str) -> dict[str, dict[str, str]]:
    """:data:`PARTITIONS_ARGV`'s output -> ``{name: {Key: value}}``."""
    out: dict[str, dict[str, str]] = {}
    for line in (text or "").splitlines():
        if line.startswith("PartitionName="):
            rec = parse_oneliner(line)
            out[rec["PartitionName"]] = rec
    return out


#: Pending reasons that do not change while the job and the configuration stay -> meaning.
PENDING_FOR_GOOD = {
    "PartitionConfig": "it asks for more than the partition has (nodes, GPUs per node or CPUs)",
    "PartitionNodeLimit": "its node count is outside the partition's MinNodes..MaxNodes",
    "PartitionTimeLimit": "its time limit is above the partition's MaxTime",
    "BadConstraints": "no node of the partition has the features asked for (--constraint)",
    "QOSMaxGRESPerJob": "it asks for more GPUs than the QOS allows one job",
    "QOSMaxGRESPerUser": "it asks for more GPUs than the QOS allows one user at a time "
                         "(it starts only when your other jobs leave room, never if it alone is over)",
    "AssocMaxGRESPerJob": "it asks for more GPUs than your account allows one job",
    "QOSMaxNodePerJobLimit": "it asks for more nodes than the QOS allows one job",
    "AssocMaxNodesPerJobLimit": "it asks for more nodes than your account allows one job",
    "QOSMaxCpuPerJobLimit": "it asks for more CPUs than the QOS allows one job",
    "AssocMaxCpuPerJobLimit": "it asks for more CPUs than your account allows one job",
    "QOSMaxWallDurationPerJobLimit": "its time limit is above the QOS's maximum",
    "AssocMaxWallDurationPerJobLimit": "its time limit is above your account's maximum",
    "DependencyNeverSatisfied": "a job it depends on ended in a way the dependency excludes",
    "InvalidAccount": "the account is not valid for you",
    "InvalidQOS": "the QOS is not valid for you or the partition",
}


def pending_for_good(reason: str | None) -> str | None:
    return PENDING_FOR_GOOD.get((reason or "").strip())


def pending_hint(job_id: str, cluster: str | None = None) -> str:
    m = f"-M {cluster} " if cluster else ""
    return (f"scancel {m}{job_id}, then ask for what exists: sinfo {m}-o '%P %D %G %l' lists each "
            f"partition's nodes, GPUs per node and time limit; scontrol {m}show partition its limits")


def job_record_argv(job_id: str, scontrol: str = "scontrol") -> list[str]:
    """``scontrol --local -o show job ID``: ``--local`` saves the federation
    RPC (two RPCs per call without it, ``sdiag``, BENCHMARKS.md)."""
    return [scontrol, "--local", "-o", "show", "job", job_id]


def show_job(job_id: str, timeout_s: float = 15.0) -> dict[str, str] | None:
    """:func:`job_record_argv`'s record through :func:`parse_job_record`; None: unknown job.

    Raises:
        SlurmError: scontrol failed or timed out, or its output is not one
            record of this job (a newline in the job's name or comment).
    """
    check_job_id(job_id, array=True)
    cp = run_slurm(job_record_argv(job_id), timeout_s, check=False)
    if cp.returncode != 0:
        if "Invalid job id" in (cp.stderr + cp.stdout):
            return None
        raise SlurmError("slurm", "scontrol show job failed", (cp.stderr or cp.stdout).strip()[-200:])
    if not cp.stdout.strip():
        return None
    rec = parse_job_record(cp.stdout, job_id)
    if rec is None:
        raise SlurmError("slurm", "job record is not one record of this job", f"job {job_id}",
                         hint="a newline in the job's name or comment splits scontrol's one-line record")
    return rec


def parse_state(text: str | None) -> tuple[str, int | None]:
    """``"CANCELLED by 1000"`` -> ``("CANCELLED", 1000)``, ``""`` -> ``("", None)``;
    upper-cased, not checked against the known states."""
    words = (text or "").split()
    if not words:
        return "", None
    by = int(words[2]) if len(words) >= 3 and words[1] == "by" and re.fullmatch(r"[0-9]{1,10}", words[2]) \
        else None
    return words[0].upper(), by


def state_word(text: str | None) -> str:
    return parse_state(text)[0]


def parse_exit_code(text: str) -> tuple[int, int]:
    """``ExitCode=1:0`` -> ``(1, 0)`` (exit status, signal)."""
    m = re.match(r"^(\d+):(\d+)\Z", (text or "").strip())
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def parse_comment_request(comment: str) -> dict[str, str]:
    """The requests ``gsrun`` records in the job comment without the SPANK
    plugin (``gsrun:tune=swappiness=10;mps=50``): only gsrun's keys, values
    unchecked (their consumers validate)."""
    out: dict[str, str] = {}
    m = _COMMENT_REQUEST_RE.search(comment or "")
    if not m:
        return out
    for part in m.group(1).split(";"):
        k, sep, v = part.partition("=")
        if sep and k in ("tune", "mps", "mig", "bind", "report", "exclusive", "malloc") and len(v) <= 512:
            out[k] = v
    return out


#: ``squeue -O`` fields gsrun follows jobs with, ``:|`` each (width 0, ``|`` suffix), StdOut
#: last (a path may hold ``|``); the same on Slurm 22.05 to 26.05 (``src/squeue/opts.c``).
QUEUE_FIELDS = ("JobID", "State", "Reason", "TimeUsed", "NodeList", "exit_code", "StdOut")


def queue_argv(cluster: str | None = None) -> list[str]:
    """The one ``squeue`` of all this user's waiters: ``--me -t all``, one RPC
    (``--local``, or ``-M cluster``)."""
    fmt = ",".join(f"{f}:|" for f in QUEUE_FIELDS)
    where = ["-M", cluster] if cluster else ["--local"]
    return ["squeue", *where, "--me", "-h", "-t", "all", "-O", fmt]


def parse_queue(text: str) -> dict[str, dict[str, str]]:
    """:func:`queue_argv`'s output -> ``{job id: {field: value}}``; partial
    lines (``-M``'s header) skipped."""
    out: dict[str, dict[str, str]] = {}
    n = len(QUEUE_FIELDS)
    for line in (text or "").splitlines():
        parts = line.split("|", n - 1)
        if len(parts) != n or not parts[0].strip():
            continue
        rec = dict(zip(QUEUE_FIELDS, (p.strip() for p in parts)))
        rec["StdOut"] = rec["StdOut"].removesuffix("|")
        out[rec["JobID"]] = rec
    return out


def parse_queue_exit(text: str) -> tuple[int, int]:
    """squeue's ``exit_code`` -> ``(exit status, signal)``: ``"3:0"`` on Slurm
    >= 23.02, the raw wait status on 22.05 (``768`` = exit 3); ``""`` -> ``(0, 0)``."""
    text = (text or "").strip()
    if ":" in text:
        return parse_exit_code(text)
    if not is_digits(text):
        return 0, 0
    raw = int(text)
    sig = raw & 0x7F
    if sig and sig != 0x7F:
        return 0, sig
    return (raw >> 8) & 0xFF, 0


def accounting_argv(job_id: str, cluster: str | None = None) -> list[str]:
    """``sacct -X`` for a job the controller no longer holds."""
    check_job_id(job_id, array=True)
    where = ["-M", cluster] if cluster else []
    return ["sacct", *where, "-X", "-n", "-P", "-j", job_id, "-o", "JobID,State,ExitCode,Elapsed,NodeList"]


def parse_accounting(text: str, job_id: str) -> dict[str, str] | None:
    """:func:`accounting_argv`'s output -> the job's last line (one per run) as
    a dict; None when slurmdbd has none yet."""
    found = None
    for line in (text or "").splitlines():
        parts = line.split("|")
        if len(parts) >= 5 and parts[0] == job_id:
            found = dict(zip(("JobID", "State", "ExitCode", "Elapsed", "NodeList"), parts))
    return found


#: srun's line for tasks that ended badly (``src/srun/step_ctx``/``launch``):
#: ``srun: error: gpu02: task 1: Exited with exit code 1``,
#: ``srun: error: gpu01: tasks 0,2-3: Terminated``
_SRUN_TASK_END = re.compile(r"^srun: error: (\S+): tasks? ([0-9][0-9,-]*): (.+?)\s*$")


def parse_srun_task_end(line: str) -> tuple[str, int, int | None, str] | None:
    """srun's report of tasks that ended badly -> ``(node, first rank, exit
    code or None for a signal, what srun said)``; else None."""
    m = _SRUN_TASK_END.match(line)
    if not m:
        return None
    node, ranks, what = m.groups()
    first = int(re.split(r"[,-]", ranks)[0])
    code = re.fullmatch(r"Exited with exit code (\d+)", what)
    return node, first, (int(code.group(1)) if code else None), what


def parse_parsable(text: str) -> tuple[str, str | None]:
    """``sbatch --parsable`` output (``42`` or ``42;gpu``) -> ``(job id, cluster or None)``.

    Raises:
        InputError: no job id in it.
        SlurmError: a cluster name that is not one (letters, digits, ``-_.``).
    """
    line = (text or "").strip().splitlines()
    first = line[-1].strip() if line else ""
    job_id, _, cluster = first.partition(";")
    check_job_id(job_id, array=True, phase="submit")
    if cluster and (cluster.startswith("-") or not cluster.replace("-", "").replace("_", "").replace(".", "")
                    .isalnum() or not cluster.isascii()):
        raise SlurmError("submit", "bad cluster name from sbatch", repr(cluster)[:80])
    return job_id, (cluster or None)
