"""A per-job NVIDIA MPS control daemon, started by the prolog as the job's
user and gone after the epilog. Layout (field case 19, docs/field-cases.md)::

    <mps_dir>                 root:root  0711  (traversable, not listable)
    <mps_dir>/<jobid>/        uid:gid    0700  a tmpfs of its own (JOB_DIR_BYTES, JOB_DIR_INODES)
    <mps_dir>/<jobid>/pipe/   uid:gid    0700  CUDA_MPS_PIPE_DIRECTORY
    <mps_dir>/<jobid>/log/    uid:gid    0700  CUDA_MPS_LOG_DIRECTORY
    <state_dir>/mps-<jobid>.json          root 0600  journal (gsrun.node.journal, kind "mps")

The job directory, the one place of root's files the user writes, is a
capped tmpfs so a job cannot fill ``/run``; every ancestor must be traversable
by the user (a 0700 parent crash-loops the server: bottlerocket #4673). The
daemon gets an allow-listed environment with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``
(field case 10). :func:`stop` never signals by name alone (field cases 17-19).
The real daemon (H200, driver 580, CUDA 13.0) leaves ``pipe/{control,
control_lock, control_privileged, log, nvidia-cuda-mps-control.pid}`` and
``log/{control.log, server.log}``; its comm name is ``nvidia-cuda-mps``.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from contextlib import suppress
from pathlib import Path
from typing import Callable, Iterable, Mapping

import psutil

from gsrun.base.errors import InputError, NodeError
from gsrun.base.ids import check_job_id
from gsrun.request.mps_share import parse_mps_share
from gsrun.base.fsutil import ensure_dir, remove_tree
from gsrun.node.journal import Journal

JOURNAL_SCHEMA = "gsrun.mps/1"
PID_FILE = "nvidia-cuda-mps-control.pid"
CONTROL_SOCKET = "control"
MPS_NAME_PREFIX = "nvidia-cuda-mps"
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# NVML compute modes (nvmlDeviceGetComputeMode / nvmlDeviceSetComputeMode).
COMPUTE_MODE_DEFAULT = 0
COMPUTE_MODE_EXCLUSIVE_PROCESS = 3

# Variables copied from the caller's environment into the daemon's (when valid).
ENV_PASS = ("LANG", "LC_ALL", "TZ")

_GPU_RE = re.compile(r"^(?:[0-9]{1,3}|GPU-[0-9a-fA-F-]{8,64}|MIG-[0-9A-Za-z/-]{4,80})$")
_PINNED_RE = re.compile(r"^[0-9]{1,3}=[0-9]{1,7}[MG](?:,[0-9]{1,3}=[0-9]{1,7}[MG])*$")
_ENV_VALUE_RE = re.compile(r"^[A-Za-z0-9_.:/@+-]{0,128}$")
_TERM_WAIT_S = 3.0
_KILL_WAIT_S = 3.0
_POLL_S = 0.05


# ---------------------------------------------------------------- decisions

def requested_pct(environ: Mapping[str, str], option_value: str | None) -> int | None:
    """The active thread percentage a job asked for, 1-100, or None: the
    smaller of ``option_value`` (``--gs-mps[=PCT]``; None: ``SPANK_GS_MPS``;
    ``""``: no PCT) and Slurm's ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``.

    Raises:
        InputError: not an integer 1-100 (``--gs-mps=150``; likely a typo).
    """
    opt = option_value if option_value is not None else environ.get("SPANK_GS_MPS")
    pct_opt = parse_mps_share(opt, "--gs-mps") if opt is not None else None
    slurm = environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    pct_slurm = parse_mps_share(slurm, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") if slurm else None
    vals = [v for v in (pct_opt, pct_slurm) if v is not None]
    return min(vals) if vals else None


def task_env(job_id: str, mps_dir: str) -> dict[str, str]:
    """The tasks' ``CUDA_MPS_PIPE_DIRECTORY`` / ``CUDA_MPS_LOG_DIRECTORY``.

    Raises:
        InputError: ``job_id`` is not a Slurm job id (digits).
    """
    check_job_id(job_id, phase="mps")
    d = Path(mps_dir) / job_id
    return {"CUDA_MPS_PIPE_DIRECTORY": str(d / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(d / "log")}


def journal_path(job_id: str, state_dir: str) -> Path:
    check_job_id(job_id, phase="mps")
    return Path(state_dir) / f"mps-{job_id}.json"


def daemon_env(user_env: Mapping[str, str], gpus: list[str], pipe_dir: str, log_dir: str,
               active_thread_pct: int | None, pinned_mem_limit: str | None,
               caller_env: Mapping[str, str]) -> dict[str, str]:
    """The daemon's whole environment (pure): fixed PATH, the user's HOME/USER/
    LOGNAME, harmless LANG/LC_ALL/TZ from ``caller_env``, the MPS variables."""
    env = {"PATH": SAFE_PATH, **user_env}
    env.update((k, v) for k in ENV_PASS if (v := caller_env.get(k)) is not None and _ENV_VALUE_RE.fullmatch(v))
    env.update(CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES=",".join(gpus),
               CUDA_MPS_PIPE_DIRECTORY=pipe_dir, CUDA_MPS_LOG_DIRECTORY=log_dir)
    if active_thread_pct is not None:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(active_thread_pct)
    if pinned_mem_limit:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = pinned_mem_limit
    return env


def _check_inputs(gpus, active_thread_pct, pinned_mem_limit, timeout_s) -> None:
    if not gpus:
        raise InputError("mps", "no GPUs", "an MPS daemon needs the job's GPUs",
                         hint="the job holds no GPU on this node; drop --gs-mps")
    for g in gpus:
        if not isinstance(g, str) or not _GPU_RE.fullmatch(g):
            raise InputError("mps", "bad GPU identifier", repr(g),
                             hint="use NVML indices or GPU-/MIG- UUIDs")
    if active_thread_pct is not None and (
            isinstance(active_thread_pct, bool) or not isinstance(active_thread_pct, int)
            or not 1 <= active_thread_pct <= 100):
        raise InputError("mps", "bad active thread percentage", repr(active_thread_pct),
                         hint="an integer from 1 to 100")
    if pinned_mem_limit and not _PINNED_RE.fullmatch(pinned_mem_limit):
        raise InputError("mps", "bad pinned memory limit", repr(pinned_mem_limit),
                         hint="form N=SIZE[MG],..., e.g. 0=16G,1=16G")
    if not timeout_s or timeout_s <= 0:
        raise InputError("mps", "bad timeout", repr(timeout_s))


# ---------------------------------------------------------------- facts

def _user_facts(uid: int, gid: int) -> tuple[dict[str, str], list[int]]:
    """HOME/USER/LOGNAME and the groups of ``uid``; without a passwd entry HOME=/ and ``gid``."""
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return {"HOME": "/"}, [gid]
    env = {"HOME": pw.pw_dir or "/", "USER": pw.pw_name, "LOGNAME": pw.pw_name}
    try:
        groups = os.getgrouplist(pw.pw_name, gid)
    except OSError:
        groups = [gid]
    return env, sorted(set(groups))


def _traversable(st: os.stat_result, uid: int, groups: Iterable[int]) -> bool:
    if uid == 0:
        return True
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid in groups:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def _is_mps_process(p: psutil.Process) -> bool:
    try:
        if p.name().startswith(MPS_NAME_PREFIX):
            return True
        return any(os.path.basename(a).startswith(MPS_NAME_PREFIX) for a in p.cmdline()[:2])
    except (psutil.Error, OSError):
        return False


def _gone(p: psutil.Process) -> bool:
    try:
        return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def _proc_key(p: psutil.Process) -> dict:
    return {"pid": p.pid, "create_time": p.create_time()}


def _recorded(entries: Iterable[dict], uid: int | None) -> list[psutil.Process]:
    """Journal PIDs still the same process (creation time) of ``uid``, with their descendants."""
    out = []
    for e in entries or ():
        with suppress(psutil.Error, KeyError, TypeError, ValueError):
            p = psutil.Process(int(e["pid"]))
            if abs(p.create_time() - float(e["create_time"])) > 0.01:
                continue  # PID reused by an unrelated process
            if uid is not None and p.uids().real != uid:
                continue
            out.append(p)
            out.extend(c for c in p.children(recursive=True)
                       if uid is None or c.uids().real == uid)
    return out


def find_job_processes(pipe_dir: str, uid: int | None,
                       recorded: Iterable[dict] = ()) -> list[psutil.Process]:
    """Live (not zombie) processes of one job's MPS daemon: recorded PIDs
    (same creation time and uid) with their descendants, and ``nvidia-cuda-mps*``
    processes of ``uid`` whose ``CUDA_MPS_PIPE_DIRECTORY`` is ``pipe_dir``."""
    want = os.path.normpath(pipe_dir)
    found: dict[int, psutil.Process] = {p.pid: p for p in _recorded(recorded, uid)}
    for p in psutil.process_iter():
        if p.pid in found or p.pid == os.getpid():
            continue
        try:
            if uid is not None and p.uids().real != uid:
                continue
            if not _is_mps_process(p):
                continue
            v = p.environ().get("CUDA_MPS_PIPE_DIRECTORY")
        except (psutil.Error, OSError):
            continue
        if v and os.path.normpath(v) == want:
            found[p.pid] = p
    return [p for p in found.values() if not _gone(p)]


def _read_pid_file(pipe_dir: str) -> int | None:
    """PID from the user's ``<pipe>/nvidia-cuda-mps-control.pid``: only a hint to confirm."""
    try:
        fd = os.open(os.path.join(pipe_dir, PID_FILE), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = os.read(fd, 64)
    finally:
        os.close(fd)
    m = re.fullmatch(rb"\s*([0-9]{1,10})\s*", raw)
    return int(m.group(1)) if m else None


# ---------------------------------------------------------------- effects

def _as_user_kwargs(uid: int, gid: int, groups: list[int]) -> dict:
    """subprocess kwargs that drop to uid/gid/groups in the child before exec."""
    if os.geteuid() == 0:
        return {"user": uid, "group": gid, "extra_groups": groups}
    if uid != os.geteuid():
        raise NodeError("mps", "cannot switch user",
                        f"running as uid {os.geteuid()}, the job's uid is {uid}",
                        hint="the prolog/epilog must run as root")
    return {}


def _journal(path: Path) -> Journal:
    """The job's MPS journal (root 0600); unlocked: only the job's own hooks
    (serialised by slurmd) and ``gsrun-node restore`` write it."""
    return Journal(path, "mps", uid=0 if os.geteuid() == 0 else None)


def start(job_id: str, uid: int, gid: int, gpus: list[str], mps_dir: str, state_dir: str,
          active_thread_pct: int | None, pinned_mem_limit: str | None, control_bin: str,
          timeout_s: float, set_compute_mode: Callable[[str, int], int] | None = None,
          log: Callable[[str], None] = print) -> dict:
    """Start the job's MPS control daemon (prolog, as root): directories,
    journal, each GPU EXCLUSIVE_PROCESS via ``set_compute_mode(gpu, mode) ->
    prior`` (journaled first), ``<control_bin> -d`` as uid/gid, then wait
    ``timeout_s`` for the control socket. -> ``{"job_id", "pipe_dir",
    "log_dir", "job_dir", "pids", "env", "compute_mode_prior"}``.

    Raises:
        InputError: bad job id, GPU identifier, percentage, pinned limit.
        NodeError: planted/foreign directory, an ancestor the user cannot
            traverse, control binary missing, daemon not up within
            ``timeout_s`` (driver not loaded, GPU PROHIBITED, wedged driver);
            everything done so far is undone.
    """
    check_job_id(job_id, phase="mps")
    _check_inputs(gpus, active_thread_pct, pinned_mem_limit, timeout_s)
    jpath = journal_path(job_id, state_dir)
    if _journal(jpath).load() is not None or _plain_dir_of(os.path.join(mps_dir, job_id), (0, uid)):
        # a requeued job or a prolog run twice (a symlink or foreign dir: ensure_dir refuses it)
        log(f"gsrun: mps: job {job_id}: stale MPS state found: cleaning it before starting")
        stop(job_id, mps_dir, state_dir, control_bin, timeout_s, set_compute_mode, log)

    binary = _resolve_bin(control_bin)
    user_env, groups = _user_facts(uid, gid)
    as_user = _as_user_kwargs(uid, gid, groups)

    os.makedirs(state_dir, mode=0o755, exist_ok=True)
    root_dir = Path(mps_dir)
    os.makedirs(root_dir.parent, mode=0o755, exist_ok=True)
    ensure_dir(root_dir, 0o711, 0, 0)
    _check_ancestors(root_dir, uid, groups)
    job_dir = root_dir / job_id
    mounted = os.geteuid() == 0     # as the job's own uid (tests): nothing of root's to protect
    if mounted:
        ensure_dir(job_dir, 0o700, 0, 0)        # the mount point: root's, empty
        _mount_job_dir(job_dir, uid, gid)
    try:
        job_dir = ensure_dir(job_dir, 0o700, uid, gid)
        pipe_dir = ensure_dir(job_dir / "pipe", 0o700, uid, gid)
        log_dir = ensure_dir(job_dir / "log", 0o700, uid, gid)
    except BaseException:
        if mounted:
            _unmount_job_dir(job_dir)
        raise

    j = {"schema": JOURNAL_SCHEMA, "job_id": job_id, "uid": uid, "gid": gid, "gpus": list(gpus),
         "job_dir": str(job_dir), "pipe_dir": str(pipe_dir), "log_dir": str(log_dir),
         "control_bin": binary, "pids": [], "compute_mode": {}, "state": "starting",
         "started_at": time.time()}
    _journal(jpath).write(j)
    try:
        if set_compute_mode is not None:
            for g in gpus:
                j["compute_mode"][g] = None  # pending: set is about to happen
                _journal(jpath).write(j)
                j["compute_mode"][g] = set_compute_mode(g, COMPUTE_MODE_EXCLUSIVE_PROCESS)
                _journal(jpath).write(j)
            log(f"gsrun: mps: job {job_id}: compute mode EXCLUSIVE_PROCESS on {','.join(gpus)}")
        env = daemon_env(user_env, list(gpus), str(pipe_dir), str(log_dir), active_thread_pct,
                         pinned_mem_limit, os.environ)
        pids = _launch(binary, env, as_user, str(pipe_dir), uid, timeout_s)
        j["pids"] = [_proc_key(p) for p in pids]
        j["state"] = "running"
        _journal(jpath).write(j)
    except BaseException as e:
        log(f"gsrun: mps: job {job_id}: start failed, undoing: {e}")
        stop(job_id, mps_dir, state_dir, binary, min(timeout_s, 5.0), set_compute_mode, log)
        raise
    log(f"gsrun: mps: job {job_id}: control daemon pid {[p.pid for p in pids]} as uid {uid}, "
        f"GPUs {','.join(gpus)}, pipe {pipe_dir}")
    return {"job_id": job_id, "pipe_dir": str(pipe_dir), "log_dir": str(log_dir),
            "job_dir": str(job_dir), "pids": [p.pid for p in pids],
            "env": task_env(job_id, mps_dir), "compute_mode_prior": dict(j["compute_mode"])}


#: Size and inode caps of the job's MPS tmpfs (the daemon leaves 7 files of a few KiB)
JOB_DIR_BYTES = 64 << 20
JOB_DIR_INODES = 1024
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_MNT_DETACH, _UMOUNT_NOFOLLOW = 2, 8


def _libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _mount_job_dir(path: Path, uid: int, gid: int) -> None:
    """Mount the capped tmpfs (uid:gid 0700, nosuid, nodev, noexec) on ``path``.
    Raises NodeError: the mount failed (no CAP_SYS_ADMIN: a container)."""
    import ctypes

    opts = f"size={JOB_DIR_BYTES},nr_inodes={JOB_DIR_INODES},mode=0700,uid={int(uid)},gid={int(gid)}"
    if _libc().mount(b"gsrun-mps", os.fsencode(path), b"tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
                     opts.encode()) != 0:
        err = ctypes.get_errno()
        raise NodeError("mps", "job directory", f"mount tmpfs on {path}: {os.strerror(err)}",
                        hint="the prolog needs CAP_SYS_ADMIN to give the job's MPS directory its own "
                             "capped filesystem; or set mps.enabled = false")


def _unmount_job_dir(path: Path) -> str | None:
    """Detach the job directory's tmpfs if mounted (no symlink) -> why it failed, or None."""
    import ctypes

    if not os.path.ismount(path) or os.path.islink(path):
        return None
    if _libc().umount2(os.fsencode(path), _MNT_DETACH | _UMOUNT_NOFOLLOW) != 0:
        return f"umount {path}: {os.strerror(ctypes.get_errno())}"
    return None


def _plain_dir_of(path: str, owners: tuple[int, ...]) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid in owners


def _resolve_bin(control_bin: str) -> str:
    if os.path.isabs(control_bin):
        path = control_bin
    else:
        if "/" in control_bin:
            raise InputError("mps", "bad control binary", repr(control_bin),
                             hint="a name on PATH or an absolute path")
        path = shutil.which(control_bin, path=SAFE_PATH + ":" + os.environ.get("PATH", ""))
        if path is None:
            raise NodeError("mps", "control binary not found", control_bin,
                            hint="install the NVIDIA driver utilities or set mps.control_bin")
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise NodeError("mps", "control binary not executable", path,
                        hint="check mps.control_bin in gsrun.toml")
    return path


def _check_ancestors(root_dir: Path, uid: int, groups: list[int]) -> None:
    """Every directory from / down to ``root_dir`` must be traversable by uid (field case 19)."""
    p = root_dir.resolve()
    for d in [p, *p.parents]:
        st = os.stat(d)
        if not _traversable(st, uid, groups):
            raise NodeError("mps", "directory not traversable by the job's user",
                            f"{d} mode {stat.S_IMODE(st.st_mode):04o} owner {st.st_uid}, uid {uid}",
                            hint=f"chmod o+x {d} (0711 or 0755); MPS servers run as the user")


def _launch(binary: str, env: dict, as_user: dict, pipe_dir: str, uid: int,
            timeout_s: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout_s
    with tempfile.TemporaryFile() as out:
        try:
            r = subprocess.run([binary, "-d"], env=env, stdin=subprocess.DEVNULL, stdout=out,
                               stderr=out, cwd="/", umask=0o077, start_new_session=True,
                               close_fds=True, timeout=timeout_s, **as_user)
        except subprocess.TimeoutExpired:
            raise NodeError("mps", "control daemon start timed out",
                            f"{binary} -d did not return within {timeout_s:g} s",
                            hint="a wedged driver; check nvidia-smi") from None
        except OSError as e:
            raise NodeError("mps", "cannot run control daemon", f"{binary}: {e}") from None
        out.seek(0)
        text = out.read(2000).decode(errors="replace").strip()
    if r.returncode != 0:
        raise NodeError("mps", "control daemon failed to start",
                        f"{binary} -d exited {r.returncode}: {text or 'no output'}",
                        hint="see the control.log in the job's MPS log directory")
    sock = os.path.join(pipe_dir, CONTROL_SOCKET)
    while True:
        procs = _daemon_processes(pipe_dir, uid)
        if procs and os.path.exists(sock):
            return procs
        if time.monotonic() >= deadline:
            raise NodeError("mps", "control daemon did not come up",
                            f"no control socket/process for {pipe_dir} within {timeout_s:g} s",
                            hint="see control.log in the job's MPS log directory")
        time.sleep(_POLL_S)


def _daemon_processes(pipe_dir: str, uid: int) -> list[psutil.Process]:
    """The pid file's control daemon if it checks out, else :func:`find_job_processes`'s."""
    pid = _read_pid_file(pipe_dir)
    if pid is not None:
        with suppress(psutil.Error, OSError):
            p = psutil.Process(pid)
            if (p.uids().real == uid and _is_mps_process(p) and not _gone(p)
                    and os.path.normpath(p.environ().get("CUDA_MPS_PIPE_DIRECTORY", ""))
                    == os.path.normpath(pipe_dir)):
                return [p]
    return find_job_processes(pipe_dir, uid)


def _wait_gone(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait up to ``timeout_s`` for all to be gone -> the survivors."""
    deadline = time.monotonic() + max(0.0, timeout_s)
    alive = [p for p in procs if not _gone(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(_POLL_S)
        alive = [p for p in alive if not _gone(p)]
    return alive


def _signal(procs: list[psutil.Process], sig: int) -> list[int]:
    sent = []
    for p in procs:
        with suppress(psutil.Error):
            p.send_signal(sig)  # psutil checks the PID still is this process
            sent.append(p.pid)
    return sent


def stop(job_id: str, mps_dir: str, state_dir: str, control_bin: str, timeout_s: float,
         restore_compute_mode: Callable[[str, int], object] | None = None,
         log: Callable[[str], None] = print) -> dict:
    """Stop the job's MPS daemon and remove its directories (epilog,
    ``gsrun-node restore``). Idempotent: ``quit`` as the user, TERM, KILL,
    restore each GPU's compute mode (DEFAULT where the prior is unknown),
    remove the job directory; the journal goes only when all succeeded.

    Returns:
        ``{"job_id", "status": "stopped"|"nothing"|"incomplete", "quit":
        "ok"|"timeout"|"skipped"|"rc N: ..."|"failed: ...", "ended",
        "terminated", "killed", "leftover" (pids), "compute_mode_restored",
        "errors", "dir_removed", "journal_kept"}``. Raises only InputError (job id).
    """
    check_job_id(job_id, phase="mps")
    jpath = journal_path(job_id, state_dir)
    jr = _journal(jpath)
    got = jr.load()
    j = got.data if got else None
    if (got is None and jr.exists()) or (j is not None and j.get("job_id") != job_id):
        log(f"gsrun: mps: job {job_id}: journal {jpath} unusable, ignoring it")
        j = None
    elif got is not None and got.earlier_boot:
        log(f"gsrun: mps: job {job_id}: journal {jpath} is from an earlier boot (boot {got.boot_id}): "
            "its daemons are gone; cleaning up what is left")
    job_dir = Path(mps_dir) / job_id
    pipe_dir = str(job_dir / "pipe")
    uid = gid = None
    if j:
        pipe_dir = str(j.get("pipe_dir") or pipe_dir)
        job_dir = Path(j.get("job_dir") or job_dir)
        uid, gid = j.get("uid"), j.get("gid")
    else:
        with suppress(OSError):
            st = os.lstat(job_dir)
            if stat.S_ISDIR(st.st_mode):
                uid, gid = st.st_uid, st.st_gid
    res = {"job_id": job_id, "status": "stopped", "quit": "skipped", "ended": [],
           "terminated": [], "killed": [], "leftover": [], "compute_mode_restored": {},
           "errors": [], "dir_removed": False, "journal_kept": False}
    recorded = (j or {}).get("pids") or []
    procs = find_job_processes(pipe_dir, uid, recorded)
    has_dir = os.path.lexists(job_dir)
    if j is None and not has_dir and not procs:
        log(f"gsrun: mps: job {job_id}: no MPS state (no journal, no {job_dir}): nothing to do "
            "(MPS not started, or the node rebooted since the prolog)")
        res["status"] = "nothing"
        res["dir_removed"] = True
        return res
    if j is None:
        log(f"gsrun: mps: job {job_id}: no journal; cleaning up by pipe directory {pipe_dir}")

    t0 = time.monotonic()
    seen = {p.pid for p in procs}
    sock = os.path.join(pipe_dir, CONTROL_SOCKET)
    if uid is not None and (procs or os.path.lexists(sock)):
        res["quit"] = _send_quit(control_bin or (j or {}).get("control_bin") or "", pipe_dir,
                                 uid, gid if gid is not None else uid, timeout_s)
        if res["quit"] != "ok":
            log(f"gsrun: mps: job {job_id}: quit: {res['quit']}")
    elif procs:
        res["quit"] = "skipped: owner unknown"
    procs = _merge(procs, find_job_processes(pipe_dir, uid, recorded))
    seen |= {p.pid for p in procs}
    left = _wait_gone(procs, timeout_s - (time.monotonic() - t0))
    for sig, key, wait_s in ((signal.SIGTERM, "terminated", _TERM_WAIT_S), (signal.SIGKILL, "killed", _KILL_WAIT_S)):
        if left:
            res[key] = _signal(left, sig)
            log(f"gsrun: mps: job {job_id}: {sig.name} pids {res[key]}")
            left = _wait_gone(left, wait_s)
        left = _merge(left, find_job_processes(pipe_dir, uid, recorded))
    res["leftover"] = sorted(p.pid for p in left)
    seen |= set(res["terminated"]) | set(res["killed"])
    res["ended"] = sorted(seen - set(res["leftover"]))
    if left:
        res["errors"].append(f"MPS processes survived KILL: {res['leftover']}")

    modes = (j or {}).get("compute_mode") or {}
    for g, prior in modes.items():
        target = COMPUTE_MODE_DEFAULT if prior is None else prior
        if restore_compute_mode is None:
            res["errors"].append(f"compute mode of GPU {g} not restored: no restore function")
            continue
        try:
            restore_compute_mode(g, target)
            res["compute_mode_restored"][g] = target
        except Exception as e:  # an NVML error must not stop the cleanup
            res["errors"].append(f"compute mode of GPU {g} not restored to {target}: {e}")

    why = _unmount_job_dir(job_dir)
    if why:
        res["errors"].append(why)
    remove_tree(job_dir)
    res["dir_removed"] = not os.path.lexists(job_dir)
    if not res["dir_removed"]:
        res["errors"].append(f"{job_dir} could not be removed")

    if res["errors"]:
        res["status"] = "incomplete"
        for e in res["errors"]:
            log(f"gsrun: mps: job {job_id}: {e}")
        if j is not None:
            j["state"] = "incomplete"
            j["compute_mode"] = {g: m for g, m in modes.items()
                                 if g not in res["compute_mode_restored"]}
            _journal(jpath).write(j)
            res["journal_kept"] = True
    else:
        jr.remove()
        log(f"gsrun: mps: job {job_id}: stopped (quit {res['quit']}, ended {res['ended']}, "
            f"killed {res['killed']}), {job_dir} removed")
    return res


def _merge(a: list[psutil.Process], b: list[psutil.Process]) -> list[psutil.Process]:
    seen = {p.pid: p for p in a}
    for p in b:
        seen.setdefault(p.pid, p)
    return [p for p in seen.values() if not _gone(p)]


def _send_quit(control_bin: str, pipe_dir: str, uid: int, gid: int, timeout_s: float) -> str:
    """``echo quit | CUDA_MPS_PIPE_DIRECTORY=<pipe> <control_bin>`` as the user, within ``timeout_s``."""
    try:
        binary = _resolve_bin(control_bin)
        user_env, groups = _user_facts(uid, gid)
        as_user = _as_user_kwargs(uid, gid, groups)
    except (InputError, NodeError) as e:
        return f"failed: {e}"
    env = {"PATH": SAFE_PATH, **user_env, "CUDA_MPS_PIPE_DIRECTORY": pipe_dir,
           "CUDA_MPS_LOG_DIRECTORY": os.path.join(os.path.dirname(pipe_dir), "log")}
    try:
        r = subprocess.run([binary], input=b"quit\n", env=env, capture_output=True, cwd="/",
                           start_new_session=True, timeout=max(0.1, timeout_s), **as_user)
    except subprocess.TimeoutExpired:
        return "timeout"
    except OSError as e:
        return f"failed: {e}"
    if r.returncode != 0:
        msg = (r.stderr or r.stdout).decode(errors="replace").strip().replace("\n", " ")[:200]
        return f"rc {r.returncode}: {msg}"
    return "ok"
