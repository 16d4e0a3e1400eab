"""The environment a user submits from, as sbatch would read it. Pure.

sbatch reads ``SBATCH_*`` after the script's ``#SBATCH`` lines
(``src/sbatch/opt.c``), so a module's ``SBATCH_PARTITION`` would replace
gsrun's ``--partition``: :func:`sbatch_env_args` moves each onto the command
line, or refuses one sbatch cannot undo. A parent allocation's ``SLURM_*`` /
``SRUN_*`` input variables (``SLURM_MEM_PER_CPU``, ``SRUN_CPUS_PER_TASK``...)
are left out of sbatch's environment (:func:`submit_environ`).
"""

from __future__ import annotations

from gsrun.base.errors import InputError
from gsrun.wrapper.spec import unquote_sbatch_word
from collections.abc import Mapping


#: input variable -> the sbatch long option it sets (``src/sbatch/opt.c`` env_vars, 22.05-26.05)
SBATCH_ENV = {
    "SBATCH_ACCOUNT": "account", "SBATCH_QOS": "qos", "SBATCH_PARTITION": "partition",
    "SBATCH_TIMELIMIT": "time", "SBATCH_JOB_NAME": "job-name", "SBATCH_CONSTRAINT": "constraint",
    "SBATCH_RESERVATION": "reservation", "SBATCH_SIGNAL": "signal", "SBATCH_OUTPUT": "output",
    "SBATCH_GRES": "gres", "SBATCH_REQUEUE": "requeue", "SBATCH_NO_REQUEUE": "no-requeue",
    "SBATCH_MEM_PER_NODE": "mem", "SBATCH_MEM_PER_CPU": "mem-per-cpu", "SBATCH_MEM_PER_GPU": "mem-per-gpu",
    "SBATCH_EXCLUSIVE": "exclusive", "SBATCH_CLUSTERS": "clusters", "SLURM_CLUSTERS": "clusters",
}
MEMORY = ("mem", "mem-per-cpu", "mem-per-gpu")
#: variables sbatch has no command-line option to undo, with what they would do to a gsrun job
NO_UNDO = {
    "SBATCH_GPUS": "a second GPU request beside gsrun's --gres=gpu:N",
    "SBATCH_GPUS_PER_NODE": "a second GPU request beside gsrun's --gres=gpu:N",
    "SBATCH_GPUS_PER_TASK": "a GPU request per task beside gsrun's --gres=gpu:N",
    "SBATCH_GPUS_PER_SOCKET": "a second GPU request beside gsrun's --gres=gpu:N",
    "SBATCH_TRES_PER_TASK": "a per-task resource request beside gsrun's --gres=gpu:N and --cpus-per-task",
    "SBATCH_CPUS_PER_GPU": "CPUs per GPU, which sbatch refuses beside gsrun's --cpus-per-task",
    "SBATCH_WAIT": "sbatch --wait: gsrun's submit would block until the job ends",
    "SBATCH_ARRAY_INX": "a job array: gsrun submits one job",
}
#: SLURM_* names kept inside an allocation: how to reach Slurm, not the parent job's resources
KEEP_IN_ALLOCATION = frozenset({"SLURM_CONF", "SLURM_CLUSTERS", "SLURM_TIME_FORMAT"})
#: the parent's variables that change a new job's resources (named in the note)
RESOURCE_VARS = ("SLURM_MEM_PER_CPU", "SLURM_MEM_PER_GPU", "SLURM_MEM_PER_NODE", "SRUN_CPUS_PER_TASK",
                 "SLURM_CPUS_PER_TASK", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE", "SLURM_NPROCS",
                 "SLURM_TRES_PER_TASK", "SLURM_GPUS", "SLURM_GPUS_PER_NODE", "SLURM_GPUS_PER_TASK",
                 "SLURM_GPU_BIND", "SLURM_CPU_BIND", "SLURM_DISTRIBUTION", "SLURM_JOB_ID")


def script_options(script: str) -> dict[str, str | None]:
    """The ``#SBATCH --name[=value]`` lines of a script gsrun rendered ->
    ``{name: value or None}`` (values unquoted as sbatch reads them)."""
    out: dict[str, str | None] = {}
    for line in script.splitlines():
        if not line.startswith("#SBATCH --"):
            continue
        name, eq, value = line[len("#SBATCH --"):].partition("=")
        out[name] = unquote_sbatch_word(value) if eq else None
    return out


def sbatch_env_args(script: str, environ: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """sbatch options keeping the script's choices against ``SBATCH_*`` ->
    ``(args, overridden names)``; a memory variable meets any memory option
    (``_validate_memory_options``, ``src/common/slurm_opt.c``).

    Raises:
        InputError: a variable of :data:`NO_UNDO`, or ``SBATCH_EXCLUSIVE``
            without ``--exclusive``, naming the variable, with a hint.
    """
    opts = script_options(script)
    args: list[str] = []
    named: list[str] = []
    for var in sorted(NO_UNDO):
        if var in environ:
            raise InputError("submit", f"{var} is set", f"{var}={environ[var]!r:.60}: {NO_UNDO[var]}",
                             hint=f"unset {var} for gsrun (env -u {var} gsrun ...); gsrun asks for the GPUs itself")
    if environ.get("SBATCH_EXCLUSIVE") is not None and "exclusive" not in opts:
        raise InputError("submit", "SBATCH_EXCLUSIVE is set", "it makes the job exclusive and sbatch has no "
                         "option to undo it", hint="pass --exclusive, or unset SBATCH_EXCLUSIVE")
    mem = [m for m in MEMORY if m in opts]
    for var, opt in SBATCH_ENV.items():
        if var not in environ or opt in ("clusters", "exclusive"):
            continue
        if opt in MEMORY and mem:
            opt = mem[0]
        elif opt == "no-requeue":
            opt = "requeue"
        if opt not in opts:
            continue
        arg = f"--{opt}" if opts[opt] is None else f"--{opt}={opts[opt]}"
        if arg not in args:
            args.append(arg)
        named.append(var)
    return args, named


def submit_environ(environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """sbatch's environment -> ``(env, left out names)``: inside an allocation
    or step (``SLURM_JOB_ID`` set), every ``SLURM_*`` / ``SRUN_*`` variable but
    :data:`KEEP_IN_ALLOCATION` is left out (the new job gets its own from
    Slurm); elsewhere ``environ`` as it is."""
    env = dict(environ)
    if not environ.get("SLURM_JOB_ID"):
        return env, []
    gone = sorted(k for k in environ if (k.startswith("SLURM_") or k.startswith("SRUN_"))
                  and k not in KEEP_IN_ALLOCATION)
    for k in gone:
        del env[k]
    return env, gone


def scrub_note(parent_job: str, gone: list[str]) -> str:
    """The one line that says which parent variables were left out."""
    named = [v for v in RESOURCE_VARS if v in gone]
    rest = len(gone) - len(named)
    shown = ", ".join(named) + (f" and {rest} more" if named and rest else f"{rest} variables" if rest else "")
    return (f"gsrun: submit: note: inside job {parent_job}: the parent job's SLURM_*/SRUN_* variables "
            f"({shown}) are left out of the new job")


def memory_options(mem: str | None, sbatch_options) -> None:
    """Exactly one memory option may reach sbatch: ``--mem`` or one of
    ``--sbatch=--mem-per-cpu=`` / ``--sbatch=--mem-per-gpu=``.

    Raises:
        InputError: two of them, naming both.
    """
    given = (["--mem"] if mem is not None else []) + [f"--sbatch=--{n}" for n, _v in sbatch_options if n in MEMORY]
    if len(given) > 1:
        raise InputError("submit", "two memory requests", " and ".join(given),
                         hint="choose one of --mem (per node), --sbatch=--mem-per-cpu=, --sbatch=--mem-per-gpu=")
