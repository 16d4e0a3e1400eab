"""The node monitor: the one process of the node daemon that holds NVML.

Every ``sampler.interval_s`` it polls every job's GPUs (a
:class:`~gsrun.node.sampler.Sampler` per job) and the idle ones, runs the live
effects and feeds the Prometheus endpoint. A job's begin request is kept in
``<state_dir>/jobs/<id>/monitor.json``; a new monitor takes up every such job
from its ``sampler.json`` (the time between counted as gap).

Protocol: ``<state_dir>/monitor.sock`` (``AF_UNIX`` stream, mode 0600 in the
root-owned state dir; the peer must have the monitor's uid). One request
line of JSON (at most :data:`MAX_REQUEST_BYTES`, read within
:data:`REQUEST_TIMEOUT_S`), one reply line of JSON::

    {"op": "nvml"}                 -> {"ok": true, "nvml_error": null | "NVML init failed: CODE (...)",
                                       "nvml_code": null | "CODE"}
    {"op": "begin", "job_id": "42", "uid": 1000, "node": "gpu01", "gpus": [0, 1],
     "dma_latency_us": null | 0..2000000000}
                                   -> {"ok": true, "resumed": false, "gpus": 2, "notes": [...]}
    {"op": "end", "job_id": "42"}  -> {"ok": true, "samples": 120, "stopped": "stopped"}
    {"op": "lost", "job_id": "42"} -> {"ok": true, "lost": [gres indices of its GPUs found lost]}
    {"op": "status"}               -> {"ok": true, "pid", "started", "jobs": [ids], "gpus", "nvml_error", ...}
    {"op": "get"}                  -> {"ok": true, "devices": [{"minor": {"value": 0},
                                       "compute_processes": {"na": "Not Supported", "code": 3}, ...}, ...]}
                                      | {"ok": true, "na": "NVML not opened", "code": null}

A refused request answers ``{"ok": false, "error": "..."}``. ``get`` serves
the hooks' read-only NVML facts of every device in one answer (at most
:data:`MAX_REPLY_BYTES`; :data:`REMOTE_KEYS`, :class:`RemoteNvml`), so no hook
opens NVML. Bounds: :data:`MAX_JOBS` jobs, :data:`MAX_GPUS` GPUs per
job, every field checked against an allow-list (:func:`check_begin`).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import pwd
import selectors
import signal
import socket
import stat
import sys
import threading
import time
from contextlib import suppress
from dataclasses import dataclass, field
from types import SimpleNamespace

import psutil

from gsrun.base import unixsock
from gsrun.base.errors import NodeError
from gsrun.base.fsutil import atomic_write_json, read_json
from gsrun.base.ids import is_job_id, is_node_name
from gsrun.base.paths import Paths
from gsrun.facts.hostfs import HostFS
from gsrun.facts.nvml import NA, NvmlUnavailable, index_by_minor, is_na, open_nvml
from gsrun.node import cpu_latency, tuning
from gsrun.node.live import LiveActions
from gsrun.node.metrics import GpuReading, job_readings
from gsrun.node.metrics_http import GpuCollector, start_http
from gsrun.node.metrics_textfile import exporter_from_config
from gsrun.node.sampler import Sampler
from gsrun.request.config import idle_config, load_config_or_defaults

SOCKET_NAME = "monitor.sock"
JOB_FILE = "monitor.json"
MAX_REQUEST_BYTES = 64 * 1024
MAX_REPLY_BYTES = 1 << 20  # a get of 64 GPUs with their compute processes fits
REQUEST_TIMEOUT_S = 2.0
CONNECT_WAIT_S = 15.0      # a daemon restarting: RestartSec=1 and its start (the modules, NVML)
MAX_JOBS = 256              # jobs on one node at once (Slurm's MaxJobCount per node is far lower in practice)
MAX_GPUS = 64               # gres indices per job and node
MAX_DMA_US = 2_000_000_000
NVML_RETRY_S = 2.0          # NVML that could not be opened is tried again at a job's begin, at most this often
IRQ_RETRY_AFTER_S = 60.0    # the IRQs refused at the prolog are tried again once, this long into the job
IDLE_KEYS = ("memory", "power_mw", "temperature_c", "utilization", "energy_mj")
# the NVML facts the hooks ask the monitor for (read-only: the GPU map and the residual GPU processes)
REMOTE_KEYS = ("minor", "pci_bus_id", "compute_processes")
_PR_SET_PDEATHSIG = 1


def socket_path(state_dir) -> str:
    return os.path.join(str(state_dir), SOCKET_NAME)


# ----------------------------------------------------------------------------- requests (pure)

def read_mem_baseline(nv, gres_indices: list[int]) -> dict[int, int]:
    """gres index -> v1 memory "used" (bytes) before the job starts, for GPUs
    without ``reserved`` (v1 counts the driver's reservation; the sampler subtracts it)."""
    by_minor, _lost = index_by_minor(nv)
    out = {}
    for g in gres_indices:
        idx = by_minor.get(g)
        m = nv.get(idx, "memory") if idx is not None else None
        if isinstance(m, dict) and "reserved" not in m and isinstance(m.get("used"), int):
            out[g] = int(m["used"])
    return out


def check_begin(req: dict) -> dict:
    """A ``begin`` request's fields, checked (``gpus`` sorted, unique).

    Raises:
        ValueError: a field missing or outside its allow-list (the text says which).
    """
    job_id, uid, node = req.get("job_id"), req.get("uid"), req.get("node")
    gpus, dma = req.get("gpus", []), req.get("dma_latency_us")
    if not is_job_id(job_id):
        raise ValueError(f"job_id {job_id!r} is not a job id")
    if not _int_in(uid, 0, 2 ** 32):
        raise ValueError(f"uid {uid!r} is not a uid")
    if not is_node_name(node):
        raise ValueError(f"node {node!r} is not a node name")
    if not (isinstance(gpus, list) and len(gpus) <= MAX_GPUS
            and all(_int_in(g, 0, 4096) for g in gpus)):
        raise ValueError(f"gpus: a list of at most {MAX_GPUS} gres indices 0-4095")
    if dma is not None and not _int_in(dma, 0, MAX_DMA_US + 1):
        raise ValueError(f"dma_latency_us {dma!r}: 0-{MAX_DMA_US} or null")
    return {"job_id": job_id, "uid": uid, "node": node, "gpus": sorted(set(gpus)), "dma_latency_us": dma}


def _int_in(v, low: int, high: int) -> bool:
    """``v`` is an int (not a bool) in ``[low, high)``."""
    return isinstance(v, int) and not isinstance(v, bool) and low <= v < high


def check_mem_baseline(value) -> dict[str, int]:
    """A ``monitor.json``'s ``mem_baseline`` (gres index as text -> bytes),
    checked; anything else is no baseline ({}): the job is sampled without one."""
    if not isinstance(value, dict) or len(value) > MAX_GPUS:
        return {}
    ok = {k: v for k, v in value.items() if isinstance(k, str) and k.isdigit() and len(k) <= 4
          and _int_in(v, 0, 2 ** 50)}
    return ok if len(ok) == len(value) else {}


def parse_request(line: bytes) -> dict:
    """One request line -> its dict. Raises ValueError (not JSON, not an object, no known op)."""
    req = json.loads(line)
    if not isinstance(req, dict) or req.get("op") not in ("nvml", "begin", "end", "lost", "status", "get"):
        raise ValueError("not a monitor request")
    return req


# ----------------------------------------------------------------------------- client

def ask(state_dir, request: dict, timeout_s: float = 10.0, wait_s: float = CONNECT_WAIT_S) -> dict:
    """Send ``request`` to the monitor of ``state_dir`` -> its answer, waiting
    up to ``wait_s`` for one not listening yet (its daemon restarting).

    Raises:
        NodeError: no monitor listens within ``wait_s`` (the node daemon is not
            running), the listener is not of this uid, no answer within
            ``timeout_s``, or an answer that is not one JSON line.
    """
    path = socket_path(state_dir)
    s = _connect(path, wait_s)
    try:
        s.settimeout(timeout_s)
        if unixsock.peer(s)[1] != os.geteuid():
            raise NodeError("monitor", "socket", f"{path}: served by another user",
                            hint="only root's node daemon serves it; remove the socket, restart gsrun-daemon")
        deadline = time.monotonic() + timeout_s
        s.sendall(json.dumps(request, separators=(",", ":")).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n") and len(buf) <= MAX_REPLY_BYTES:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    except OSError as e:
        if isinstance(e, NodeError):
            raise
        raise NodeError("monitor", "no answer", f"{path}: {e}",
                        hint="journalctl -u gsrun-daemon says what the monitor is doing") from e
    finally:
        s.close()
    try:
        out = json.loads(buf)
    except ValueError as e:
        raise NodeError("monitor", "no answer", f"{path}: {buf[:80]!r}",
                        hint="the monitor restarted while answering: the hook may run again") from e
    if not isinstance(out, dict):
        raise NodeError("monitor", "no answer", f"{path}: not an object")
    return out


def _connect(path: str, wait_s: float):
    deadline = time.monotonic() + wait_s
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            s.settimeout(REQUEST_TIMEOUT_S)
            s.connect(path)
            return s
        except OSError as e:
            s.close()
            if e.errno not in (errno.ENOENT, errno.ECONNREFUSED) or time.monotonic() >= deadline:
                raise NodeError("monitor", "not running", f"{path}: {e.strerror or e}",
                                hint="the node daemon runs it: systemctl status gsrun-daemon") from e
            time.sleep(0.1)


class RemoteNvml:
    """A hook's NVML backend: the monitor's :data:`REMOTE_KEYS` of every
    device, asked in one ``get`` at the first read and answered from it after;
    another key, or no answer, reads as :class:`~gsrun.facts.nvml.NA`."""

    def __init__(self, state_dir, timeout_s: float = 5.0):
        self.state_dir, self.timeout_s = state_dir, timeout_s
        self._devices: list[dict] | None = None
        self._na: NA | None = None      # why there are no devices: the monitor's NVML or its answer

    def _read(self) -> list[dict]:
        if self._devices is None:
            try:
                out = ask(self.state_dir, {"op": "get"}, timeout_s=self.timeout_s, wait_s=self.timeout_s)
            except NodeError as e:
                out = {"ok": True, "na": f"node monitor: {e}".splitlines()[0]}
            devices = out.get("devices")
            if not out.get("ok"):
                self._na = NA(str(out.get("error"))[:200], None)
            elif "na" in out:
                self._na = _na_of(out)
            elif not (isinstance(devices, list) and len(devices) <= MAX_GPUS):
                self._na = NA("node monitor: no device list", None)
            self._devices = [d if isinstance(d, dict) else {} for d in devices] if self._na is None else []
        return self._devices

    def driver_version(self):
        return NA("not served by the node monitor", None)

    def count(self) -> int:
        return len(self._read())

    def get(self, index: int, key: str, **kw):
        if key not in REMOTE_KEYS or kw:
            return NA(f"{key} is not served by the node monitor", None)
        devices = self._read()
        if self._na is not None:
            return self._na
        r = devices[index].get(key) if _int_in(index, 0, len(devices)) else None
        if not isinstance(r, dict):
            return NA(f"node monitor: no {key} of device {index}", None)
        return _na_of(r) if "na" in r else r.get("value")

    def close(self) -> None:
        pass


def _na_of(answer: dict) -> NA:
    """``{"na": reason, "code": int | null}`` -> its NA."""
    code = answer.get("code")
    return NA(str(answer["na"])[:200], code if _int_in(code, -2 ** 31, 2 ** 31) else None)


# ----------------------------------------------------------------------------- the monitor

@dataclass
class Job:
    """A sampled job: its sampler, its C-state hold (open ``/dev/cpu_dma_latency``)."""

    sampler: Sampler
    user: str | None = None
    dma_fd: int | None = None
    errors: int = 0
    notes: list[str] = field(default_factory=list)
    marks: dict = field(default_factory=dict)    # gsrun.node.metrics.job_readings' window marks
    irq_retried: bool = False


class Monitor:
    """The NVML holder and every job's sampler; :meth:`serve` until SIGTERM.
    ``config_loader()``: the site config, read again at each begin."""

    def __init__(self, hostfs: HostFS, paths: Paths, cfg, nvml=None, clock=time.time, log=None,
                 config_loader=None, usage=None):
        self.hostfs, self.paths, self.cfg, self.clock, self.usage = hostfs, paths, cfg, clock, usage
        self.log = log or (lambda msg: print(f"gsrun: monitor: {msg}", file=sys.stderr, flush=True))
        self._use_config(cfg)
        self.jobs: dict[str, Job] = {}
        self.started = time.time()
        self.nvml_inits = 0
        self.nvml_error: str | None = None
        self.nvml_code: str | None = None
        self.nv = None
        self.nvml_tried = 0.0
        self.config_loader = config_loader
        self.idle_values: dict[int, dict] = {}       # NVML index -> last reading of a GPU no job holds
        self.devices: dict[int, tuple] = {}          # NVML index -> (minor, uuid, name): read once
        self.latest: list[GpuReading] = []           # the Prometheus endpoint's figures, swapped whole per tick
        self.first_polls: list[str] = []             # jobs begun since the last poll: polled after the answer
        self._open_nvml(nvml)

    # -- requests --------------------------------------------------------------
    def handle(self, req: dict) -> dict:
        op = req["op"]
        if op == "nvml":
            self._retry_nvml()
            return {"ok": True, "nvml_error": self.nvml_error, "nvml_code": self.nvml_code}
        if op == "status":
            return {"ok": True, **self.status()}
        if op == "begin":
            return self.begin(check_begin(req))
        if op == "get":
            return self.get()
        job_id = req.get("job_id")
        if not is_job_id(job_id):
            raise ValueError(f"job_id {job_id!r} is not a job id")
        if op == "end":
            return self.end(job_id)
        s = self.jobs[job_id].sampler if job_id in self.jobs else None      # lost: [] for a job not sampled
        lost = [r.gres_index for r, g in zip(s.refs, s.state["gpus"]) if g["lost_at_s"] is not None] if s else []
        return {"ok": True, "lost": lost}

    def _nvml(self):
        if self.nv is not None:
            return self.nv

        def unavailable():
            raise NvmlUnavailable(self.nvml_code or "UNINITIALIZED", "the monitor could not open NVML")
        return unavailable

    def begin(self, job: dict, resumed: bool = False) -> dict:
        """Start sampling ``job`` (:func:`check_begin`'s dict), continuing a
        state found; the first poll comes after the answer (:meth:`poll_begun`)."""
        job_id = job["job_id"]
        if job_id in self.jobs:
            return {"ok": True, "resumed": True, "gpus": len(self.jobs[job_id].sampler.refs), "notes": []}
        if len(self.jobs) >= MAX_JOBS:
            raise ValueError(f"{MAX_JOBS} jobs sampled already")
        self._reload()
        d = self.paths.make_state_job(job_id)
        if not resumed:
            baseline = {}
            if self.nv is not None and job["gpus"]:
                try:
                    baseline = read_mem_baseline(self.nv, job["gpus"])
                except Exception:  # noqa: BLE001 - no baseline: v1 memory as read
                    baseline = {}
            job = dict(job, mem_baseline={str(k): v for k, v in baseline.items()}, begun=time.time())
            atomic_write_json(d / JOB_FILE, job, mode=0o600, durable=False)   # as sampler.json
        s = Sampler(self.hostfs, job_id, job["uid"], job["node"], job["gpus"], str(d / "sampler.json"),
                    self.interval_s, self.flush_s, int(self.cfg["sampler.timeline_points"]), clock=self.clock,
                    usage=self.usage,
                    nvml=self._nvml(), mem_baseline={int(k): v for k, v in (job.get("mem_baseline") or {}).items()},
                    idle=self.idle_cfg)
        if self.cfg["metrics.textfile_dir"]:
            s.export = exporter_from_config(self.cfg, job_id, job["uid"])
        s.live = LiveActions(self.paths.spool_dir, job_id, job["node"], job["uid"], self.idle_cfg,
                             self.cfg["live.flush_s"], self.cfg["timeouts.command_s"])
        entry = Job(s, user=_user_name(job["uid"]))
        if job.get("dma_latency_us") is not None:
            entry.dma_fd, note = cpu_latency.hold(self.hostfs, job["dma_latency_us"])
            s.state["notes"].append(note)
            entry.notes.append(note)
        self.jobs[job_id] = entry
        self.first_polls.append(job_id)     # after the answer: the prolog does not wait for it
        return {"ok": True, "resumed": resumed, "gpus": len(s.refs), "notes": entry.notes}

    def get(self) -> dict:
        """The hooks' read-only NVML facts (:data:`REMOTE_KEYS`) of every device
        (at most :data:`MAX_GPUS`)."""
        if self.nv is None:
            return {"ok": True, "na": self.nvml_error or "NVML not opened", "code": None}
        devices = []
        for i in range(min(self._count(), MAX_GPUS)):
            values = {k: self.nv.get(i, k) for k in REMOTE_KEYS}
            devices.append({k: {"na": v.reason, "code": v.code} if is_na(v) else {"value": v}
                            for k, v in values.items()})
        return {"ok": True, "devices": devices}

    def _use_config(self, cfg) -> None:
        """``cfg``, its poll and flush intervals (s) and idle detector settings."""
        interval_s, flush_s, idle_cfg = float(cfg["sampler.interval_s"]), float(cfg["sampler.flush_s"]), \
            idle_config(cfg)
        self.cfg, self.interval_s, self.flush_s, self.idle_cfg = cfg, interval_s, flush_s, idle_cfg

    def _reload(self) -> None:
        """At each begin: the site config again, and NVML if not open yet."""
        if self.config_loader is not None:
            try:
                self._use_config(self.config_loader())
            except Exception as e:  # noqa: BLE001 - the last good config stays in force
                self.log(f"config not reloaded: {e}")
        self._retry_nvml()

    def _retry_nvml(self) -> None:
        """Open NVML if it could not be yet (a driver loaded later), at most every :data:`NVML_RETRY_S`."""
        if self.nv is None and time.monotonic() - self.nvml_tried >= NVML_RETRY_S:
            self._open_nvml()

    def _open_nvml(self, nvml=None) -> None:
        self.nvml_tried = time.monotonic()
        try:
            self.nv = nvml if nvml is not None else open_nvml(self.hostfs)
            self.nvml_inits += 1
            self.nvml_error = self.nvml_code = None
        except NvmlUnavailable as e:
            self.nvml_error, self.nvml_code = str(e), e.code_name
            self.log(f"{e}: GPU figures unavailable (tried again at the next job's begin)")

    def end(self, job_id: str) -> dict:
        """The job's last sample and final flush (``done``); it is sampled no more."""
        entry = self.jobs.pop(job_id, None)
        if entry is None:
            return {"ok": True, "samples": None, "stopped": "not running"}
        s = entry.sampler
        try:
            s.finish()
            stopped = "stopped"
        except Exception as e:  # noqa: BLE001 - the epilog falls back to the last flush
            stopped = f"final sample failed: {type(e).__name__}: {e}"
            self.log(f"job {job_id}: {stopped}")
        finally:
            self._release(entry)
            with suppress(OSError):
                os.unlink(self.paths.state_job(job_id) / JOB_FILE)
        return {"ok": True, "samples": s.state["samples"], "stopped": stopped}

    def _release(self, entry: Job) -> None:
        if entry.dma_fd is not None:
            with suppress(OSError):
                os.close(entry.dma_fd)
            entry.dma_fd = None

    def status(self) -> dict:
        return {"pid": os.getpid(), "started": int(self.started), "jobs": sorted(self.jobs),
                "gpus": self._count(), "nvml_error": self.nvml_error, "nvml_inits": self.nvml_inits,
                "rss_bytes": psutil.Process().memory_info().rss}

    def _count(self) -> int:
        try:
            return self.nv.count() if self.nv is not None else 0
        except Exception:  # noqa: BLE001
            return 0

    # -- sampling --------------------------------------------------------------
    def readopt(self) -> list[str]:
        """Take up the jobs with a root-owned ``monitor.json``, checked as a request -> their ids."""
        base = self.paths.state_dir / "jobs"
        out = []
        try:
            names = sorted(os.listdir(base))
        except OSError:
            return out
        for name in names:
            if not is_job_id(name):
                continue
            path = base / name / JOB_FILE
            try:
                dst = os.lstat(base / name)
                if not stat.S_ISDIR(dst.st_mode) or dst.st_uid != os.geteuid() or dst.st_mode & 0o077:
                    continue        # not a job directory the prolog made (root, 0700): not read
                st = os.lstat(path)
                if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                    continue
                rec = read_json(path)
                job = check_begin(rec if isinstance(rec, dict) else {})
                if job["job_id"] != name:
                    continue
                job["mem_baseline"] = check_mem_baseline(rec.get("mem_baseline"))
                self.begin(job, resumed=True)
                out.append(name)
            except FileNotFoundError:
                continue            # a job dir without monitor.json: never begun, or ended
            except (OSError, ValueError, TypeError) as e:
                self.log(f"job {name}: not taken up: {e}")
        return out

    def tick(self) -> None:
        """One poll of every job's GPUs and of the idle ones (a failure costs that job a gap)."""
        for job_id, entry in list(self.jobs.items()):
            self._sample(job_id, entry)
        self._sample_idle()
        self.latest = self.readings()

    def readings(self) -> list[GpuReading]:
        """This tick's endpoint figures: each job's GPUs (means since the last tick), then the idle GPUs."""
        out: list[GpuReading] = []
        for entry in self.jobs.values():
            with suppress(Exception):  # a job's figures left out of one scrape
                rs, entry.marks = job_readings(entry.sampler.state, entry.user, entry.marks)
                out += rs
        for i, r in sorted(self.idle_values.items()):
            minor, uuid, name = self.devices.get(i, (None, None, None))
            mem, util = r.get("memory"), r.get("utilization")
            out.append(GpuReading(minor, uuid, name,
                                  util_pct=_scaled(util.get("gpu")) if isinstance(util, dict) else None,
                                  mem_used_bytes=_scaled(mem.get("used")) if isinstance(mem, dict) else None,
                                  mem_total_bytes=_scaled(mem.get("total")) if isinstance(mem, dict) else None,
                                  power_w=_scaled(r.get("power_mw"), 1e-3),
                                  temperature_c=_scaled(r.get("temperature_c")),
                                  energy_j=_scaled(r.get("energy_mj"), 1e-3)))
        return out

    def _sample(self, job_id: str, entry: Job) -> None:
        s = entry.sampler
        try:
            s.poll()
            entry.errors = 0
            if not entry.irq_retried and self.clock() - s.state["start_time"] >= IRQ_RETRY_AFTER_S:
                entry.irq_retried = True
                threading.Thread(target=self._retry_irqs, args=(job_id, s.state["node"]), daemon=True,
                                 name=f"irq-retry-{job_id}").start()
        except Exception as e:  # noqa: BLE001 - one job's failure is that job's only
            entry.errors += 1
            if entry.errors in (1, 10, 100):
                self.log(f"job {job_id}: sample failed ({entry.errors}x): {type(e).__name__}: {e}")

    def _retry_irqs(self, job_id: str, node: str) -> None:
        """Write again the IRQs the kernel refused at the prolog (a thread: it may wait for the lock)."""
        try:
            out = tuning.retry_skipped_irqs(self.hostfs, str(self.paths.state_dir), job_id,
                                            prolog_record=self.paths.spool_job(job_id) / f"prolog-{node}.json",
                                            log=lambda m: self.log(f"job {job_id}: {m}"))
            if out:
                self.log(f"job {job_id}: IRQ retry: {out}")
        except Exception as e:  # noqa: BLE001 - the job keeps the affinity it has
            self.log(f"job {job_id}: IRQ retry failed: {e}")

    def poll_begun(self) -> None:
        """The first poll of the jobs begun since the last call."""
        while self.first_polls:
            job_id = self.first_polls.pop(0)
            if job_id in self.jobs and self.jobs[job_id].sampler.state["samples"] == 0:
                self._sample(job_id, self.jobs[job_id])

    def held_indices(self) -> set[int]:
        return {r.nvml_index for e in self.jobs.values() for r in e.sampler.refs if r.nvml_index is not None}

    def _sample_idle(self) -> None:
        if self.nv is None:
            return
        held = self.held_indices()
        for i in range(self._count()):
            if i in held:
                self.idle_values.pop(i, None)
                continue
            try:
                if i not in self.devices:
                    self.devices[i] = tuple(_plain(self.nv.get(i, k)) for k in ("minor", "uuid", "name"))
                self.idle_values[i] = {k: self.nv.get(i, k) for k in IDLE_KEYS}
            except Exception:  # noqa: BLE001 - a GPU that cannot be read is unknown
                self.idle_values.pop(i, None)

    def flush_all(self) -> None:
        """Every job's state to disk (not done): a stopping monitor's last act."""
        for job_id, entry in self.jobs.items():
            try:
                entry.sampler.flush()
            except Exception as e:  # noqa: BLE001
                self.log(f"job {job_id}: flush failed: {e}")

    def close(self) -> None:
        for entry in self.jobs.values():
            self._release(entry)
        if self.nv is not None:
            self.nv.close()
            self.nv = None

    # -- loop ----------------------------------------------------------------------
    def serve(self, listener) -> int:
        """Poll and answer until SIGTERM/SIGINT or the daemon's end; then flush every job."""
        stop: list[int] = []
        r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda n, _f: stop.append(n))
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        sel = selectors.DefaultSelector()
        sel.register(listener, selectors.EVENT_READ, "accept")
        sel.register(r, selectors.EVENT_READ, "signal")
        parent = os.getppid()
        next_t = time.monotonic()
        try:
            while not stop and os.getppid() == parent:
                now = time.monotonic()
                if now >= next_t:
                    self.tick()
                    next_t += self.interval_s
                    now = time.monotonic()
                    if next_t <= now:       # overran: skip the missed slots
                        next_t = now + self.interval_s - ((now - next_t) % self.interval_s)
                for key, _ev in sel.select(timeout=max(0.0, min(next_t - now, 1.0))):
                    if key.data == "accept":
                        self._accept(listener)
                        self.poll_begun()
                    else:
                        with suppress(BlockingIOError):
                            while os.read(r, 512):
                                pass
        finally:
            signal.set_wakeup_fd(-1)
            self.flush_all()
            self.close()
        self.log(f"stopped ({len(self.jobs)} job(s) left to the next monitor)")
        return 0

    def _accept(self, listener) -> None:
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        with conn:
            try:
                if unixsock.peer(conn)[1] != os.geteuid():
                    return
                conn.settimeout(REQUEST_TIMEOUT_S)
                deadline = time.monotonic() + REQUEST_TIMEOUT_S
                buf = b""
                while b"\n" not in buf:
                    if len(buf) > MAX_REQUEST_BYTES or time.monotonic() > deadline:
                        raise ValueError("request too long or too slow")
                    conn.settimeout(max(0.01, deadline - time.monotonic()))
                    chunk = conn.recv(65536)
                    if not chunk:
                        raise ValueError("request cut short")
                    buf += chunk
                try:
                    out = self.handle(parse_request(buf.split(b"\n", 1)[0]))
                except (ValueError, TypeError, OSError, NodeError) as e:
                    out = {"ok": False, "error": " ".join(str(e).split())[:400]}
                except Exception as e:  # noqa: BLE001 - a bug of ours fails this request, not the monitor
                    self.log(f"request failed: {type(e).__name__}: {e}")
                    out = {"ok": False, "error": f"internal error: {type(e).__name__}"}
                conn.settimeout(REQUEST_TIMEOUT_S)
                conn.sendall(json.dumps(out, separators=(",", ":")).encode() + b"\n")
            except (OSError, ValueError) as e:
                self.log(f"request dropped: {e}")


def _user_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def _plain(v):
    return None if is_na(v) else v


def _scaled(v, k: float = 1.0) -> float | None:
    """``v`` x ``k`` when ``v`` is a number (not an NA, not a bool), else None."""
    return float(v) * k if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def listen(path: str):
    """A listening socket at ``path`` (0600). Raises NodeError: the directory is missing or open to others."""
    unixsock.check_dir(path, "monitor", "the node's state directory must exist (gsrun-node install makes it)",
                       "chown root and chmod go-w it")
    return unixsock.bind_private(path, 64)[0]


def die_with_parent() -> None:
    """SIGTERM this process when its daemon ends (``PR_SET_PDEATHSIG``), even by SIGKILL."""
    with suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def run(host_root: str | None = None, state_dir: str | None = None, spool_dir: str | None = None,
        nvml=None, node_name: str | None = None, metrics_port: int | None = None) -> int:
    """The monitor process's body -> exit status. ``node_name``: the series'
    ``node`` label (default the short host name); ``metrics_port`` overrides
    ``[metrics] http_port`` (hosts with several slurmd)."""
    die_with_parent()
    errors = SimpleNamespace(error=lambda msg: print(f"gsrun: monitor: {msg}", file=sys.stderr, flush=True))
    cfg = load_config_or_defaults(errors)
    paths = Paths.from_config(cfg, state_dir, spool_dir)
    os.makedirs(paths.state_dir, mode=0o755, exist_ok=True)
    listener = listen(socket_path(paths.state_dir))
    mon = Monitor(HostFS.from_env(host_root), paths, cfg, nvml=nvml,
                  config_loader=lambda: load_config_or_defaults(errors))
    taken = mon.readopt()
    endpoint = None
    try:
        endpoint = _endpoint(cfg, mon, node_name or socket.gethostname().split(".")[0], metrics_port)
    except NodeError as e:
        mon.log(f"{e} (the node's figures are not served; sampling goes on)")
    mon.log(f"serving {socket_path(paths.state_dir)} (pid {os.getpid()}, {mon._count()} GPU(s), "
            f"{len(taken)} job(s) taken up{': ' + ' '.join(taken) if taken else ''}"
            f"{f'; Prometheus on {endpoint.address}:{endpoint.port}' if endpoint else ''})")
    try:
        return mon.serve(listener)
    finally:
        if endpoint is not None:
            endpoint.close()


def _endpoint(cfg, mon: Monitor, node: str, port: int | None):
    """The Prometheus endpoint serving :attr:`Monitor.latest` (port 0: off)."""
    port = int(cfg["metrics.http_port"]) if port is None else port
    if port == 0:
        return None
    return start_http(cfg["metrics.http_address"], port,
                      GpuCollector(lambda: mon.latest, node, user_label=bool(cfg["metrics.user_label"])))

