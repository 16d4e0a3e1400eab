"""``gsrun-node install``: directories, site config, hooks, systemd units,
the slurm.conf lines (PrologFlags, a PrologEpilogTimeout from a measured
prolog dry run), the plugstack step and the irqbalance policy script
(docs/ADMIN.md). ``--print`` shows all of it and changes nothing.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable

from gsrun.base.errors import InputError, NodeError
from gsrun.base.fsutil import atomic_write, ensure_dir
from gsrun.base.paths import DEFAULT_STATE_DIR
from gsrun.base.proc import ROOT_CWD, SAFE_PATH, root_python
from gsrun.base.templating import render
from gsrun.node.tuning import IRQ_BAN_DIR
from gsrun.request.config import (Config, DEFAULT_CONFIG_PATH, SETTINGS, _toml_value, load_config,
                                  render_commented_config)
from gsrun.daemon import build as daemon_client, server
from gsrun.admin.node_entry import HOOKS, hook_argv

PHASE = "install"
VERSION_COMMANDS = (("slurmctld", "-V"), ("slurmd", "-V"), ("scontrol", "-V"), ("sinfo", "-V"))
LAYOUTS = ("single", "prolog.d")
DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"
_VERSION_RE = re.compile(r"\bslurm(?:-wlm)?\s+v?([0-9]{2}\.[0-9]{2}\.[0-9]+)", re.I)
_PLAIN_PATH = re.compile(r"^/[A-Za-z0-9_./+@-]{0,4000}$")
MIN_TIMEOUT_S = 60
TIMEOUT_FACTOR = 10
BUDGET_MARGIN_S = 30


# ----------------------------------------------------------------------------- facts

@dataclass(frozen=True)
class SlurmVersion:
    """``version`` "22.05.8" from ``command`` ("slurmctld -V")."""

    version: str
    command: str


def parse_slurm_version(text: str) -> str | None:
    """``"slurm-wlm 22.05.8"`` / ``"slurm 24.11.1"`` -> ``"22.05.8"``; None otherwise."""
    m = _VERSION_RE.search(text or "")
    return m.group(1) if m else None


def detect_slurm_version(timeout_s: float = 5.0, run: Callable = subprocess.run) -> SlurmVersion | None:
    """The version from the first of :data:`VERSION_COMMANDS` answering within
    ``timeout_s`` (daemons first: ``sinfo -V`` on 22.05 needs a slurm.conf)."""
    for argv in VERSION_COMMANDS:
        try:
            p = run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False,
                    env={"PATH": SAFE_PATH, "LANG": "C"}, cwd=ROOT_CWD)
        except (OSError, subprocess.TimeoutExpired):
            continue
        v = parse_slurm_version((p.stdout or "") + " " + (p.stderr or ""))
        if v:
            return SlurmVersion(v, " ".join(argv))
    return None


def parse_slurm_conf(text: str) -> dict[str, str]:
    """slurm.conf -> ``{key.lower(): value}``, first wins, node/partition lines skipped."""
    out: dict[str, str] = {}
    for line in (text or "").splitlines():
        line = line.split("#", 1)[0].strip()
        if "=" not in line:
            continue
        key, value = line.split("=", 1)
        key = key.strip().lower()
        if key in ("nodename", "partitionname", "nodeset", "frontendname", "downnodes"):
            continue
        out.setdefault(key, value.strip().split()[0] if value.strip() else "")
    return out


def read_slurm_conf(environ=None) -> tuple[str | None, dict[str, str]]:
    """(path, settings) of ``$SLURM_CONF`` or ``/etc/slurm/slurm.conf``; ``(None, {})`` if unreadable."""
    environ = os.environ if environ is None else environ
    for p in filter(None, (environ.get("SLURM_CONF"), DEFAULT_SLURM_CONF, "/etc/slurm-llnl/slurm.conf")):
        try:
            return p, parse_slurm_conf(Path(p).read_text(errors="replace"))
        except OSError:
            continue
    return None, {}


@dataclass(frozen=True)
class HookCost:
    """Seconds: ``prolog_s`` the slowest of ``runs`` ``gsrun-node prolog
    --dry-run`` processes; ``epilog_import_s`` importing the epilog's modules;
    ``error`` when a run failed (the numbers are then None)."""

    prolog_s: float | None
    epilog_import_s: float | None
    runs: int
    error: str | None = None

    @property
    def worst_s(self) -> float | None:
        return max((v for v in (self.prolog_s, self.epilog_import_s) if v is not None), default=None)


def dry_run_env(config_path: str | None, base=None) -> dict[str, str]:
    """A fake job 0 as root with a SPANK request (the prolog asks no slurmctld)."""
    base = os.environ if base is None else base
    env = {"PATH": SAFE_PATH, "LANG": "C", "SLURM_JOB_ID": "0", "SLURM_JOB_UID": "0",
           "SLURM_JOB_GID": "0", "SLURM_JOB_USER": "root", "SLURMD_NODENAME": "gsrun-install",
           "SPANK_GS_REPORT": "1"}
    env.update({k: base[k] for k in ("GSRUN_HOST_ROOT", "SLURM_CONF") if base.get(k)})
    if config_path:
        env["GSRUN_CONFIG"] = config_path
    return env


def measure_hook_cost(config_path: str | None, runs: int = 3, timeout_s: float = 60.0,
                      python: str = sys.executable, run: Callable = subprocess.run,
                      clock: Callable[[], float] = time.monotonic) -> HookCost:
    """Time ``runs`` prolog dry runs and one epilog import, each within
    ``timeout_s``, as root children (:func:`gsrun.base.proc.root_python`, cwd /)."""
    kw = {"capture_output": True, "text": True, "timeout": timeout_s, "env": dry_run_env(config_path), "check": False,
          "stdin": subprocess.DEVNULL, "cwd": ROOT_CWD}
    worst = 0.0
    try:
        for _ in range(runs):
            t0 = clock()
            p = run(root_python("-m", "gsrun.admin.node", "prolog", "--dry-run", python=python), **kw)
            dt = clock() - t0
            if p.returncode != 0:
                tail = (p.stderr or p.stdout or "").strip().splitlines()[-1:] or [""]
                return HookCost(None, None, runs, f"prolog --dry-run exited {p.returncode}: {tail[0][:200]}")
            worst = max(worst, dt)
        t0 = clock()
        p = run(root_python("-c", "import gsrun.epilog.main, gsrun.epilog.ctld, gsrun.report.summary, "
                                  "gsrun.report.render", python=python), **kw)
        imp = clock() - t0
        if p.returncode != 0:
            return HookCost(worst, None, runs, f"epilog import failed: {(p.stderr or '').strip()[-200:]}")
    except subprocess.TimeoutExpired:
        return HookCost(None, None, runs, f"a measurement run took longer than {timeout_s:g} s")
    except OSError as e:
        return HookCost(None, None, runs, f"cannot run {python}: {e.strerror}")
    return HookCost(round(worst, 3), round(imp, 3), runs)


@dataclass(frozen=True)
class Installation:
    python: str
    gsrun_node: str


def find_installation(python: str = sys.executable) -> Installation:
    """``<dir of python>/gsrun-node`` (else the one on PATH)."""
    node = Path(python).parent / "gsrun-node"
    if not node.exists():
        found = shutil.which("gsrun-node")
        node = Path(found) if found else node
    return Installation(python, str(node))


def _same_install(gsrun_node: str) -> bool:
    """``gsrun_node``'s shebang is in this interpreter's bin directory."""
    try:
        with open(gsrun_node, "rb") as f:
            first = f.readline(4096)
    except OSError:
        return False
    # same bin directory = same venv (realpath would equate every venv of one base interpreter)
    return first.startswith(b"#!") and os.path.dirname(first[2:].strip().decode(errors="replace")) \
        == os.path.dirname(os.path.abspath(sys.executable))


# ----------------------------------------------------------------------------- decisions

@dataclass(frozen=True)
class DirSpec:
    path: str
    mode: int
    why: str


def plan_dirs(cfg: Config, state_dir: str | None = None, spool_dir: str | None = None,
              mps_dir: str | None = None) -> list[DirSpec]:
    """Directories to create, parents first, all owned by root. Pure."""
    state = state_dir or cfg["paths.state_dir"]
    spool = spool_dir or cfg["paths.spool_dir"]
    mps = mps_dir or cfg["paths.mps_dir"]
    out = [DirSpec(state, 0o755, "node state: tuning journal, locks (tmpfs is right: reboot resets the node)"),
           DirSpec(os.path.join(state, "jobs"), 0o700, "per-job sampler state and journals (root only)"),
           DirSpec(spool, 0o755, "node/job summaries and the mail queue (persistent)"),
           DirSpec(os.path.join(spool, "jobs"), 0o711, "per-job summaries (traversable, not listable)"),
           DirSpec(os.path.join(spool, "mail"), 0o700, "mail queue (root only)"),
           DirSpec(mps, 0o711, "parent of per-job MPS pipe/log directories")]
    uniq: dict[str, DirSpec] = {}
    for d in out:
        uniq.setdefault(d.path, d)
    return list(uniq.values())


def prolog_flags(existing: str | None, proctrack: str | None) -> tuple[str, str]:
    """The ``PrologFlags`` value and why: the site's flags plus ``Alloc``, and
    ``Contain`` under ``proctrack/cgroup``."""
    flags = [f for f in (existing or "").split(",") if f and f.lower() != "none"]
    low = {f.lower() for f in flags}
    why = ("Alloc runs the prolog on every allocated node when the job is allocated, not at its "
           "first step, so tuning, MPS and the sampler are in place before the batch script starts "
           "and every node records a summary")
    if "alloc" not in low:
        flags.append("Alloc")
    if proctrack and proctrack.strip().lower() == "proctrack/cgroup" and "contain" not in low:
        flags.append("Contain")
        why += ("; Contain because ProctrackType=proctrack/cgroup: the job's cgroup (the "
                "'extern' step) exists from allocation, so the sampler can find it")
    if existing and existing.lower() != "none":
        why += f"; kept your flags ({existing})"
    return ",".join(flags), why


def recommend_timeout_s(cost: HookCost, cfg: Config, current: str | None = None) -> tuple[int, str]:
    """``PrologEpilogTimeout`` (s) and why: the largest of the minimum, the
    factor x the measured cost and each hook budget + margin (a prolog Slurm
    kills drains the node), rounded up to 10 s."""
    prolog_b = float(cfg["timeouts.prolog_budget_s"])
    epilog_b = float(cfg["timeouts.epilog_budget_s"])
    cands = {"minimum": MIN_TIMEOUT_S,
             "prolog budget + margin": prolog_b + BUDGET_MARGIN_S,
             "epilog budget + margin": epilog_b + BUDGET_MARGIN_S}
    worst = cost.worst_s
    if worst is not None:
        cands[f"{TIMEOUT_FACTOR} x measured {worst:.2f} s"] = TIMEOUT_FACTOR * worst
    name, value = max(cands.items(), key=lambda kv: kv[1])
    t = int(math.ceil(value / 10.0) * 10)
    parts = [f"measured prolog dry run {cost.prolog_s:.2f} s, epilog imports {cost.epilog_import_s:.2f} s"
             if worst is not None else f"not measured ({cost.error})",
             f"budgets {prolog_b:g}/{epilog_b:g} s (timeouts.prolog_budget_s/epilog_budget_s)",
             f"{t} s = max(60, {TIMEOUT_FACTOR} x measured, budget + {BUDGET_MARGIN_S} s), from {name}"]
    with suppress(ValueError):
        if current and int(current) < t:
            parts.append(f"your current {current} s is too short")
    return t, "; ".join(parts)


def _slurm_user(user: str | None) -> str | None:
    if user and not _USER_NAME.match(user):
        raise InputError(PHASE, "SlurmUser", repr(user[:40]), hint="fix slurm.conf's SlurmUser=")
    return user


def _check_plain(path: str, what: str) -> str:
    if not _PLAIN_PATH.match(path) or ".." in path.split("/"):
        raise InputError(PHASE, what, f"{path!r} must be an absolute path of [A-Za-z0-9_./+@-]",
                         hint="slurm.conf and systemd units have no quoting for other characters")
    return path


def render_slurm_lines(slurm_version: str, hooks: dict[str, str], flags: str, flags_why: str,
                       timeout_s: int, timeout_why: str, layout: str = "single",
                       prolog_d: str = "/etc/slurm/prolog.d", epilog_d: str = "/etc/slurm/epilog.d",
                       link_name: str = "50-gsrun") -> str:
    """The slurm.conf block; ``hooks``: hook (:data:`HOOKS`) -> path. Raises
    InputError for an unknown layout or a path slurm.conf cannot hold."""
    if layout not in LAYOUTS:
        raise InputError(PHASE, "layout", repr(layout), hint=f"one of {', '.join(LAYOUTS)}")
    for k, v in hooks.items():
        _check_plain(v, f"{k} hook path")
    _check_plain(prolog_d, "prolog.d")
    _check_plain(epilog_d, "epilog.d")
    return render("slurm.conf.j2",
        slurm_version=slurm_version, prolog=hooks["prolog"], epilog=hooks["epilog"],
        epilog_ctld=hooks["epilog-ctld"], prolog_flags=flags, prolog_flags_why=flags_why,
        timeout_s=timeout_s, timeout_why=timeout_why, layout=layout, prolog_d=prolog_d.rstrip("/"),
        epilog_d=epilog_d.rstrip("/"), link_name=link_name)


_USER_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


def ctld_daemon(conf: dict[str, str], node_socket: str) -> tuple[str | None, str]:
    """Where EpilogSlurmctld (run as ``SlurmUser``) reaches the daemon:
    ``(None, node_socket)`` for root, else ``(user, <dir>/ctld.sock)``.

    Raises:
        InputError: SlurmUser is not a plain user name.
    """
    user = (conf.get("slurmuser") or "root").strip()
    if user in ("root", "0"):
        return None, node_socket
    return _slurm_user(user), os.path.join(os.path.dirname(node_socket), server.CTLD_SOCKET_NAME)


def render_units(gsrun_node: str, config_path: str | None,
                 daemon_socket: str | None = None, ctld_user: str | None = None) -> dict[str, str]:
    """unit name -> text: mail, prune and weekly report services and timers,
    and with ``daemon_socket`` ``gsrun-daemon.service`` (``--ctld-user`` for
    ``ctld_user``); ``GSRUN_CONFIG`` only for a non-default config path."""
    _check_plain(gsrun_node, "gsrun-node path")
    cfgp = _check_plain(config_path, "config path") if config_path and config_path != DEFAULT_CONFIG_PATH else None
    report = os.path.join(os.path.dirname(gsrun_node), "gsrun-report")
    units = {}
    for name in ("mail", "prune", "report"):
        units[f"gsrun-{name}.service"] = render(f"gsrun-{name}.service.j2", gsrun_node=gsrun_node,
                                                gsrun_report=report, config_path=cfgp)
        units[f"gsrun-{name}.timer"] = render(f"gsrun-{name}.timer.j2")
    if daemon_socket:
        sock = _check_plain(daemon_socket, "daemon socket path")
        parent = os.path.dirname(sock)
        runtime = parent[len("/run/"):] if parent.startswith("/run/") and "/" not in parent[len("/run/"):] else None
        units["gsrun-daemon.service"] = render("gsrun-daemon.service.j2", gsrun_node=gsrun_node, config_path=cfgp,
                                               socket_path=sock, runtime_dir=runtime,
                                               ctld_user=_slurm_user(ctld_user))
    return units


def render_hook(gsrun_node: str, command: str, config_path: str | None, log_file: str | None = None,
                slurm_conf: str | None = None, argv: list[str] | None = None,
                via_daemon: tuple[str, str] | None = None, state_dir: str | None = None) -> str:
    """A hook script running this installation's ``gsrun-node`` (or ``argv``,
    :func:`gsrun.admin.node_entry.hook_argv`, ~3 ms faster) with the
    non-default ``GSRUN_CONFIG``, ``GSRUN_LOG_FILE``, ``SLURM_CONF`` (not
    passed to EpilogSlurmctld by slurmctld) and ``GSRUN_STATE_DIR`` set;
    ``via_daemon``: ``(client, socket)`` of ``gsrun-hook`` to go through."""
    if command not in HOOKS:
        raise InputError(PHASE, "hook", repr(command))
    env = ""
    for name, value, default, what in (("GSRUN_CONFIG", config_path, DEFAULT_CONFIG_PATH, None),
                                       ("GSRUN_LOG_FILE", log_file, None, "log file"),
                                       ("SLURM_CONF", slurm_conf, DEFAULT_SLURM_CONF, "slurm.conf path"),
                                       ("GSRUN_STATE_DIR", state_dir, DEFAULT_STATE_DIR, "state dir")):
        if value and value != default:
            env += f"{name}={shlex.quote(_check_plain(value, what) if what else value)} "
    run = f"{shlex.quote(gsrun_node)} {command}"
    if argv:
        if argv[-1] != command:
            raise InputError(PHASE, "hook argv", repr(argv[-1]))
        _check_plain(argv[0], "interpreter path")
        _check_plain(argv[-2], "site-packages path")
        run = " ".join(shlex.quote(a) for a in argv)
    if via_daemon:
        client, sock = (_check_plain(p, what) for p, what in zip(via_daemon, ("hook client path", "daemon socket")))
        run = f"{shlex.quote(client)} {shlex.quote(sock)} {run}"
    return ("#!/bin/sh\n"
            f"# gsrun Slurm hook written by `gsrun-node install`: runs `gsrun-node {command}`.\n"
            f"{env}exec {run}\n")


def render_config_reference() -> str:
    """docs/CONFIG.md from :data:`gsrun.request.config.SETTINGS`."""
    def typename(t) -> str:
        ts = t if isinstance(t, tuple) else (t,)
        names = {int: "integer", float: "number", bool: "boolean", str: "string", list: "list", dict: "table"}
        if set(ts) == {int, float}:
            return "number"
        return "/".join(names.get(x, x.__name__) for x in ts)

    def cell(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ")

    lines = ["# gsrun configuration reference", "",
             "<!-- Generated from gsrun/config.py SETTINGS by `gsrun-node config reference`;",
             "     do not edit. Regenerate: gsrun-node config reference > docs/CONFIG.md -->", "",
             f"File: `{DEFAULT_CONFIG_PATH}` (or `$GSRUN_CONFIG`), TOML, parsed strictly: an unknown",
             "section or key, a wrong type or a value out of range is an error that names the key.",
             "Check a file with `gsrun-node config check [--file PATH]`; `gsrun-node install` writes a",
             "commented file with every key at its default.", "",
             "Keys marked *per partition* may be overridden for the jobs of one partition:", "",
             "```toml", "[partition.gpu.tuning]", "defaults = \"governor=performance,swappiness=10\"", "```", ""]
    for sec, group in itertools.groupby(SETTINGS, key=lambda s: s.key.split(".", 1)[0]):
        lines += [f"## [{sec}]", "", "| key | type | default | allowed | per partition | meaning |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for s in group:
            lines.append(f"| `{s.key.split('.', 1)[1]}` | {typename(s.type)} | `{cell(_toml_value(s.default))}` | "
                         f"{cell(s.allowed)} | {'yes' if s.per_partition else ''} | {cell(s.meaning)} |")
        lines.append("")
    return "\n".join(lines)


def config_text(state_dir: str | None = None, spool_dir: str | None = None) -> str:
    """The commented config with ``state_dir``/``spool_dir`` given set (``mps_dir`` follows)."""
    text = render_commented_config()
    set_ = {}
    if state_dir:
        set_["state_dir"] = _check_plain(state_dir, "state dir")
        set_["mps_dir"] = os.path.join(state_dir, "mps")
    if spool_dir:
        set_["spool_dir"] = _check_plain(spool_dir, "spool dir")
    for key, value in set_.items():
        text = re.sub(rf"^# {key} = .*$", f"{key} = {json.dumps(value)}", text, count=1, flags=re.M)
    return text


# ----------------------------------------------------------------------------- effects

def apply_dirs(dirs: list[DirSpec]) -> list[str]:
    """Create/fix each directory with :func:`gsrun.base.fsutil.ensure_dir`
    (parents 0755); one line each."""
    out = []
    for d in dirs:
        p = Path(d.path)
        existed = p.is_dir()
        if not p.parent.exists():
            p.parent.mkdir(parents=True, mode=0o755, exist_ok=True)
        ensure_dir(p, d.mode, 0, 0)
        out.append(f"{'ok     ' if existed else 'created'} {d.path} {oct(d.mode)[2:].zfill(4)}")
    return out


def write_new_file(path: str, text: str, mode: int) -> bool:
    """Write ``path`` only when nothing is there (``O_EXCL|O_NOFOLLOW``,
    parents 0755); False when something was."""
    p = Path(path)
    p.parent.mkdir(parents=True, mode=0o755, exist_ok=True)
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(p, mode)
    return True


def write_and_say(path: str, text: str, mode: int, out: Callable[[str], None], said: str = "",
                  new_only: bool = False, print_only: bool = False) -> int:
    """Write ``path`` (parents 0755; root-owned as root; ``new_only``:
    :func:`write_new_file`) and say ``wrote PATH<said>``, or with ``print_only``
    only show it; 1 when writing failed (said)."""
    if print_only:
        out(f"would write {path} ({mode:04o}):\n{text}")
        return 0
    root = os.geteuid() == 0
    try:
        if new_only:
            write_new_file(path, text, mode)
        else:
            Path(path).parent.mkdir(parents=True, mode=0o755, exist_ok=True)
            atomic_write(path, text, mode, 0 if root else None, 0 if root else None)
    except OSError as e:
        out(f"FAILED: cannot write {path}: {e.strerror}")
        return 1
    out(f"wrote {path}{said}")
    return 0


# ----------------------------------------------------------------------------- the command

@dataclass
class InstallOptions:
    print_only: bool = False
    config_path: str | None = None
    state_dir: str | None = None
    spool_dir: str | None = None
    layout: str = "single"
    hooks_dir: str | None = None
    log_file: str | None = None
    units_dir: str | None = None
    prolog_d: str = "/etc/slurm/prolog.d"
    epilog_d: str = "/etc/slurm/epilog.d"
    measure: bool = True
    irqbalance_script: str | None = None     # None: tuning.irqbalance_policy_script


def render_irqbalance_lines(script: str, ban_dir: str, default_ban_dir: str) -> str:
    """The irqbalance option that runs gsrun's policy script (and
    ``GSRUN_IRQ_BAN_DIR`` when not the default)."""
    env = "" if ban_dir == default_ban_dir else f" GSRUN_IRQ_BAN_DIR={ban_dir}"
    return "\n".join([
        "# irq=local is applied while irqbalance runs only when irqbalance was started with this script:",
        f"#   option: --policyscript={script}",
        "systemctl edit irqbalance   # add:",
        "#   [Service]",
        f"#   Environment=IRQBALANCE_ARGS=--policyscript={script}" + (f"\n#   Environment={env.strip()}" if env else ""),
        f"# (Debian/Ubuntu: IRQBALANCE_ARGS=\"--policyscript={script}\" in /etc/default/irqbalance)",
        "systemctl restart irqbalance   # once; check with: gsrun-node doctor (irq)",
    ]) + "\n"


def run(opts: InstallOptions, out: Callable[[str], None] = print, environ=None) -> int:
    """``gsrun-node install``: 0, or 1 when something could not be done (said).

    Raises:
        ConfigError: an existing config file does not parse (fix it first).
        InputError: a bad layout or a path slurm.conf cannot hold.
    """
    environ = os.environ if environ is None else environ
    if opts.layout not in LAYOUTS:
        raise InputError(PHASE, "layout", repr(opts.layout), hint=f"one of {', '.join(LAYOUTS)}")
    config_path = opts.config_path or environ.get("GSRUN_CONFIG") or DEFAULT_CONFIG_PATH
    _check_plain(config_path, "config path")
    rc = 0
    have_config = Path(config_path).exists()
    cfg = load_config(config_path) if have_config else Config()
    inst = find_installation()
    out(f"# gsrun-node install{' --print (nothing is changed)' if opts.print_only else ''}")
    out(f"# installation: {inst.gsrun_node} (python {inst.python})")

    # 1. directories
    out("\n## 1. directories")
    mps_dir = os.path.join(opts.state_dir, "mps") if opts.state_dir and not have_config else None
    dirs = plan_dirs(cfg, opts.state_dir, opts.spool_dir, mps_dir)
    if opts.print_only:
        for d in dirs:
            out(f"would create {d.path} root {oct(d.mode)[2:].zfill(4)}  # {d.why}")
    else:
        try:
            for line in apply_dirs(dirs):
                out(line)
        except (OSError, NodeError) as e:
            out(f"FAILED: {e}")
            rc = 1
    if dirs[0].path.startswith("/run/"):
        out(f"# {dirs[0].path} is on tmpfs: the prolog recreates it after a reboot")

    # 2. config
    out("\n## 2. site config")
    text = config_text(opts.state_dir, opts.spool_dir)
    if have_config:
        out(f"{config_path} exists: left as it is (check it: gsrun-node config check --file {config_path})")
        for flag, key, given in (("--state-dir", "paths.state_dir", opts.state_dir),
                                 ("--spool-dir", "paths.spool_dir", opts.spool_dir)):
            if given and os.path.normpath(given) != os.path.normpath(cfg[key]):
                out(f"WARNING: {flag} {given} differs from {key} = {cfg[key]} in {config_path}; "
                    "the hooks use the file: edit it")
    else:
        rc = max(rc, write_and_say(config_path, text, 0o644, out, ": every setting at its default, commented out",
                                   new_only=True, print_only=opts.print_only))
    cfg_env = config_path if config_path != DEFAULT_CONFIG_PATH else None

    conf_path, conf = read_slurm_conf(environ)
    slurm_conf_env = conf_path if conf_path and conf_path != DEFAULT_SLURM_CONF else None
    state_dir = opts.state_dir or cfg["paths.state_dir"]
    state_env = state_dir if state_dir != DEFAULT_STATE_DIR else None

    # 3. hooks
    out("\n## 3. hooks")
    hd = _check_plain(os.path.abspath(opts.hooks_dir or str(Path(inst.gsrun_node).parent.parent / "libexec" / "gsrun")),
                      "hooks dir")
    daemon_socket = os.path.join(state_dir, server.SOCKET_NAME)
    rc = max(rc, _install_hook_client(hd, daemon_socket, opts.print_only, out))
    via = (os.path.join(hd, daemon_client.CLIENT_NAME), daemon_socket)
    ctld_user, ctld_socket = ctld_daemon(conf, daemon_socket)
    if ctld_user:
        out(f"# EpilogSlurmctld runs as SlurmUser={ctld_user}: its hook goes to the root daemon's "
            f"{ctld_socket}, open to that user (--ctld-user in gsrun-daemon.service, step 6)")
    hooks = {name: os.path.join(hd, f"gsrun-{name}") for name in HOOKS}
    for name, p in hooks.items():
        body = render_hook(inst.gsrun_node, name, cfg_env, opts.log_file, slurm_conf_env,
                           hook_argv(name) if _same_install(inst.gsrun_node) else None,
                           (via[0], ctld_socket) if name == "epilog-ctld" else via, state_env)
        rc = max(rc, write_and_say(p, body, 0o755, out, print_only=opts.print_only))

    # 4. slurm.conf
    sv = detect_slurm_version()
    out(f"\n## 4. slurm.conf (Slurm {sv.version + ' from ' + repr(sv.command) if sv else 'not found on this host'}"
        f"{'; read ' + conf_path if conf_path else ''})")
    if conf.get("prolog") and "gsrun" not in conf["prolog"] and opts.layout == "single":
        out(f"# NOTE: you already have Prolog={conf['prolog']}; use --layout prolog.d to run both")
    flags, flags_why = prolog_flags(conf.get("prologflags"), conf.get("proctracktype"))
    cost = (measure_hook_cost(config_path if Path(config_path).exists() else None)
            if opts.measure else HookCost(None, None, 0, "skipped (--no-measure)"))
    timeout_s, timeout_why = recommend_timeout_s(cost, cfg, conf.get("prologepilogtimeout"))
    out(render_slurm_lines(sv.version if sv else "?", hooks, flags, flags_why, timeout_s, timeout_why,
                           opts.layout, opts.prolog_d, opts.epilog_d))

    # 5. plugstack
    out("## 5. SPANK plugin (optional: --gs-* options on sbatch/srun/salloc)")
    out("# build it against this Slurm's headers (libslurm-dev) and this Python, then install:")
    out(f"{inst.gsrun_node} spank build --out-dir /usr/local/lib/gsrun")
    out(f"{inst.gsrun_node} spank install --so /usr/local/lib/gsrun/gsrun_spank.so "
        "--dest-dir /usr/local/lib/gsrun --plugstack /etc/slurm/plugstack.conf.d/gsrun.conf"
        + (f" --arg config={cfg_env}" if cfg_env else "")
        + f" --arg daemon={daemon_socket}")
    if cfg_env:
        out("# config=: slurmstepd's environment has no GSRUN_CONFIG; without it the steps read "
            f"{DEFAULT_CONFIG_PATH}")
    out("# daemon=: the node daemon's socket (step 6), where slurmstepd gets every step's plan "
        "(binding, MIG devices, --gs-mps)")
    out("# and make sure /etc/slurm/plugstack.conf has:  include /etc/slurm/plugstack.conf.d/*.conf")

    # 6. node daemon, mail timer
    out("\n## 6. node daemon (on every node and the slurmctld host); mail delivery and spool pruning "
        "timers (on the slurmctld host)")
    units = render_units(inst.gsrun_node, cfg_env, daemon_socket, ctld_user)
    enable = ("systemctl enable --now gsrun-daemon.service  # everywhere; then on the slurmctld host: "
              "systemctl enable --now gsrun-mail.timer gsrun-prune.timer")
    if opts.units_dir and not opts.print_only:
        for name, body in units.items():
            p = os.path.join(opts.units_dir, name)
            out(f"{'wrote' if write_new_file(p, body, 0o644) else 'exists, left as it is:'} {p}")
        out("systemctl daemon-reload && " + enable)
        if not os.path.isdir("/run/systemd/system"):
            out("# PID 1 here is not systemd: start what the units start yourself (docs/ADMIN.md, "
                "\"Hosts without systemd\"): " + units["gsrun-daemon.service"].split("ExecStart=", 1)[1]
                .split("\n", 1)[0])
    elif opts.print_only:
        for name, body in units.items():
            out(f"# /etc/systemd/system/{name}\n{body}")
        out("# then: systemctl daemon-reload && " + enable)
    else:
        out(f"# not written: {', '.join(units)}; --units-dir /etc/systemd/system writes them, "
            "--print shows them")
    # 7. irqbalance policy script
    rc = max(rc, _install_irqbalance_script(opts, cfg, out))
    out("\n## next: gsrun-node doctor   (on every node)")
    return rc


def _install_hook_client(hooks_dir: str, daemon_socket: str, print_only: bool, out: Callable[[str], None]) -> int:
    """Build ``gsrun-hook`` into ``hooks_dir``; 1 when that failed (said)."""
    client = os.path.join(hooks_dir, daemon_client.CLIENT_NAME)
    if print_only:
        out(f"would build {client} (the node daemon's client; needs cc)")
        return 0
    try:
        daemon_client.build(hooks_dir)
    except (OSError, NodeError) as e:
        out(f"FAILED: cannot build {client}: {str(e).splitlines()[0]}\n"
            "hint: install a C compiler (apt install gcc) and run install again; the hooks need it")
        return 1
    out(f"built {client}: the hooks go through the node daemon on {daemon_socket} (step 6)")
    return 0


def _install_irqbalance_script(opts: InstallOptions, cfg: Config, out: Callable[[str], None]) -> int:
    """Step 7: write ``templates/irqbalance-policy.sh`` (root 0755) and print the option."""
    script = _check_plain(os.path.abspath(opts.irqbalance_script or cfg["tuning.irqbalance_policy_script"]),
                          "irqbalance script path")
    out("\n## 7. irqbalance policy script (optional: irq=local while irqbalance runs)")
    body = (resources.files("gsrun.templates") / "irqbalance-policy.sh").read_text()
    rc = 0
    if opts.print_only:
        out(f"would write {script} (root 0755): gsrun's irqbalance policy script")
    elif os.geteuid() != 0 and not opts.irqbalance_script:
        out(f"# not root: {script} not written (run gsrun-node install as root)")
    else:
        rc = write_and_say(script, body, 0o755, out, " (0755)")
    if script != cfg["tuning.irqbalance_policy_script"]:
        out(f"# set tuning.irqbalance_policy_script = \"{script}\" in the site config (the prolog looks for it there)")
    out(render_irqbalance_lines(script, cfg["tuning.irqbalance_ban_dir"], IRQ_BAN_DIR).rstrip("\n"))
    return rc
