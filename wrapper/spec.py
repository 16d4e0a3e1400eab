"""The job spec: everything ``gsrun`` was asked, validated, as a frozen dataclass.

click only parses flags into a :class:`JobSpec`; :func:`gsrun.wrapper.render.render_script`
turns a spec into sbatch text (pure) and :mod:`gsrun.wrapper.submit` submits it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gsrun.base.errors import InputError
from gsrun.base.ids import is_partition

JOB_NAME_RE = re.compile(r"^[A-Za-z0-9_.+-]{1,128}\Z")
TIME_RE = re.compile(r"^(?:(\d+-)?\d{1,4}(:\d{1,2}){0,2}|UNLIMITED|INFINITE)\Z")
MAIL_TYPE_RE = re.compile(r"^(NONE|BEGIN|END|FAIL|REQUEUE|ALL|INVALID_DEPEND|STAGE_OUT|"
                          r"TIME_LIMIT(_50|_80|_90)?|ARRAY_TASKS)(,(BEGIN|END|FAIL|REQUEUE|ALL|"
                          r"INVALID_DEPEND|STAGE_OUT|TIME_LIMIT(_50|_80|_90)?|ARRAY_TASKS))*\Z")
EMAIL_RE = re.compile(r"^(?:[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+|[a-z_][a-z0-9_-]{0,31})\Z")


@dataclass(frozen=True)
class JobSpec:
    """What to submit. ``command`` is the argv each task runs (after
    ``gsrun-bind --``); every element reaches the task literally."""

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
    mps: str | None = None          # "" = default percentage, "50" = 50 %
    mig: str | None = None
    gpu_isolation: bool = False
    exclusive: bool = False
    bind_exe: str = "gsrun-bind"
    nccl_env: tuple[tuple[str, str], ...] = ()
    mps_dir: str = "/run/gsrun/mps"
    extra_env: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    @property
    def ntasks_per_node(self) -> int:
        return self.gpus_per_node

    def comment(self) -> str | None:
        """Requests for the prolog when the SPANK plugin is absent
        (``gsrun:tune=...;mps=...``), read by :func:`gsrun.facts.slurm.parse_comment_request`."""
        parts = []
        if self.tune:
            parts.append(f"tune={self.tune}")
        if self.mps is not None:
            parts.append(f"mps={self.mps}")
        if self.mig:
            parts.append(f"mig={self.mig}")
        if self.exclusive:
            parts.append("exclusive=1")
        return "gsrun:" + ";".join(parts) if parts else None


def plan_nodes(gpus: int, nodes: int | None, gpus_per_node: int | None,
               cluster_gpus_per_node: int | None) -> tuple[int, int]:
    """Decide (nodes, gpus_per_node) for ``gpus`` GPUs.

    - ``--nodes`` given: GPUs are split evenly (must divide).
    - else ``--gpus-per-node`` or the cluster's GPUs per node decide the node count.

    Raises:
        InputError: numbers that do not fit (``--gpus 6 --nodes 4``).
    """
    if gpus < 1:
        raise InputError("submit", "bad --gpus", str(gpus), hint="ask for at least one GPU")
    if nodes is not None:
        if nodes < 1 or gpus % nodes:
            raise InputError("submit", "GPUs do not split evenly over nodes", f"--gpus {gpus} --nodes {nodes}",
                             hint="make --gpus a multiple of --nodes")
        gpn = gpus // nodes
        if gpus_per_node is not None and gpus_per_node != gpn:
            raise InputError("submit", "conflicting --gpus-per-node", f"{gpus_per_node} != {gpus}/{nodes}")
        return nodes, gpn
    gpn = gpus_per_node or cluster_gpus_per_node
    if not gpn or gpn < 1:
        raise InputError("submit", "unknown GPUs per node", "the cluster reported none",
                         hint="pass --gpus-per-node or --nodes")
    gpn = min(gpn, gpus)
    if gpus % gpn:
        raise InputError("submit", "GPUs do not fill whole nodes", f"--gpus {gpus} with {gpn} per node",
                         hint="pass --nodes N with --gpus a multiple of N")
    return gpus // gpn, gpn


def validate_fields(job_name: str, partition: str | None, time: str | None, mail_type: str | None,
                    mail_user: str | None) -> None:
    """Allow-list checks of the values that end up in ``#SBATCH`` lines.

    Raises:
        InputError: naming the flag and the value.
    """
    if not JOB_NAME_RE.match(job_name):
        raise InputError("submit", "bad --job-name", repr(job_name)[:80],
                         hint="letters, digits and _.+- only, at most 128 characters")
    if partition is not None and not is_partition(partition):
        raise InputError("submit", "bad --partition", repr(partition)[:80])
    if time is not None and not TIME_RE.match(time):
        raise InputError("submit", "bad --time", repr(time)[:80], hint="e.g. 30, 1:00:00 or 2-00:00:00")
    if mail_type is not None and not MAIL_TYPE_RE.match(mail_type.upper()):
        raise InputError("submit", "bad --mail-type", repr(mail_type)[:80], hint="e.g. END or END,FAIL")
    if mail_user is not None and not EMAIL_RE.match(mail_user):
        raise InputError("submit", "bad --mail-user", repr(mail_user)[:80])
