"""While the job runs: the live node file, idle alerts and the opt-in cancel
(docs/ADMIN.md), after each sampler flush (:meth:`LiveActions.after_flush`).

- Live file ``<spool>/jobs/<id>/user-live-<node>.json`` (:func:`live_doc`,
  ~1 KiB per GPU, root's, the job's group, 0440), at most every ``live.flush_s``.
- Alert: a line in the live file and, with ``idle.alert_mail``, one mail per
  condition and job: the first node to claim ``alert-<condition>.json`` (a hard
  link) publishes ``<spool>/alerts/new/<job>.<condition>[-<n>].json``.
- Cancel (``idle.cancel``): only the first node decides
  (:func:`gsrun.request.waste.cancel_decision`), from its GPUs and the other
  nodes' fresh live files; ``on`` warns, then after ``idle.cancel_grace_min``
  runs ``scancel <id>`` once.

The job record is read in :data:`SLURM_POOL`, waited for once up to
:data:`SLURM_WAIT_S`: a slow or absent slurmctld never stalls the node's polls
and hooks at every flush (``scancel``, once per job, runs in the loop).
"""

from __future__ import annotations

import json
import subprocess
import time
from concurrent import futures
from contextlib import suppress
from pathlib import Path

from gsrun.base.errors import SlurmError
from gsrun.base.fsutil import publish_once, read_json, read_spool_json, write_user_copy
from gsrun.base.ids import check_job_id, is_node_name
from gsrun.base.log import JobLog
from gsrun.base.proc import ROOT_CWD, root_child_env, root_python
from gsrun.facts.live import LIVE_PREFIX, LIVE_VERSION, MAX_LIVE_BYTES, alert_count, queue_alert
from gsrun.facts.slurm import exemption_argv, parse_exemption_record, parse_job_record, run_slurm
from gsrun.request.waste import CONDITIONS, alert_plan, all_idle_since, cancel_decision, cancel_step

MAX_ALERT_LINES = 16             # alert lines kept in the live file (one per GPU and kind at most)
MAX_ACTIONS = 32                 # actions kept in the sampler state (alert mails, cancel steps), newest
STALE_FACTOR = 3.0               # another node's live file older than this x live.flush_s: its GPUs count unknown
FINDING_WORDS = {"gpu_idle": "idle", "gpu_stuck_collective": "looks stuck in a collective (busy at idle power)",
                 "gpu_never_used": "not used by the job"}
_METRIC_KEEP = ("n", "weight_s", "wsum", "min", "max", "gap_s", "vsum")
SLURM_POOL = futures.ThreadPoolExecutor(4, "slurm")     # no thread before the first command (fork-safe)
SLURM_WAIT_S = 1.0               # a job record that takes longer is taken at a later flush


# ----------------------------------------------------------------------------- the live file (pure parts)

def compact_metric(m: dict) -> dict:
    """A ``Metric.to_dict`` with only the keys
    :func:`gsrun.report.summary.gpu_record` reads (no histogram)."""
    out = {k: m[k] for k in _METRIC_KEEP if k in m and m[k] not in (0, 0.0, None)}
    if m.get("thresholds"):
        out["thresholds"] = list(m["thresholds"])
        out["above_s"] = dict(m.get("above_s") or {})
    return out


def live_doc(state_json: dict, job_env: dict, now: float, all_idle_since: float | None,
             findings: list[dict], alerts: list[str], cancel: dict | None) -> dict:
    """The live node file's content. Pure. ``state_json``: the sampler state
    (timelines dropped here); ``job_env``: what
    :func:`gsrun.report.summary.node_record` needs; ``all_idle_since``: epoch
    s since every GPU here is idle, or None. Shape::

        {"kind": "live", "version": 1, "job_id", "node", "written": epoch s,
         "job_env": {...}, "state": <sampler state, aggregates only>,
         "all_idle_since": epoch s | null, "findings": [finding dicts],
         "alerts": ["line", ...], "cancel": {"action", "reason", "time"} | null}
    """
    st = dict(state_json)
    for k in ("cpu_timeline", "watch", "waste_findings", "live_actions"):
        st.pop(k, None)
    gpus = []
    for g in state_json.get("gpus") or ():
        d = {k: v for k, v in g.items() if k not in ("timeline", "metrics")}
        d["metrics"] = {k: compact_metric(m) for k, m in (g.get("metrics") or {}).items()
                        if isinstance(m, dict) and m.get("n")}
        gpus.append(d)
    st["gpus"] = gpus
    mem = dict(st.get("mem") or {})
    if isinstance(mem.get("sampled"), dict):
        mem["sampled"] = compact_metric(mem["sampled"])
    st["mem"] = mem
    return {"kind": "live", "version": LIVE_VERSION, "job_id": state_json.get("job_id"),
            "node": state_json.get("node"), "written": round(now, 3), "job_env": job_env, "state": st,
            "all_idle_since": all_idle_since, "findings": list(findings)[:64],
            "alerts": list(alerts)[-MAX_ALERT_LINES:], "cancel": cancel}


def alert_line(finding: dict, node: str, start_time: float) -> str:
    """``GPU 0 on gpu01 idle since 10:02:03 (12.5 min)`` for a finding
    (``since_s``/``detected_s`` after ``start_time``, epoch). Pure."""
    code = str(finding.get("code") or "")
    what = FINDING_WORDS.get(code, code.replace("_", " "))
    since = finding.get("since_s")
    det = finding.get("detected_s")
    gpu = finding.get("gpu")
    line = f"GPU {gpu} on {node} {what}"
    if isinstance(since, (int, float)):
        line += " since " + time.strftime("%H:%M:%S", time.localtime(start_time + since))
        if isinstance(det, (int, float)) and det >= since:
            line += f" ({(det - since) / 60.0:.1f} min)"
    return line


def job_fields_from_record(rec: dict | None) -> dict | None:
    """The cancel's fields of a parsed ``scontrol -o show job`` record, or None. Pure."""
    if not rec:
        return None

    def val(k):
        v = rec.get(k)
        return None if v in (None, "", "(null)", "None", "N/A") else v
    user = (val("UserId") or "").split("(")[0] or None
    return {"partition": val("Partition"), "qos": val("QOS"), "user": user, "account": val("Account"),
            "interactive": rec.get("BatchFlag") == "0", "mail_user": val("MailUser")}


def job_idle_since(mine: float | None, others: list[dict | None], now: float, stale_s: float) -> float | None:
    """Epoch seconds since which every GPU of the job is idle (the latest of
    the nodes'); None when a node is busy, silent or older than ``stale_s``. Pure."""
    if mine is None:
        return None
    latest = mine
    for d in others:
        if not isinstance(d, dict):
            return None
        w, since = d.get("written"), d.get("all_idle_since")
        if not isinstance(w, (int, float)) or now - w > stale_s or not isinstance(since, (int, float)) \
                or isinstance(since, bool):
            return None
        latest = max(latest, float(since))
    return latest


# ----------------------------------------------------------------------------- effects

def kick_mail_flush() -> None:
    """Start ``gsrun-node mail flush`` detached (it handles alert requests
    first); never blocks the sampler."""
    with suppress(OSError):
        subprocess.Popen(root_python("-m", "gsrun.admin.node", "mail", "flush"), stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                         close_fds=True, cwd=ROOT_CWD,
                         env=root_child_env(("GSRUN_SPOOL_DIR", "GSRUN_LOG_FILE")))


def run_scancel(job_id: str, timeout_s: float) -> tuple[bool, str]:
    """``scancel <job_id>`` once, no shell, bounded. -> (ok, detail)."""
    check_job_id(job_id, array=True)
    try:
        cp = run_slurm(["scancel", job_id], timeout_s, check=False)
    except SlurmError as e:
        return False, str(e)
    if cp.returncode != 0:
        return False, ((cp.stderr or cp.stdout).strip().splitlines() or [f"exit {cp.returncode}"])[-1][:300]
    return True, "scancel accepted"


#: The exemption fields of a record that does not parse: exempt from nothing (allow-lists)
NOT_EXEMPT = {"partition": None, "qos": None, "user": None, "account": None, "interactive": False,
              "unparsable": True}


def read_cancel_fields(job_id: str, timeout_s: float) -> dict | None:
    """The job for :func:`gsrun.request.waste.cancel_decision`: its exemption
    fields from ``squeue`` (:data:`NOT_EXEMPT` when they do not parse) and
    ``mail_user`` from the job record; None when Slurm could not be asked."""
    out = _slurm_stdout(exemption_argv(job_id), timeout_s)
    if out is None:
        return None
    fields = parse_exemption_record(out, job_id)
    job = dict(NOT_EXEMPT) if fields is None else {**fields, "unparsable": False}
    rec = job_fields_from_record(read_job_record(job_id, timeout_s))
    job["mail_user"] = (rec or {}).get("mail_user")
    return job


def read_job_record(job_id: str, timeout_s: float) -> dict | None:
    """``scontrol -o show job <id>`` parsed (forged duplicate fields dropped), or None."""
    out = _slurm_stdout(["scontrol", "-o", "show", "job", check_job_id(job_id, array=True)], timeout_s)
    return None if out is None else parse_job_record(out, job_id)


def _slurm_stdout(argv: list[str], timeout_s: float) -> str | None:
    """The output of a Slurm command that succeeded with some, else None."""
    try:
        cp = run_slurm(argv, timeout_s, check=False)
    except SlurmError:
        return None
    return cp.stdout if cp.returncode == 0 and cp.stdout.strip() else None


class LiveActions:
    """The sampler's while-the-job-runs effects (module doc); ``idle_cfg``
    None: only the live file. ``scancel``: ``job_id -> (ok, detail)``."""

    def __init__(self, spool_dir, job_id: str, node: str, uid: int, idle_cfg=None, live_flush_s: float = 30.0,
                 command_timeout_s: float = 15.0, clock=time.time, job_record=None, scancel=None, kick=None,
                 log=None):
        self.spool_dir = Path(spool_dir)
        self.job_id = check_job_id(job_id, array=True)
        self.node = node
        self.uid = uid
        self.idle_cfg = idle_cfg
        self.live_flush_s = float(live_flush_s)
        self.timeout_s = command_timeout_s
        self.clock = clock
        self._job_record = job_record or (lambda j: read_cancel_fields(j, command_timeout_s))
        self._scancel = scancel or (lambda j: run_scancel(j, command_timeout_s))
        self._kick = kick or kick_mail_flush
        if log is None:
            log = JobLog(job_id, "sampler")
        self.log = log
        self.last_write: float | None = None
        self.prolog: dict | None = None
        self.job: dict | None = None          # job fields from the job record, read once
        self._want_kick = False
        self._record_call: futures.Future | None = None
        self._record_waited = False

    def _job_fields(self) -> dict | None:
        """``job_record`` in :data:`SLURM_POOL` -> its answer, or None while it
        runs (a later flush takes it) or when Slurm could not be asked (asked again)."""
        if self._record_call is None:
            self._record_call = SLURM_POOL.submit(self._job_record, self.job_id)
            if not self._record_waited:       # only the first ask waits: a Slurm that stays down costs none
                self._record_waited = True
                futures.wait([self._record_call], SLURM_WAIT_S)
        if not self._record_call.done():
            return None
        call, self._record_call = self._record_call, None
        return call.result()

    # -- facts this node has
    def _prolog(self) -> dict | None:
        """This node's prolog record (maybe not yet written at the first flush)."""
        if self.prolog is None:
            rec = read_json(self.spool_dir / "jobs" / self.job_id / f"prolog-{self.node}.json")
            if rec and isinstance(rec.get("job"), dict):
                self.prolog = rec
        return self.prolog

    def job_env(self, state: dict) -> dict:
        rec = self._prolog() or {}
        job = rec.get("job") or {}
        gpus = [g["ref"]["gres_index"] for g in state.get("gpus") or () if isinstance(g.get("ref"), dict)]
        return {"job_id": self.job_id, "node": self.node, "cpus_on_node": job.get("cpus_on_node"),
                "gpus": job.get("gpus") if job.get("gpus") is not None else gpus,
                "prolog_time": rec.get("prolog_time"), "nodelist": job.get("nodelist") or [self.node],
                "user": job.get("user"), "partition": job.get("partition")}

    def _acts(self, state: dict) -> dict:
        return state.setdefault("live_actions", {"seen_keys": [], "alerts": [], "cancel": None, "report_noted": False})

    @staticmethod
    def _line(acts: dict, *lines: str) -> None:
        acts["alerts"] = (acts["alerts"] + list(lines))[-MAX_ALERT_LINES:]

    def _queue(self, kind: str, req: dict, what: str, count: bool = True) -> bool:
        """Queue the mail request ``req`` (the n-th of ``kind`` when ``count``);
        a failure is logged as ``<what> not queued``. -> queued now."""
        try:
            n = alert_count(self.spool_dir, self.job_id, kind) + 1 if count else 1
            if queue_alert(self.spool_dir, self.job_id, kind, req, n):
                self._want_kick = True
                return True
        except Exception as e:  # noqa: BLE001 - kept in the live file; the mail is lost only with the spool
            self.log.warn(f"{what} not queued: {e}")
        return False

    # -- the hook
    def after_flush(self, state: dict, state_json_fn) -> None:
        """After a sampler flush: alerts, the cancel decision, the live file when
        due (``state_json_fn()``: the state's JSON form). Never raises."""
        try:
            now = self.clock()
            event = self._alerts(state, now)
            event = self._cancel(state, now) or event
            if event or self.last_write is None or now - self.last_write >= self.live_flush_s:
                self.write_live(state, state_json_fn(), now)
            if self._want_kick:     # after the live file: the alert mail carries the report so far
                self._want_kick = False
                self._kick()
        except Exception as e:  # noqa: BLE001 - the sampler goes on
            self.log.warn(f"live: {type(e).__name__}: {e}")

    def node_idle_since(self, state: dict) -> float | None:
        """Epoch seconds since which all of this node's job GPUs are idle, or None."""
        ws = state.get("watch")
        if not ws or self.idle_cfg is None:
            return None
        since = all_idle_since(ws)
        return None if since is None else float(state["start_time"]) + float(since)

    def write_live(self, state: dict, state_json: dict, now: float) -> None:
        acts = self._acts(state)
        doc = live_doc(state_json, self.job_env(state), now, self.node_idle_since(state),
                       list(state.get("waste_findings") or ()), acts["alerts"], acts["cancel"])
        d = self.spool_dir / "jobs" / self.job_id
        if not d.is_dir():
            return      # the prolog makes it; nothing to publish into yet
        gid = (self._prolog() or {}).get("job", {}).get("gid", self.uid)
        # not fsync'd: rewritten at the next flush, and an fsync (a commit on an NFS spool) stalls every job's polls
        write_user_copy(d / f"{LIVE_PREFIX}{self.node}.json",
                        json.dumps(doc, separators=(",", ":"), sort_keys=True) + "\n", gid, durable=False)
        self.last_write = now

    def _active_conditions(self, state: dict, new: list[dict]) -> set[str]:
        """The alert conditions that hold on this node now (still active, or new this flush)."""
        codes = {d.get("code") for w in state.get("watch") or () if hasattr(w, "active") for d in w.active}
        codes |= {f.get("code") for f in new}
        return {CONDITIONS[c] for c in codes if c in CONDITIONS}

    def _alerts(self, state: dict, now: float) -> bool:
        acts = self._acts(state)
        seen = acts.setdefault("seen_keys", [])
        new = []
        for f in state.get("waste_findings") or ():
            key = f"{f.get('gpu')}|{f.get('code')}|{f.get('since_s')}"
            if key not in seen:
                seen.append(key)
                new.append(f)
        del seen[:-256]       # bounded (the detector keeps at most 64 findings)
        fired = acts.setdefault("fired", {})
        raise_, rearm = alert_plan(fired, self._active_conditions(state, new))
        if not state.get("watch"):
            rearm = []        # no detector state: whether a condition cleared is unknown, so it stays fired
        for cond in rearm:
            fired[cond] = False
            self._release_marker(cond)
        if not new:
            return False
        t0 = float(state["start_time"])
        lines = [alert_line(f, self.node, t0) for f in new]
        self._line(acts, *lines)
        for ln in lines:
            self.log(f"alert: {ln}")
        cfg = self.idle_cfg
        mail_on = cfg is not None and getattr(cfg, "alert_mail", True)
        for cond in raise_:
            fired[cond] = True
            mine = [f for f in new if CONDITIONS.get(f.get("code")) == cond]
            if not mail_on or not mine or not self._take_marker(cond, now):
                continue      # no mail, or another node's alert for this condition still stands
            user = (self._prolog() or {}).get("job", {}).get("user")
            req = {"job_id": self.job_id, "kind": cond, "node": self.node, "uid": self.uid, "user": user,
                   "lines": [alert_line(f, self.node, t0) for f in mine],
                   "findings": [dict(f, node=self.node) for f in mine[:16]],
                   "time": round(now, 3)}
            if self._queue(cond, req, "alert"):
                self._record(state, now, "alert_mailed", "; ".join(req["lines"]), kind=cond)
        return True

    def _record(self, state: dict, now: float, action: str, detail: str, kind: str | None = None) -> None:
        """One action in the sampler state's ``actions`` (the newest
        :data:`MAX_ACTIONS`; shape :class:`gsrun.facts.sampler_state.WasteAction`):
        the node summary, the job summary and ``gseff`` show them."""
        acts = state.setdefault("actions", [])
        acts.append({"time": round(now, 3), "node": self.node, "action": action, "kind": kind,
                     "detail": detail[:600]})
        del acts[:-MAX_ACTIONS]

    def _marker(self, cond: str) -> Path:
        return self.spool_dir / "jobs" / self.job_id / f"alert-{cond}.json"

    def _take_marker(self, cond: str, now: float) -> bool:
        """Claim the job's alert for ``cond`` (``<spool>/jobs/<id>/alert-<cond>.json``,
        one per job until the claiming node re-arms it). False: another node holds it."""
        rec = {"node": self.node, "time": round(now, 3)}
        try:
            return publish_once(self._marker(cond), (json.dumps(rec, sort_keys=True) + "\n").encode())
        except OSError as e:
            self.log.warn(f"alert marker for {cond} not written: {e}")
            return False

    def _release_marker(self, cond: str) -> None:
        """Re-arm the job's alert for ``cond`` when this node holds it."""
        p = self._marker(cond)
        held = read_json(p)
        if isinstance(held, dict) and held.get("node") == self.node:
            with suppress(OSError):
                p.unlink()

    def _is_lead(self) -> bool | None:
        nodes = ((self._prolog() or {}).get("job") or {}).get("nodelist") or []
        return nodes[0] == self.node if nodes else None

    def _cancel(self, state: dict, now: float) -> bool:
        cfg = self.idle_cfg
        acts = self._acts(state)
        if cfg is None or acts["cancel"] is not None and acts["cancel"].get("action") in ("cancel", "cancel_failed"):
            return False
        mode = getattr(cfg, "cancel", "off")
        after = getattr(cfg, "cancel_after_min", None)
        if mode not in ("report", "on") or after is None or not self._is_lead():
            return False
        decided = self._decide(state, acts, now, after)
        if decided is None:
            return False     # Slurm not reachable: asked again at the next flush, a warning stands
        action, reason = decided
        t0 = float(state["start_time"])     # the detector's frame: seconds since the sampler started
        warned = acts.get("warned_at")
        step = cancel_step(action, None if warned is None else warned - t0, now - t0,
                           getattr(cfg, "cancel_grace_min", 15.0))
        if step == "none":
            if warned is None:
                return False
            acts["warned_at"] = None       # the GPUs work again (or the job is exempt): the warning is void
            line = f"job {self.job_id}: idle-cancel warning withdrawn (its GPUs are no longer all idle)"
            self._line(acts, line)
            self.log(line)
            return True
        if step == "report":
            if acts.get("report_noted"):
                return False
            acts["report_noted"] = True
            note = f"idle cancel (report mode): would cancel job {self.job_id}: {reason}"
            self._record(state, now, "cancel_report", reason)
            self.log.warn(note)
            state.setdefault("notes", []).append(note)
            acts["cancel"] = {"action": "report", "reason": reason, "time": round(now, 3)}
            return True
        if step == "warn":
            return self._warn(state, acts, reason, now)
        if step == "wait":
            return False
        reason += (f"; warned {round((now - warned) / 60.0, 2):g} min before, at "
                   f"{time.strftime('%H:%M:%S', time.localtime(warned))} (idle.cancel_grace_min)")
        return self._do_cancel(state, acts, reason, now)

    def _decide(self, state: dict, acts: dict, now: float, after: float) -> tuple[str, str] | None:
        """:func:`cancel_decision` on this node's and the other nodes' facts;
        ``("none", why)`` when not due, None when the job record is unknown now."""
        mine = self.node_idle_since(state)
        if mine is None:
            return "none", "not all GPUs of this node idle"
        nodes = [n for n in (self._prolog() or {}).get("job", {}).get("nodelist") or () if n != self.node]
        others = [self._other_live(n) for n in nodes]
        since = job_idle_since(mine, others, now, STALE_FACTOR * max(self.live_flush_s, 1.0))
        if since is None:
            return "none", "not every node's GPUs known idle"
        if now - since < 60.0 * after:      # not due for any job yet (an interactive one has more grace)
            return "none", "not idle long enough"
        if self.job is None:
            self.job = self._job_fields()
        if self.job is None:
            return None     # Slurm not reachable, or not answered yet
        if self.job.get("unparsable") and not acts.get("unparsable_noted"):
            acts["unparsable_noted"] = True
            self.log.warn("idle cancel: the job's exemption fields do not parse as one record (a '|' or newline "
                          "in its account?): no exemption applies")
        t0 = float(state["start_time"])
        return cancel_decision(self.idle_cfg, self.job, since - t0, now - t0)

    def _warn(self, state: dict, acts: dict, reason: str, now: float) -> bool:
        """The warning before the cancel: live file, syslog, action, mail."""
        grace = float(getattr(self.idle_cfg, "cancel_grace_min", 15.0))
        at = now + 60.0 * grace
        line = (f"job {self.job_id} will be cancelled at {time.strftime('%H:%M', time.localtime(at))} "
                f"(in {grace:g} min) unless its GPUs work again: {reason}")
        acts["warned_at"] = round(now, 3)
        self._line(acts, line)
        self.log.warn(line)
        self._record(state, now, "cancel_warned", line)
        if getattr(self.idle_cfg, "alert_mail", True):
            req = {"job_id": self.job_id, "kind": "warning", "node": self.node, "uid": self.uid,
                   "user": (self.job or {}).get("user"), "mail_user": (self.job or {}).get("mail_user"),
                   "lines": [line], "reason": reason, "cancel_at": round(at, 3), "grace_min": grace,
                   "time": round(now, 3)}
            self._queue("warning", req, "cancel warning mail")
        return True

    def _do_cancel(self, state: dict, acts: dict, reason: str, now: float) -> bool:
        marker = self.spool_dir / "jobs" / self.job_id / "idle-cancel.json"
        rec = {"job_id": self.job_id, "node": self.node, "reason": reason, "time": round(now, 3)}
        if not publish_once(marker, (json.dumps(rec, sort_keys=True) + "\n").encode()):
            acts["cancel"] = {"action": "cancel", "reason": reason, "time": round(now, 3), "detail": "already done"}
            return False
        self._record(state, now, "cancel_requested", f"scancel {self.job_id}: {reason}")
        ok, detail = self._scancel(self.job_id)
        self._record(state, self.clock(), "cancel_done" if ok else "cancel_failed", detail)
        note = f"cancelled by gsrun (idle GPUs): {reason}" if ok else \
            f"idle cancel failed: scancel {self.job_id}: {detail} (reason: {reason})"
        (self.log.warn if ok else self.log.error)(note)
        state.setdefault("notes", []).append(note)
        acts["cancel"] = {"action": "cancel" if ok else "cancel_failed", "reason": reason, "time": round(now, 3),
                          "detail": detail}
        self._line(acts, f"job {self.job_id} cancelled: {reason}")
        if ok and getattr(self.idle_cfg, "alert_mail", True):
            req = {"job_id": self.job_id, "kind": "cancel", "node": self.node, "uid": self.uid,
                   "user": (self.job or {}).get("user"), "mail_user": (self.job or {}).get("mail_user"),
                   "lines": [f"job {self.job_id} cancelled: {reason}"], "reason": reason, "time": round(now, 3)}
            self._queue("cancel", req, "cancel mail", count=False)
        return True

    def _other_live(self, node: str) -> dict | None:
        if not is_node_name(node):
            return None
        d = read_spool_json(self.spool_dir / "jobs" / self.job_id / f"{LIVE_PREFIX}{node}.json", MAX_LIVE_BYTES)
        return d if isinstance(d, dict) and d.get("kind") == "live" else None
