"""The job spec: everything ``gsrun`` was asked, validated, frozen. click
parses flags into a :class:`JobSpec`, :func:`gsrun.wrapper.render.render_script`
renders it, :mod:`gsrun.wrapper.submit` submits it."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gsrun.base.errors import InputError
from gsrun.base.ids import is_partition
from gsrun.request.malloc import ALLOCATORS, Allocator, LIB_DIRS

JOB_NAME_MAX = 256
TIME_RE = r"^(?:(\d+-)?\d{1,4}(:\d{1,2}){0,2}|UNLIMITED|INFINITE)\Z"
MAIL_TYPE_RE = (r"^(NONE|BEGIN|END|FAIL|REQUEUE|ALL|INVALID_DEPEND|STAGE_OUT|"
                r"TIME_LIMIT(_50|_80|_90)?|ARRAY_TASKS)(,(BEGIN|END|FAIL|REQUEUE|ALL|"
                r"INVALID_DEPEND|STAGE_OUT|TIME_LIMIT(_50|_80|_90)?|ARRAY_TASKS))*\Z")
EMAIL_RE = r"^(?:[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+|[a-z_][a-z0-9_-]{0,31})\Z"
CONTROL_RE = r"[\x00-\x1f\x7f]"


def has_control(text: str) -> bool:
    """``text`` holds a C0 or DEL character (a newline starts a script line)."""
    return not (text.isascii() and text.isprintable()) and re.search(CONTROL_RE, text) is not None


# site sbatch options: (flag, allow-list, example) -- values end up unquoted in #SBATCH lines
SITE_OPTIONS = {
    "account": ("-A/--account", r"^[A-Za-z0-9_.@+-]{1,64}\Z", "e.g. -A proj123"),
    "qos": ("-q/--qos", r"^[A-Za-z0-9_.+-]{1,64}(,[A-Za-z0-9_.+-]{1,64})*\Z", "e.g. -q high"),
    "constraint": ("-C/--constraint", r"^[A-Za-z0-9_.&|,*\[\]():!+-]{1,1024}\Z",
                   "features with & | , * [] (), e.g. -C 'h200&ib'"),
    "mem": ("--mem", r"^[0-9]{1,12}[KMGT]?\Z", "a size like 64G, or 0 for all of each node's memory"),
    "reservation": ("--reservation", r"^[A-Za-z0-9_.+-]{1,128}(,[A-Za-z0-9_.+-]{1,128})*\Z",
                    "a reservation name"),
    "dependency": ("-d/--dependency", r"^[A-Za-z0-9_:+?,.-]{1,1024}\Z",
                   "e.g. afterok:1234 or singleton"),
    "signal": ("--signal", r"^(?:[BR]{1,2}:)?(?:SIG)?[A-Z0-9]{1,8}(?:@[0-9]{1,6})?\Z",
               "e.g. B:USR1@120"),
}

# #SBATCH options gsrun renders itself (or through a flag of its own): --sbatch may not set them.
# sbatch's getopt_long takes an unambiguous prefix, so a prefix of one of these is refused too.
RENDERED = {
    "job-name": "-J/--job-name", "nodes": "--nodes", "ntasks-per-node": "--gpus/--gpus-per-node",
    "ntasks": "--gpus", "gres": "--gpus", "gpus": "--gpus", "gpus-per-node": "--gpus-per-node",
    "gpus-per-task": "--gpus", "cpus-per-task": "--cpus-per-task", "partition": "-p/--partition",
    "time": "--time", "output": "-o/--output", "exclusive": "--exclusive", "mail-type": "--mail-type",
    "mail-user": "--mail-user",
    "account": "-A/--account", "qos": "-q/--qos", "constraint": "-C/--constraint", "mem": "--mem",
    "reservation": "--reservation", "dependency": "-d/--dependency", "signal": "--signal",
    "requeue": "--requeue",
}
# options that break the way gsrun submits or follows the job
NOT_IN_SCRIPT = {
    "chdir": "gsrun submits from the current directory: cd there first",
    "wrap": "gsrun writes the script itself", "parsable": "gsrun reads sbatch's output itself",
    "wait": "use gsrun --wait", "test-only": "use gsrun --dry-run", "uid": "not a user option",
    "gid": "not a user option", "hold": "release it with scontrol release; not through gsrun",
}
# the characters of a plain #SBATCH word (sbatch_word leaves it unquoted)
_PLAIN_WORD = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.,:@%+=/-")
SBATCH_OPT_RE = r"(?s)^--([a-z][a-z0-9-]{0,63})(?:=(.*))?\Z"


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What to submit; ``command``: the argv each task runs literally (after ``gsrun-bind --``)."""

    gpus: int
    nodes: int
    gpus_per_node: int
    command: tuple[str, ...]
    job_name: str
    partition: str | None = None
    time: str | None = None
    output: str | None = None
    cpus_per_task: int | None = None
    mail_type: str | None = None
    mail_user: str | None = None
    tune: str | None = None
    mps: str | None = None  # "" = default percentage, "50" = 50 %
    mig: str | None = None
    gpu_isolation: bool = False
    exclusive: bool = False
    bind_exe: str = "gsrun-bind"
    nccl_env: tuple[tuple[str, str], ...] = ()
    mps_dir: str = "/run/gsrun/mps"
    extra_env: tuple[tuple[str, str], ...] = ()
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    mem: str | None = None
    reservation: str | None = None
    dependency: str | None = None
    signal: str | None = None
    requeue: bool = False
    sbatch_options: tuple[tuple[str, str | None], ...] = ()  # (--sbatch) name without --, value
    launcher: str | None = None  # None: one task per GPU; "torchrun": one task per node
    python: str | None = None  # the interpreter chosen at submit (None: a CMD after --)
    python_why: str | None = None  # why that one (the script says it in a comment)
    malloc: str | None = None  # "jemalloc" | "tcmalloc": preloaded, found on the node at run time
    malloc_env: tuple[tuple[str, str], ...] = ()  # MALLOC_CONF or TCMALLOC_* (gsrun.request.malloc)
    malloc_lib_dirs: tuple[str, ...] = LIB_DIRS  # where the job script looks for the library
    cuda_alloc_conf: str | None = None  # PYTORCH_CUDA_ALLOC_CONF (site), None: unset
    user_comment: str | None = None  # --comment: the user's own text, after gsrun's requests
    python_env: str | None = None  # "venv" | "conda": the active environment python belongs to
    python_prefix: str | None = None  # its prefix at submit (what sys.prefix must be in the job)
    conda_exe: str | None = None  # the conda that activates a conda env in the job ($CONDA_EXE)

    @property
    def allocator(self) -> Allocator | None:
        return ALLOCATORS[self.malloc] if self.malloc else None

    @property
    def ntasks_per_node(self) -> int:
        return 1 if self.launcher else self.gpus_per_node

    @property
    def task_cpus(self) -> int | None:
        """``--cpus-per-task``: per GPU task, or for a launcher all its workers' (one each by default)."""
        if self.launcher:
            return (self.cpus_per_task or 1) * self.gpus_per_node
        return self.cpus_per_task

    def site_lines(self) -> list[tuple[str, str | None]]:
        """(option, value or None for a flag) of the site sbatch options, in a fixed order."""
        out = [(key, getattr(self, key)) for key in SITE_OPTIONS if getattr(self, key) is not None]
        if self.requeue:
            out.append(("requeue", None))
        out.extend(self.sbatch_options)
        return out

    def comment(self) -> str | None:
        """``gsrun:tune=...;mps=...`` for the prolog without the SPANK plugin."""
        asked = (("tune", self.tune), ("mps", self.mps), ("mig", self.mig),
                 ("exclusive", "1" if self.exclusive else None), ("malloc", self.malloc))
        parts = [f"{k}={v}" for k, v in asked if v or (k == "mps" and v is not None)]   # mps="": the default
        return "gsrun:" + ";".join(parts) if parts else None

    def job_comment(self) -> str | None:
        """The job's ``Comment``: :meth:`comment`, then the user's ``--comment``."""
        return " ".join(c for c in (self.comment(), self.user_comment) if c) or None


def _spreads(gpus: int, max_gpn: int) -> list[tuple[int, int]]:
    """(nodes, GPUs per node) that hold ``gpus`` evenly with at most ``max_gpn`` per node, fewest nodes first."""
    return [(n, gpus // n) for n in range(1, gpus + 1) if gpus % n == 0 and gpus // n <= max_gpn]


def _fits_hint(gpus: int, gpn: int) -> str:
    """The exact options that would work for ``gpus`` on nodes of ``gpn`` GPUs."""
    lo, hi = (gpus // gpn) * gpn, -(-gpus // gpn) * gpn
    opts = [f"--gpus {g} ({g // gpn} node(s) x {gpn})" for g in sorted({lo, hi} - {0})]
    sp = _spreads(gpus, gpn)
    if sp:
        n, per = sp[0]
        opts.append(f"--gpus {gpus} --nodes {n} ({n} nodes x {per})")
    return "use " + ", or ".join(opts)


def plan_nodes(gpus: int, nodes: int | None, gpus_per_node: int | None,
               cluster_gpus_per_node: int | None) -> tuple[int, int]:
    """(nodes, gpus_per_node) for ``gpus`` GPUs: an even split over
    ``nodes``, or by ``gpus_per_node``, else whole cluster nodes or the even
    spread over as many (``--gpus 6`` on 4-GPU nodes: 2 x 3).

    Raises:
        InputError: numbers that do not fit, with the exact options that would as the hint.
    """
    if gpus < 1:
        raise InputError("submit", "bad --gpus", str(gpus), hint="ask for at least one GPU")
    if nodes is not None:
        if nodes < 1 or gpus % nodes:
            good = [n for n in range(1, gpus + 1) if gpus % n == 0]
            raise InputError("submit", "GPUs do not split evenly over nodes", f"--gpus {gpus} --nodes {nodes}",
                             hint=f"--nodes must divide --gpus: --nodes {' or '.join(map(str, good[:6]))}")
        gpn = gpus // nodes
        if gpus_per_node is not None and gpus_per_node != gpn:
            raise InputError("submit", "conflicting --gpus-per-node", f"{gpus_per_node} != {gpus}/{nodes}")
        return nodes, gpn
    if gpus_per_node is not None:
        if gpus_per_node < 1:
            raise InputError("submit", "bad --gpus-per-node", str(gpus_per_node), hint="at least 1")
        gpn = min(gpus_per_node, gpus)
        if gpus % gpn:
            raise InputError("submit", "GPUs do not fill whole nodes",
                             f"--gpus {gpus} --gpus-per-node {gpus_per_node}", hint=_fits_hint(gpus, gpn))
        return gpus // gpn, gpn
    gpn = cluster_gpus_per_node
    if not gpn or gpn < 1:
        raise InputError("submit", "unknown GPUs per node", "the cluster reported none",
                         hint="pass --gpus-per-node or --nodes")
    if gpus <= gpn:
        return 1, gpus
    if gpus % gpn == 0:
        return gpus // gpn, gpn
    need = -(-gpus // gpn)
    for n, per in _spreads(gpus, gpn):
        if n == need:
            return n, per
    raise InputError("submit", "GPUs do not fill whole nodes", f"--gpus {gpus} on nodes of {gpn} GPUs",
                     hint=_fits_hint(gpus, gpn))


def _max_nodes(rec: dict[str, str] | None) -> int | None:
    """A partition record's ``MaxNodes`` (None: ``UNLIMITED`` or unknown)."""
    v = (rec or {}).get("MaxNodes", "")
    return int(v) if v.isdigit() else None


def partition_offer(name: str, node_gpus: dict[str, int], rec: dict[str, str] | None) -> tuple[int, int, int]:
    """The largest job one partition can hold -> ``(GPUs, nodes, GPUs per node)``."""
    best = (0, 0, 0)
    cap = _max_nodes(rec)
    for per in sorted({g for g in node_gpus.values() if g > 0}):
        n = sum(1 for g in node_gpus.values() if g >= per)
        n = min(n, cap) if cap is not None else n
        best = max(best, (per * n, n, per))
    return best


def refuse_unrunnable(gpus: int, nodes: int, gpus_per_node: int, wanted: list[str] | None,
                      offer: dict[str, dict[str, int]], default: str | None,
                      partitions: dict[str, dict[str, str]]) -> None:
    """Refuse ``nodes x gpus_per_node`` GPUs when no partition of ``wanted``
    (None: the default) could ever hold it (``offer``: sinfo's ``{partition:
    {node: GPUs}}``; ``partitions``: their Min/MaxNodes). A necessary
    condition only: a refused job would pend for ever (``PartitionConfig``).

    Raises:
        InputError: the request cannot run; the detail says what each
            partition has, the hint the largest request that fits.
    """
    names = wanted if wanted else ([default] if default else [])
    names = [n for n in names if n in offer]
    if not names or len(names) != len(wanted or names):
        return
    seen = []
    for name in names:
        rec = partitions.get(name) or {}
        have = sum(1 for g in offer[name].values() if g >= gpus_per_node)
        cap = _max_nodes(rec)
        low = int(rec["MinNodes"]) if rec.get("MinNodes", "").isdigit() else 0
        if have >= nodes and (cap is None or nodes <= cap) and nodes >= low:
            return
        most, n, per = partition_offer(name, offer[name], rec)
        limits = f", MaxNodes={cap}" if cap is not None else ""
        seen.append((name, have, most, n, per, limits))
    detail = "; ".join(f"partition {name}: {have} node{'s' if have != 1 else ''} with {gpus_per_node} or more "
                       f"GPUs{limits}, at most {most} GPUs ({n} x {per}) in one job"
                       for name, have, most, n, per, limits in seen)
    name, _have, most, n, per, _l = max(seen, key=lambda x: x[2])
    hint = (f"ask for at most --gpus {most} ({n} node{'s' if n != 1 else ''} x {per} GPUs) in partition {name}"
            if most else f"partition {name} has no GPU nodes: pick another (sinfo -o '%P %D %G')")
    raise InputError("submit", "no partition can run this",
                     f"{nodes} node{'s' if nodes != 1 else ''} x {gpus_per_node} GPUs (--gpus {gpus}); {detail}",
                     hint=hint)


def sbatch_word(value: str) -> str:
    """``value`` as one word of an ``#SBATCH`` line: plain, or double-quoted
    with ``"`` and ``\\`` escaped (sbatch's parser splits at blanks outside
    quotes, a backslash protects no blank; checked against sbatch 22.05 with
    ``a "q" b``, ``x #1; a&b $(id)``, ``it's``). Control characters are
    refused before (:func:`check_text`)."""
    if value and _PLAIN_WORD.issuperset(value):
        return value
    return '"' + re.sub(r'([\\"])', r"\\\1", value) + '"'


def unquote_sbatch_word(word: str) -> str:
    """The value sbatch reads from one word :func:`sbatch_word` wrote."""
    if len(word) >= 2 and word[0] == word[-1] == '"':
        return re.sub(r'\\([\\"])', r"\1", word[1:-1])
    return word


def check_comment(text: str) -> str:
    """The user's ``--comment`` text (one line, at most 1024 characters, no ``gsrun:``).

    Raises:
        InputError: a newline or control character, too long, ``gsrun:`` in it.
    """
    check_text("--comment", text)
    if "gsrun:" in text:
        raise InputError("submit", "bad --comment", repr(text)[:80],
                         hint="a comment without 'gsrun:' (gsrun keeps its own requests there)")
    return text


def check_text(flag: str, value: str, max_len: int = 1024) -> None:
    """One line of printable text.

    Raises:
        InputError: empty, too long, a control character or newline, a lone surrogate.
    """
    if (not value or len(value) > max_len or has_control(value)
            or any(0xd800 <= ord(c) <= 0xdfff for c in value)):
        raise InputError("submit", f"bad {flag}", repr(value)[:80],
                         hint=f"one line of at most {max_len} characters, no control characters")


def validate_site(spec_values: dict) -> None:
    """The site sbatch options against :data:`SITE_OPTIONS`.

    Raises:
        InputError: naming the flag, the value and what is allowed.
    """
    for key, (flag, rx, example) in SITE_OPTIONS.items():
        v = spec_values.get(key)
        if v is not None and not re.match(rx, v):
            raise InputError("submit", f"bad {flag}", repr(v)[:80], hint=example)


def parse_sbatch_option(text: str) -> tuple[str, str | None]:
    """``--sbatch=--OPTION[=VALUE]`` -> (OPTION, VALUE or None).

    Raises:
        InputError: not one long option, a control character or newline,
            an option gsrun renders itself (or a prefix of one), or one that
            breaks how gsrun submits.
    """
    if has_control(text) or any(0xd800 <= ord(c) <= 0xdfff for c in text) or len(text) > 4096:
        raise InputError("submit", "bad --sbatch", repr(text)[:80],
                         hint="one option on one line: no newline or control character")
    m = re.match(SBATCH_OPT_RE, text)
    if not m:
        raise InputError("submit", "bad --sbatch", repr(text)[:80],
                         hint="one long option, e.g. --sbatch=--licenses=fluent:2 or --sbatch=--nice")
    name, value = m.group(1), m.group(2)
    if name.startswith("gs-"):
        raise InputError("submit", "bad --sbatch", f"--{name}: gsrun's own requests",
                         hint="use gsrun's --mps, --mig, --tune, --gpu-isolation")
    if name != "comment" and "comment".startswith(name):
        raise InputError("submit", "bad --sbatch", f"--{name}: ambiguous", hint="--comment TEXT")
    if name == "comment":
        check_comment(value or "")
    for full, flag in RENDERED.items():
        if full.startswith(name):
            raise InputError("submit", "bad --sbatch", f"--{name}: gsrun renders --{full} itself",
                             hint=f"use gsrun's {flag}" if flag.startswith("-") else "leave it to gsrun")
    for full, why in NOT_IN_SCRIPT.items():
        if full.startswith(name):
            raise InputError("submit", "bad --sbatch", f"--{name}", hint=why)
    return name, value


def validate_fields(job_name: str, partition: str | None, time: str | None, mail_type: str | None,
                    mail_user: str | None) -> None:
    """Allow-list checks of the values that end up in ``#SBATCH`` lines.

    Raises:
        InputError: naming the flag and the value.
    """
    check_text("--job-name", job_name, JOB_NAME_MAX)
    if "hetjob" in job_name.lower() or "packjob" in job_name.lower():
        raise InputError("submit", "bad --job-name", repr(job_name)[:80],
                         hint="a name without the words 'hetjob' or 'packjob' (sbatch's job separators)")
    if partition is not None and not is_partition(partition):
        raise InputError("submit", "bad --partition", repr(partition)[:80])
    if time is not None and not re.match(TIME_RE, time):
        raise InputError("submit", "bad --time", repr(time)[:80], hint="e.g. 30, 1:00:00 or 2-00:00:00")
    if mail_type is not None and not re.match(MAIL_TYPE_RE, mail_type.upper()):
        raise InputError("submit", "bad --mail-type", repr(mail_type)[:80], hint="e.g. END or END,FAIL")
    if mail_user is not None and not re.match(EMAIL_RE, mail_user):
        raise InputError("submit", "bad --mail-user", repr(mail_user)[:80])
