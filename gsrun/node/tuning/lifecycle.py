"""A job's tuning from prolog to epilog: apply, verify, restore; status.
The journal rules are :mod:`gsrun.node.tuning`'s (module doc)."""

from __future__ import annotations

import errno
import os
import time

from gsrun.base.errors import GsrunError, InputError, NodeError
from gsrun.base.fsutil import atomic_write_json, read_json
from gsrun.base.ids import check_job_id
from gsrun.node.journal import boot_id as journal_boot_id
from gsrun.node.tuning.cstate import DMA_LATENCY, cstate_hold_us
from gsrun.node.tuning.hugepages import remove_job_hugetlbfs_files
from gsrun.node.tuning.irq import retry_text
from gsrun.node.tuning.knob import BAN_PREFIX, JobScope, _is_scoped, replaceable
from gsrun.node.tuning.plan import KNOBS, Policy, _short, plan_tuning, read_facts
from gsrun.node.tuning.state import JOURNAL_VERSION, _State, _unlink
from gsrun.node.tuning.vm import default_swap_effect
from gsrun.request.tune import parse_tune_request


def _restore_entries(hostfs, entries: list[dict], swap, log, tag: str) -> tuple[list[dict], list[dict]]:
    """Restore ``entries`` in reverse order. Returns (results, entries not restored)."""
    results, left = [], []
    for e in reversed(entries):
        knob = KNOBS.get(e["key"])
        if knob is None:
            left.insert(0, e)
            results.append({"key": e["key"], "result": "failed", "reason": "unknown setting in journal"})
            continue
        try:
            current = knob.read(hostfs)
            if knob.is_prior(current, e["prior"]):
                results.append({"key": e["key"], "result": "already", "prior": e["prior"]})
                continue
            knob.restore(hostfs, e["prior"], swap)
            after = knob.read(hostfs)
            if not knob.is_prior(after, e["prior"]):
                raise NodeError("tune", "verify failed", f"{e['key']} reads {_short(after)} after restore, "
                                f"expected {_short(e['prior'])}")
            results.append({"key": e["key"], "result": "restored", "prior": e["prior"]})
            log(f"gsrun: tune: {tag}: restored {e['key']} = {_short(e['prior'])}")
        except (OSError, GsrunError) as err:
            left.insert(0, e)
            results.append({"key": e["key"], "result": "failed", "reason": _errtext(err)})
            log(f"gsrun: tune: {tag}: could not restore {e['key']}: {_errtext(err)}")
    return results, left


def _errtext(err) -> str:
    if isinstance(err, OSError):
        return f"{err.strerror or err} ({errno.errorcode.get(err.errno, err.errno)})"
    return str(err).splitlines()[0]


def prolog_tune(hostfs, state_dir: str, job_id: str, request: str | None, cfg, partition: str | None,
                exclusive: bool, dry_run: bool = False, log=print, *, swap_effect=None,
                scope: JobScope | None = None) -> dict:
    """Tune the node for ``job_id``: plan, journal, apply, verify.

    ``request``: ``SPANK_GS_TUNE``; ``cfg``: the site config (None: every key
    allowed for exclusive jobs); ``scope``: the job's GPUs, NICs and CPUs
    (None: ``irq`` and ``hugepages`` unsupported). -> ``{"job_id", "dry_run",
    "ok", "items", "applied", "reused", "refused", "unsupported", "failed",
    ..., "holds"}`` (``holds``: ``{"cpu_dma_latency_us": N}`` for the monitor).
    A refused or failed setting is reported; a failed write or verify rolls back.

    Raises:
        NodeError: the state dir or journal unusable (drain: no restore is
            guaranteed), or the tuning lock held over 30 s.
        InputError: ``job_id`` is not a plain job id.
    """
    check_job_id(job_id, phase="tune")
    KNOBS["irq"].configure(*irq_paths(cfg))
    policy = Policy.from_config(cfg, partition)
    req, req_err = {}, None
    if request:
        try:
            req = parse_tune_request(request)
        except InputError as e:
            req_err = f"request ignored: {e.detail}"
    tag = f"job {job_id}"
    st = _State(state_dir, hostfs)
    swap = swap_effect if swap_effect is not None else default_swap_effect(hostfs)
    keys = [k for k in KNOBS if k in req or k in policy.defaults or k == "swappiness"]
    wanted = {k: [v for v in (req.get(k), policy.defaults.get(k)) if v] for k in keys}

    if dry_run:
        data = st.load_baseline() if st.dir.is_dir() else {"entries": []}
        facts = read_facts(hostfs, keys, data["entries"], st.live_jobs(), wanted, scope)
        items = plan_tuning(job_id, req, req_err, policy, exclusive, facts)
        return _report(job_id, True, items, hostfs)

    st.ensure()
    with st.lock():
        data = st.load_baseline()
        data = _drop_if_rebooted(hostfs, st, data, log)
        _ban_dir_from_journal(data["entries"])
        live = st.live_jobs()
        facts = read_facts(hostfs, keys, data["entries"], live, wanted, scope)
        items = plan_tuning(job_id, req, req_err, policy, exclusive, facts)
        for it in items:
            if it.action == "refused":
                log(f"gsrun: tune: {tag}: refused {it.key}={it.value}: {it.reason}")
            elif it.action == "unsupported":
                log(f"gsrun: tune: {tag}: {it.key}: {it.reason}")
            elif it.key in facts.skipped and it.action in ("apply", "unchanged"):
                log(f"gsrun: tune: {tag}: {it.key}: {it.reason}")
        # register the job (it counts for the node's reference count from now on)
        job = {"version": JOURNAL_VERSION, "job_id": job_id, "pid": os.getpid(), "started_unix": time.time(),
               "request": request or "", "partition": partition, "exclusive": bool(exclusive),
               "state": "prolog", "holds": []}
        if not any(it.action in ("apply", "unchanged", "reuse") for it in items):
            # nothing to change or to join (most jobs): the registration is the only write, in
            # its final state; the baseline is left as it is
            job["state"] = "applied"
            replaceable("_write_json")(st.job_path(job_id), job, hostfs)
            return _report(job_id, False, items, hostfs)
        replaceable("_write_json")(st.job_path(job_id), job, hostfs)
        by_key = {e["key"]: e for e in data["entries"]}
        added: list[dict] = []
        failed = None
        for it in items:
            if it.action not in ("apply", "unchanged", "reuse"):
                continue
            e = by_key.get(it.key)
            if e is None:
                e = {"key": it.key, "prior": it.prior, "value": it.value, "owner": job_id, "holders": [job_id]}
                if it.target is not None:
                    e["target"] = it.target
                data["entries"].append(e)
                by_key[it.key] = e
                added.append(e)
            else:  # reuse, or an orphaned entry (its holders are gone) taken over
                e["holders"] = [j for j in e.get("holders", []) if j in live and j != job_id] + [job_id]
                if it.action != "reuse":
                    e["value"], e["owner"] = it.value, job_id
                    if it.target is not None:
                        e["target"] = it.target
                        e["prior"] = {**KNOBS[it.key].prior_of(facts.current.get(it.key), it.target),
                                      **(e.get("prior") or {})}
            if it.action != "apply":
                continue
            st.save_baseline(data)      # journal before change
            knob = KNOBS[it.key]
            target = it.value if it.target is None else it.target
            try:
                note = knob.apply(hostfs, target, swap)
                if note:        # some files refused by the kernel (IRQs): skipped with the reason
                    target = it.target = e["target"] = note["target"]
                    it.reason = "; ".join(x for x in (it.reason, note["note"]) if x)
                    if note.get("skipped"):     # tried once more while the job runs: retry_skipped_irqs
                        e["skipped"] = note["skipped"]
                after = knob.read(hostfs)
                if not knob.matches(after, target):
                    got = knob.shortfall(after, target) if _is_scoped(knob) else _short(after)
                    raise NodeError("tune", "verify failed", f"{it.key} reads {got} after writing {it.value}")
                it.action = "applied"
                log(f"gsrun: tune: {tag}: {it.key} {_short(it.prior)} -> {it.value}")
            except (OSError, GsrunError) as err:
                it.action, it.reason = "failed", _errtext(err)
                failed = it
                log(f"gsrun: tune: {tag}: {it.key}={it.value} failed: {it.reason}; rolling back")
                break
        if failed is not None:
            for it in items:
                if it.action == "apply":
                    it.action, it.reason = "skipped", f"not attempted after {failed.key} failed"
            results, left = _restore_entries(hostfs, added, swap, log, tag)
            ok_keys = {r["key"] for r in results if r["result"] in ("restored", "already")}
            gone = [e for e in added if e["key"] in ok_keys]
            data["entries"] = [e for e in data["entries"] if not any(e is g for g in gone)]
            for it in items:
                if it.key in ok_keys and it.action in ("applied", "unchanged"):
                    it.action, it.reason = "rolled_back", f"rolled back after {failed.key} failed"
        st.save_baseline(data)
        job["state"] = "failed" if failed else "applied"
        job["holds"] = [e["key"] for e in data["entries"] if job_id in e.get("holders", [])]
        replaceable("_write_json")(st.job_path(job_id), job, hostfs)
    return _report(job_id, False, items, hostfs)


def _report(job_id, dry_run, items, hostfs=None) -> dict:
    rows = [i.to_dict() for i in items]

    def keys(*acts):
        return [i.key for i in items if i.action in acts]
    holds = {}
    cst = next((i for i in items if i.key == "cstate" and i.action not in ("refused", "failed", "rolled_back",
                                                                           "skipped")), None)
    if cst is not None and hostfs is not None and hostfs.exists(DMA_LATENCY):
        holds["cpu_dma_latency_us"] = cstate_hold_us(cst.value)
    return {"job_id": job_id, "dry_run": dry_run, "ok": not keys("failed"), "items": rows,
            "planned": keys("apply"), "applied": keys("applied"), "unchanged": keys("unchanged"),
            "reused": keys("reuse"), "refused": keys("refused"), "unsupported": keys("unsupported"),
            "failed": keys("failed"), "rolled_back": keys("rolled_back"), "skipped": keys("skipped"),
            "holds": holds}


def _drop_if_rebooted(hostfs, st: _State, data: dict, log) -> dict:
    """Drop a baseline and job journals from an earlier boot (the reboot reset
    those settings; a stale job journal would count as a job forever)."""
    old, now = data.get("boot_id"), journal_boot_id(hostfs)
    if data["entries"] and old and now and old != now:
        log(f"gsrun: tune: journal is from boot {old}, node booted as {now}: dropping it")
        for j in st.live_jobs():
            _unlink(st.job_path(j))
        data = {"version": JOURNAL_VERSION, "boot_id": now, "entries": []}
        st.save_baseline(data)
        return data
    if now:
        for j in st.live_jobs():
            got = st.journal(st.job_path(j)).load()
            if got is not None and got.earlier_boot:
                log(f"gsrun: tune: job {j}'s journal is from boot {got.boot_id}, node booted as {now}: "
                    "dropping it")
                _unlink(st.job_path(j))
    return data


def irq_paths(cfg) -> tuple[str | None, str | None]:
    """``(tuning.irqbalance_policy_script, tuning.irqbalance_ban_dir)`` of ``cfg``
    (None, None without a config: the defaults)."""
    if cfg is None:
        return None, None
    return cfg["tuning.irqbalance_policy_script"], cfg["tuning.irqbalance_ban_dir"]


def _ban_dir_from_journal(entries) -> None:
    """Point the irq knob at the journal's ban directory, whatever the config says now."""
    for e in entries:
        for k in (e.get("prior") or {}) if e.get("key") == "irq" else ():
            if k.startswith(BAN_PREFIX):
                KNOBS["irq"].configure(None, os.path.dirname(k[len(BAN_PREFIX):]))
                return


def epilog_restore(hostfs, state_dir: str, job_id: str, log=print, *, swap_effect=None,
                   irq_ban_dir: str | None = None, uid: int | None = None) -> dict:
    """The job leaves the node: drop its journal; the last job out (under the
    lock) restores the baseline, first removing ``uid``'s hugetlbfs files when
    a hugepages pool goes back. -> ``{"job_id", "last_job", "remaining_jobs",
    "restored": [{key, result, ...}], "left": [keys], "ok"}``.

    Raises:
        NodeError: state dir unusable, journal unreadable, lock timeout.
    """
    check_job_id(job_id, phase="tune")
    KNOBS["irq"].configure(None, irq_ban_dir)
    return _leave(hostfs, state_dir, [job_id], False, log, swap_effect, uid)


def restore(hostfs, state_dir: str, job_id: str | None = None, all_jobs: bool = False, log=print,
            *, swap_effect=None, irq_ban_dir: str | None = None) -> dict:
    """``gsrun-node restore --job ID`` (as its epilog) or ``--all`` (every job
    journal dropped, the baseline restored); reports as :func:`epilog_restore`.

    Raises:
        InputError: neither or both of ``job_id`` and ``all_jobs``.
        NodeError: as :func:`epilog_restore`.
    """
    if bool(job_id) == bool(all_jobs):
        raise InputError("restore", "what to restore", "give exactly one of --job ID or --all")
    KNOBS["irq"].configure(None, irq_ban_dir)
    if job_id:
        check_job_id(job_id, phase="tune")
        return _leave(hostfs, state_dir, [job_id], False, log, swap_effect)
    return _leave(hostfs, state_dir, [], True, log, swap_effect)


def _leave(hostfs, state_dir, job_ids, all_jobs, log, swap_effect, uid: int | None = None) -> dict:
    st = _State(state_dir, hostfs)
    swap = swap_effect if swap_effect is not None else default_swap_effect(hostfs)
    tag = "restore --all" if all_jobs else f"job {job_ids[0]}"
    report = {"job_id": None if all_jobs else job_ids[0], "all_jobs": all_jobs, "had_journal": False,
              "last_job": False, "remaining_jobs": [], "restored": [], "left": [], "ok": True}
    if not st.dir.is_dir():
        report["last_job"] = True
        return report
    with st.lock():
        data = st.load_baseline()
        data = _drop_if_rebooted(hostfs, st, data, log)
        live = st.live_jobs()
        leaving = live if all_jobs else [j for j in job_ids if j in live]
        report["had_journal"] = bool(leaving)
        for j in leaving:           # leave first: a crash below leaves a job-less baseline, which the
            # next epilog or restore --all puts back; not fsync'd: a machine crash makes it an earlier boot's
            _unlink(st.job_path(j), durable=False)
        remaining = [j for j in live if j not in leaving]
        report["remaining_jobs"] = remaining
        if remaining:
            changed = False
            for e in data["entries"]:
                holders = [h for h in e.get("holders", []) if h not in leaving]
                if holders != e.get("holders", []):
                    e["holders"], changed = holders, True
            if changed:             # a job that held nothing leaves the baseline as it is
                st.save_baseline(data)
            if data["entries"]:
                log(f"gsrun: tune: {tag}: jobs {', '.join(remaining)} still on the node; node settings kept")
            return report
        report["last_job"] = True
        if not data["entries"]:     # nothing was changed on the node: no baseline to restore or remove
            return report
        if uid is not None and any(e.get("key") == "hugepages" for e in data["entries"]):
            report["hugetlbfs_removed"] = ["/" + p for p in remove_job_hugetlbfs_files(hostfs, int(uid), log)]
        results, left = _restore_entries(hostfs, data["entries"], swap, log, tag)
        data["entries"] = left
        st.save_baseline(data)
        report["restored"] = results
        report["left"] = [e["key"] for e in left]
        report["ok"] = not left
    return report


def retry_skipped_irqs(hostfs, state_dir: str, job_id: str, prolog_record=None, log=print,
                       clock=time.time) -> list[dict]:
    """Once per job, write again the IRQs of its ``irq=local`` the kernel
    refused in the prolog, under the lock, priors journaled first. The
    outcome goes to the job's journal (``irq_retry``) and the ``irq`` item of
    ``prolog_record``. -> the outcomes (``[]``: nothing to do).

    Raises:
        InputError: ``job_id`` is not a plain job id.
        NodeError: journal unusable, tuning lock held over 30 s.
    """
    check_job_id(job_id, phase="tune")
    st = _State(state_dir, hostfs)
    if not st.dir.is_dir():
        return []
    tag = f"job {job_id}"
    with st.lock():
        if job_id not in st.live_jobs():
            return []
        job = st.journal(st.job_path(job_id)).read()
        if not isinstance(job, dict) or job.get("state") != "applied" or "irq_retry" in job:
            return []
        data = st.load_baseline()
        e = next((x for x in data["entries"] if x.get("key") == "irq" and x.get("owner") == job_id
                  and job_id in (x.get("holders") or [])), None)
        skipped = dict((e or {}).get("skipped") or {})
        if not skipped:
            return []
        knob = KNOBS["irq"]
        prior = e.setdefault("prior", {})
        if any(k not in prior for k in skipped):        # journal before the change
            current = knob.read(hostfs) or {}
            for k in skipped:
                prior.setdefault(k, current.get(k))
            st.save_baseline(data)
        outcomes = knob.retry(hostfs, skipped)
        for o in outcomes:
            if o["result"] == "applied":
                e.setdefault("target", {})[o["key"]] = skipped.pop(o["key"])
        if skipped:
            e["skipped"] = skipped
        else:
            e.pop("skipped", None)
        st.save_baseline(data)
        started = job.get("started_unix")
        after_s = clock() - started if isinstance(started, (int, float)) else None
        job["irq_retry"] = {"time": round(clock(), 3), "outcomes": outcomes}
        replaceable("_write_json")(st.job_path(job_id), job, hostfs)
    text = retry_text(outcomes, after_s)
    log(f"gsrun: tune: {tag}: irq: {text}")
    if prolog_record is not None:
        _record_irq_retry(prolog_record, text, outcomes, log, tag)
    return outcomes


def _record_irq_retry(path, text: str, outcomes: list[dict], log, tag: str) -> None:
    """Append a retry's outcome to the ``irq`` item of the prolog record at ``path``."""
    rec = read_json(path)
    items = ((rec or {}).get("steps") or {}).get("tuning", {}) if isinstance(rec, dict) else None
    items = items.get("items") if isinstance(items, dict) else None
    it = next((x for x in items or () if isinstance(x, dict) and x.get("key") == "irq"), None)
    if it is None:
        log(f"gsrun: tune: {tag}: irq retry not recorded: no irq item in {path}")
        return
    it["reason"] = "; ".join(x for x in (str(it.get("reason") or ""), text) if x)
    it["retry"] = outcomes
    try:
        atomic_write_json(path, rec, mode=0o600, durable=False)
    except OSError as err:
        log(f"gsrun: tune: {tag}: irq retry not recorded in {path}: {_errtext(err)}")


def status(hostfs, state_dir: str) -> dict:
    """What is changed on the node and by which job (``gsrun-node status --json``).

    Returns ``{"jobs": [...], "changes": [{key, prior, value, owner, holders,
    current, in_effect}], "boot_id"}``; read without the lock (journal files
    are replaced atomically).
    """
    st = _State(state_dir, hostfs)
    data = st.load_baseline() if st.dir.is_dir() else {"entries": [], "boot_id": None}
    changes = []
    for e in data["entries"]:
        knob = KNOBS.get(e["key"])
        cur = knob.read(hostfs) if knob else None
        if knob is not None and _is_scoped(knob):   # only the files this entry governs
            cur = {k: (cur or {}).get(k) for k in (e.get("target") or {})}
        changes.append({**e, "current": cur,
                        "in_effect": bool(knob and knob.matches(cur, e.get("target", e["value"])))})
    return {"jobs": st.live_jobs(), "changes": changes, "boot_id": data.get("boot_id"),
            "state_dir": str(st.dir)}


def format_status(st: dict) -> str:
    """Text for ``gsrun-node status``."""
    lines = [f"tuning jobs on node: {', '.join(st['jobs']) or 'none'}"]
    for c in st["changes"]:
        lines.append(f"  {c['key']:<24} {c['value']:<12} (was {_short(c['prior'])}) by job {c['owner']}, "
                     f"held by {', '.join(c.get('holders') or []) or 'nobody'}"
                     + ("" if c["in_effect"] else f"; now reads {_short(c['current'])}"))
    if not st["changes"]:
        lines.append("  no node setting changed")
    return "\n".join(lines) + "\n"
