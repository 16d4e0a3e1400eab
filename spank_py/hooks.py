"""The Python side of the gsrun SPANK plugin: option handling in sbatch/salloc/srun,
and the step plans the node daemon answers slurmstepd with.

The C shim (``gsrun_spank.c``) registers :data:`OPTIONS` (compiled in by
``spank_py/build.py``) and starts Python only in sbatch, salloc or srun given a
``--gs-*`` option, calling ``slurm_spank_init_post_opt(context, args)``
(``"allocator"`` or ``"local"``; the plugstack arguments as C parsed them). It
validates the options and exports them as ``GS_*`` (the prolog's
``SPANK_GS_*``). A step's plan (:func:`step_actions`, :func:`format_actions`)
is computed in the node daemon once per node and step and applied by the
plugin's ``task_init`` in C. Slurm is reached through the built-in ``_spank``
module (tests put a fake one in ``sys.modules``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gsrun.base.ids import ALNUM, is_chars
from gsrun.bind.plan import mig_visible_devices, plan_from_env, rank_env, read_job_mig_devices
from gsrun.facts.hostfs import HostFS
from gsrun.facts.topology import read_allowed_mems
from gsrun.request.config import load_config

PHASE = "spank"

# The options a step's plan reads; slurmstepd sends them with every step's request.
REMOTE_OPTIONS = ("gs-mps", "gs-bind")

#: (name, arginfo, usage, has_arg: 0 none, 1 required, 2 optional), compiled into the C shim
OPTIONS: tuple[tuple[str, str | None, str, int], ...] = (
    ("gs-mps", "PCT", "gsrun: run a per-job CUDA MPS daemon; PCT (1-100) = default active thread percentage", 2),
    ("gs-mig", "LAYOUT", "gsrun: MIG layout per GPU (e.g. 7x1g.18gb, or a site layout name); exclusive nodes only", 1),
    ("gs-tune", "LIST", "gsrun: node tuning for the job, key=value[,...] (governor, swappiness, thp, ...)", 1),
    ("gs-bind", "MODE", "gsrun: task binding: auto (default), none, isolate (each rank sees only its GPU)", 1),
    ("gs-report", "MODE", "gsrun: end-of-job GPU efficiency report: mail or none", 1),
)

#: option name -> job control variable (the prolog sees SPANK_<name>)
EXPORT_NAMES = {"gs-mps": "GS_MPS", "gs-mig": "GS_MIG", "gs-tune": "GS_TUNE",
                "gs-bind": "GS_BIND", "gs-report": "GS_REPORT"}

#: what an ``srun`` in the job gets for an optional-argument option given without a value (NULL optarg)
NULL_OPTARG = "(null)"

BIND_MODES = ("auto", "none", "isolate")
REPORT_MODES = ("mail", "none")

#: Slurm's special step ids (slurm.h): pending, extern, batch, interactive, ...
SPECIAL_STEP_MIN = 0xFFFFFFF0
EXTERN_STEP = 0xFFFFFFFC

# Fallback syntax when gsrun.request.tune / mig_layout / mps_share cannot be imported (fullmatch)
_TUNE_FALLBACK = r"[a-z_]{1,32}=[A-Za-z0-9_.+-]{1,32}(,[a-z_]{1,32}=[A-Za-z0-9_.+-]{1,32}){0,15}"
_MIG_FALLBACK = r"[0-9a-z.+x]{1,200}"
_MPS_FALLBACK = r"[0-9]{1,3}"
_MIG_NAME = r"[A-Za-z0-9_-]{1,64}"
#: what gsrun.facts.jobenv accepts for SPANK_GS_* in the prolog (a set: no `re` import)
_EXPORT_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.,=+:-")
_EXPORT_MAX = 512


def is_export_value(text: str) -> bool:
    """True when ``text`` may be exported as ``SPANK_GS_*`` (what the prolog accepts)."""
    return len(text) <= _EXPORT_MAX and set(text) <= _EXPORT_CHARS


class OptionError(ValueError):
    """A ``--gs-*`` value failed validation; ``str()`` is the user message."""

    def __init__(self, option: str, value: str, detail: str, hint: str | None = None):
        self.option, self.value, self.detail, self.hint = option, value, detail, hint
        msg = f"gsrun: {PHASE}: --{option}={value}: {detail}"
        if hint:
            msg += f"\nhint: {hint}"
        super().__init__(msg)


# ---------------------------------------------------------------- decisions

def _detail(e: Exception) -> tuple[str, str | None]:
    return str(getattr(e, "detail", e)), getattr(e, "hint", None)


def _parser(parse, module: str, name: str):
    """``parse``, else ``module.name``, else None (the module cannot be imported: a regex fallback)."""
    if parse is not None:
        return parse
    try:
        return getattr(__import__(module, fromlist=[name]), name)
    except ImportError:
        return None


def check_mps(value: str, parse: Callable[[str], int | None] | None = None) -> str:
    """``""`` (flag alone: the site default) or an integer 1-100 as text
    (``"050"`` -> ``"50"``); ``parse`` defaults to
    :func:`gsrun.request.mps_share.parse_mps_share`."""
    parse = _parser(parse, "gsrun.request.mps_share", "parse_mps_share")
    if parse is None:
        v = value.strip()
        if v == "":
            return ""
        if not re.fullmatch(_MPS_FALLBACK, v) or not 1 <= int(v) <= 100:
            raise OptionError("gs-mps", value, "must be a percentage 1-100",
                              "--gs-mps=50, or --gs-mps alone for the site default")
        return str(int(v))
    try:
        pct = parse(value)
    except Exception as e:  # noqa: BLE001 - InputError from the parser, any other = bad value
        raise OptionError("gs-mps", value, "must be a percentage 1-100", _detail(e)[1]) from e
    return "" if pct is None else str(pct)


def check_tune(value: str, parse: Callable[[str], dict] | None = None) -> str:
    """Normalized ``key=value,...``; ``parse`` defaults to
    :func:`gsrun.request.tune.parse_tune_request`."""
    parse = _parser(parse, "gsrun.request.tune", "parse_tune_request")
    if parse is None:
        v = value.replace(" ", "")
        if not re.fullmatch(_TUNE_FALLBACK, v):
            raise OptionError("gs-tune", value, "must be key=value[,key=value...]",
                              "e.g. --gs-tune=swappiness=10,thp=never")
        return v
    try:
        req = parse(value)
    except Exception as e:  # noqa: BLE001 - InputError from the parser, any other = bad value
        raise OptionError("gs-tune", value, *_detail(e)) from e
    if not req:
        raise OptionError("gs-tune", value, "empty tuning request", "e.g. --gs-tune=swappiness=10")
    return ",".join(f"{k}={v}" for k, v in req.items())


def check_mig(value: str, named: Mapping[str, str] | None = None,
              parse: Callable[[str], object] | None = None) -> str:
    """The layout text to export, a site name (``mig.layouts``) resolved; it
    must parse (:func:`gsrun.request.mig_layout.parse_layout`)."""
    v = value.strip()
    if named and v in named:
        v = named[v]
    parse = _parser(parse, "gsrun.request.mig_layout", "parse_layout")
    if parse is None:
        if not re.fullmatch(_MIG_FALLBACK, v.lower()):
            raise OptionError("gs-mig", value, "must be a layout like 7x1g.18gb or 3g.71gb+3g.71gb")
        return v.lower()
    try:
        parse(v)
    except Exception as e:  # noqa: BLE001
        detail, hint = _detail(e)
        if named is not None and re.fullmatch(_MIG_NAME, value.strip()) and not re.search(r"\d+g\.", value):
            hint = (f"site layouts: {', '.join(sorted(named)) or 'none configured'}; " + (hint or ""))
        raise OptionError("gs-mig", value, detail, hint) from e
    return v.lower()


def check_word(option: str, value: str, allowed: tuple[str, ...]) -> str:
    v = value.strip().lower()
    if v not in allowed:
        raise OptionError(option, value, f"must be one of {'|'.join(allowed)}")
    return v


def validate_options(raw: Mapping[str, str | None], mig_layouts: Mapping[str, str] | None = None
                     ) -> tuple[dict[str, str], list[OptionError]]:
    """Options as given (``None`` = not given, ``""`` = without value) ->
    (``{GS_NAME: value}`` to export, errors), every value one the prolog accepts."""
    exports: dict[str, str] = {}
    errors: list[OptionError] = []
    checks: dict[str, Callable[[str], str]] = {
        "gs-mps": check_mps,
        "gs-tune": check_tune,
        "gs-mig": lambda v: check_mig(v, mig_layouts),
        "gs-bind": lambda v: check_word("gs-bind", v, BIND_MODES),
        "gs-report": lambda v: check_word("gs-report", v, REPORT_MODES),
    }
    for name, _arginfo, _usage, has_arg in OPTIONS:
        value = raw.get(name)
        if value is None:
            continue
        if has_arg == 2 and value == NULL_OPTARG:
            value = ""      # given without a value in sbatch, forwarded by Slurm to each srun as "(null)"
        if has_arg == 1 and value.strip() == "":
            errors.append(OptionError(name, value, "needs a value"))
            continue
        try:
            out = checks[name](value)
        except OptionError as e:
            errors.append(e)
            continue
        if not is_export_value(out):
            errors.append(OptionError(name, value, "has characters outside [A-Za-z0-9_.,=+:-]"))
            continue
        exports[EXPORT_NAMES[name]] = out
    return exports, errors


def is_bound_step(step_id: int | None) -> bool:
    """True for a normal step; False for Slurm's special ids (>= 0xfffffff0) and unknown."""
    return step_id is not None and step_id < SPECIAL_STEP_MIN


def bind_mode(plugstack_bind: str, option: str | None) -> str:
    """``none`` when plugstack.conf says ``bind=none``, else ``--gs-bind``
    (default ``auto``; an invalid value, which bypassed sbatch, is ``none``)."""
    if plugstack_bind == "none":
        return "none"
    if option is None or option.strip() == "":
        return "auto"
    v = option.strip().lower()
    return v if v in BIND_MODES else "none"


@dataclass(slots=True)
class TaskActions:
    """What task_init does for one task: variables to set and unset, the CPUs
    and NUMA memory nodes to bind to, notes for the user."""

    setenv: dict[str, str] = field(default_factory=dict)
    unsetenv: tuple[str, ...] = ()
    cpus: tuple[int, ...] = ()
    mem_nodes: tuple[int, ...] = ()
    notes: list[str] = field(default_factory=list)


def task_actions(plan, local_rank: int | None, mps_env: Mapping[str, str] | None,
                 allowed_mems: list[int] | None = None, mig_devices: list[str] | None = None,
                 gpu_isolation: bool = False) -> TaskActions:
    """One task's changes from the node plan (None: no binding) and the MPS
    client env (None: no MPS); memory binding only for a known NUMA node of a
    multi-node host, within ``allowed_mems``."""
    act = TaskActions()
    if plan is not None and local_rank is not None:
        rp = plan.rank(local_rank)
        act.setenv.update(rank_env(plan, local_rank))
        act.unsetenv = tuple(rp.unset)
        act.cpus = tuple(rp.cpus)
        mems = [m for m in rp.mem_nodes if m is not None and m >= 0]
        if allowed_mems is not None:
            mems = [m for m in mems if m in set(allowed_mems)]
        if rp.numa_node is not None and rp.numa_node >= 0 and plan.host_nodes > 1 and mems:
            act.mem_nodes = tuple(mems)
        act.notes.append(rp.reason)
        if mig_devices:
            vis = mig_visible_devices(mig_devices, local_rank, gpu_isolation)
            if vis:
                act.setenv["CUDA_VISIBLE_DEVICES"] = vis   # the job's MIG devices (prolog)
    if mps_env:
        act.setenv.update(mps_env)
    return act


# ---------------------------------------------------------------- the step's plan from the node daemon

ACTIONS_MAGIC = "GSA1"


def step_actions(job_env: Mapping[str, str], host_root: str | None, allowed_cpus: list[int] | None,
                 allowed_mems: list[int] | None, config_path: str | None,
                 job_id: str | None = None, step_id: int | None = None, mps_opt: str | None = None,
                 bind_opt: str | None = None, plugstack_bind: str = "auto", local_tasks: int | None = None
                 ) -> tuple[list[tuple[int, TaskActions]], tuple[str, ...], TaskActions | None]:
    """What a step's tasks get, from what the plugin sent (``job_id``, ``step_id``, ``local_tasks``: the step's
    tasks here; slurmstepd's own, not the job environment's, which the job can set) -> ``([(local_rank,
    TaskActions)], notes, others)``; ``others``: what a task without a block gets, or None. A failed plan is a note."""
    cfg = _load_config({"config": config_path} if config_path else None)
    notes: list[str] = []
    mps_env = None
    if mps_opt is not None and job_id and step_id != EXTERN_STEP:
        try:
            from gsrun.node.mps import task_env

            mps_env = task_env(str(job_id), cfg["paths.mps_dir"])
        except Exception as e:  # noqa: BLE001 - GsrunError: bad job id/dir; said in the plan
            notes.append(f"mps: {e}")
    mode = bind_mode(plugstack_bind, bind_opt)
    actions: list[tuple[int, TaskActions]] = []
    if mode != "none" and is_bound_step(step_id):
        hostfs = HostFS.from_env(host_root or None, environ={})
        try:
            plan = plan_from_env(job_env, hostfs, sorted(allowed_cpus) if hostfs.is_real and allowed_cpus else None,
                                 gpu_isolation=mode == "isolate", ntasks=local_tasks)
        except Exception as e:  # noqa: BLE001 - GsrunError with a message; the tasks keep Slurm's binding
            notes.append(f"bind: {e}; the tasks of this step run with Slurm's binding")
        else:
            mems = allowed_mems if hostfs.is_real else read_allowed_mems(hostfs)
            # slurmstepd's job id first: the daemon reads the job's MIG devices as root
            mig = read_job_mig_devices(cfg["paths.spool_dir"], job_id or job_env.get("SLURM_JOB_ID"),
                                       job_env.get("SLURMD_NODENAME"))
            actions = [(r.local_rank, task_actions(plan, r.local_rank, mps_env, mems, mig, mode == "isolate"))
                       for r in plan.ranks]
            notes += plan.warnings
    others = task_actions(None, None, mps_env) if mps_env else None
    return actions, tuple(notes), others


def format_actions(actions: list[tuple[int, TaskActions]], notes: tuple[str, ...] = (),
                   others: TaskActions | None = None) -> str:
    """The step's plan as ``gsrun_spank.c`` (``plan_parse``) reads it: ``GSA1``;
    per local rank ``rank N`` (0-4095) then ``unset NAME``, ``set NAME=VALUE``,
    ``cpus 0,1``, ``mems 0`` lines; ``rank *`` for ``others``; ``note TEXT``
    lines; ``end``. Pure.

    Raises:
        ValueError: a name or value with a newline or NUL, or a bad name.
    """
    def name_ok(n: str) -> bool:
        return bool(n) and not n[0].isdigit() and is_chars(n, ALNUM | {"_"}, None)

    out = [ACTIONS_MAGIC]
    blocks = [(f"rank {int(rank)}", act) for rank, act in actions]
    if others is not None:
        blocks.append(("rank *", others))
    for head, act in blocks:
        out.append(head)
        for n in act.unsetenv:
            if not name_ok(n):
                raise ValueError(f"environment name {n!r}")
            out.append(f"unset {n}")
        for n, v in act.setenv.items():
            if not name_ok(n) or "\n" in v or "\0" in v:
                raise ValueError(f"environment entry {n!r}")
            out.append(f"set {n}={v}")
        if act.cpus:
            out.append("cpus " + ",".join(str(int(c)) for c in act.cpus))
        if act.mem_nodes:
            out.append("mems " + ",".join(str(int(m)) for m in act.mem_nodes))
    out += [f"note {n}".replace("\n", " ").replace("\0", " ") for n in notes]
    out.append("end")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- Slurm

def _spank():
    import _spank  # the plugin's built-in module (a fake one in tests)
    return _spank


def _log(level: str, msg: str) -> None:
    for line in msg.splitlines() or [""]:
        _spank().log(level, line)


def _load_config(args: Mapping | None = None):
    """The site config: plugstack ``config=PATH``, else $GSRUN_CONFIG / the default."""
    return load_config((args or {}).get("config"), environ=os.environ)


# ---------------------------------------------------------------- hooks

def slurm_spank_init_post_opt(ctx: str, args: dict) -> int:
    """allocator/local: validate the options and export them to the prolog."""
    if ctx not in ("allocator", "local"):
        return 0
    sp = _spank()
    compiled = args.get("options")
    defined = [name for name, *_ in OPTIONS]
    if compiled is not None and list(compiled) != defined:
        _log("error", f"gsrun: {PHASE}: options: the plugin was built with {', '.join(compiled) or 'none'} "
                      f"but this gsrun defines {', '.join(defined)}")
        _log("error", "hint: rebuild and reinstall it: gsrun-node spank build && gsrun-node spank install")
    raw = {name: sp.option_getopt(name) if compiled is None or name in compiled else None for name in defined}
    if all(v is None for v in raw.values()):
        return 0
    layouts: Mapping[str, str] | None = None
    if raw.get("gs-mig") is not None:
        try:
            layouts = _load_config(args)["mig.layouts"]
        except Exception as e:  # noqa: BLE001 - a broken site config must not block jobs
            _log("verbose", f"gsrun: {PHASE}: config: {e}; site MIG layout names unavailable")
    exports, errors = validate_options(raw, layouts)
    if errors:
        for e in errors:
            _log("error", str(e))
        return -1
    for name, value in exports.items():
        try:
            sp.job_control_setenv(name, value, True)
        except Exception as e:  # noqa: BLE001 - SpankError: srun inside an allocation
            if ctx == "allocator":
                raise
            _log("verbose", f"gsrun: {PHASE}: job_control_setenv {name}: {e}")
    return 0
