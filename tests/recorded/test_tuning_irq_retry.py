"""The one retry of IRQs the kernel refused in the prolog (``irq=local``), while the
job runs: ``tuning.retry_skipped_irqs`` on the H200 VM tree (``helpers.tuning_tree``)
whose IRQ 45 refuses its first write with ENOSPC (the x86 vector allocator, no free
vector on those CPUs) and, as vectors free up, takes the second one; the journal, the
epilog's restore, the report's ``irq`` line, and the cases where it must do nothing."""

from __future__ import annotations

import errno
import json

from gsrun.facts.hostfs import HostFS
from gsrun.node import tuning
from gsrun.report.node_end import node_settings
from helpers.tuning_tree import GPU_BDF, GPU_IRQS, CountingHostFS, add_host_tuning, diff, make_tree, snapshot

Q = lambda m: None  # noqa: E731
JOB = "77"
BAD = GPU_IRQS[3]
SCOPE = tuning.JobScope([{"bdf": GPU_BDF, "kind": "gpu", "name": "0", "numa_node": None}],
                        list(range(4, 12)), {0: list(range(16))}, "test")


def settings_json(*args) -> list[dict]:
    """node_settings' records in their JSON form, as a node summary holds them."""
    return [s.to_json() for s in node_settings(*args)]


class Clock:
    def __init__(self, t):
        self.t = t

    def __call__(self):
        return self.t


def _prolog(tmp_path, fail_errno=errno.ENOSPC):
    """The prolog's tuning with IRQ ``BAD`` refused, and its record as the prolog writes it."""
    root = add_host_tuning(make_tree(tmp_path / "h", swap=False))
    base = snapshot(root)
    h = CountingHostFS(root, fail_path=f"proc/irq/{BAD}/smp_affinity_list", fail_errno=fail_errno)
    r = tuning.prolog_tune(h, str(tmp_path / "s"), JOB, "irq=local", None, None, True, log=Q, scope=SCOPE)
    assert r["applied"] == ["irq"], r
    rec = tmp_path / "prolog-n1.json"
    rec.write_text(json.dumps({"job": {"job_id": JOB}, "steps": {"tuning": r}}))
    return root, base, h, rec


def _started(tmp_path) -> float:
    return json.loads((tmp_path / "s" / "tuning" / "jobs" / f"{JOB}.json").read_text())["started_unix"]


def test_skipped_irq_takes_its_cpus_on_the_retry_and_the_epilog_restores_it(tmp_path):
    root, base, h, rec = _prolog(tmp_path)
    assert (root / f"proc/irq/{BAD}/smp_affinity_list").read_text() == "0-15\n"
    h.fail_path = None                                    # vectors freed since the prolog
    logs: list[str] = []
    out = tuning.retry_skipped_irqs(h, str(tmp_path / "s"), JOB, prolog_record=rec, log=logs.append,
                                    clock=Clock(_started(tmp_path) + 60.0))
    assert out == [{"key": str(BAD), "irq": str(BAD), "cpus": "4-11", "result": "applied", "reason": ""}]
    assert h.writes == [f"proc/irq/{n}/smp_affinity_list" for n in GPU_IRQS if n != BAD] + \
        [f"proc/irq/{BAD}/smp_affinity_list"]
    for n in GPU_IRQS:
        assert (root / f"proc/irq/{n}/smp_affinity_list").read_text() == "4-11\n", n
    # the journal: the IRQ is now in the entry's target, its prior the value before the job
    entry = tuning.status(HostFS(root), str(tmp_path / "s"))["changes"][0]
    assert entry["target"][str(BAD)] == "4-11" and entry["prior"][str(BAD)] == "0-15"
    assert "skipped" not in entry and entry["in_effect"]
    # the report: the irq line says both the skip and the retry
    item = json.loads(rec.read_text())["steps"]["tuning"]["items"][0]
    assert item["retry"] == out
    setting = settings_json(json.loads(rec.read_text()))[0]
    assert setting["state"] == "applied"
    assert f"skipped IRQ {BAD}: ENOSPC (no free vector on those CPUs)" in setting["reason"]
    assert setting["reason"].endswith(f"; retried once 60 s into the job: IRQ {BAD} now on 4-11")
    assert logs == [f"gsrun: tune: job {JOB}: irq: retried once 60 s into the job: IRQ {BAD} now on 4-11"]
    # the epilog puts every IRQ back, the retried one included
    out = tuning.epilog_restore(HostFS(root), str(tmp_path / "s"), JOB, log=Q)
    assert out["ok"] and out["last_job"]
    assert diff(base, snapshot(root)) == []
    assert (root / f"proc/irq/{BAD}/smp_affinity_list").read_text() == "0-15\n"


def test_refused_again_stays_skipped_and_is_named(tmp_path):
    root, base, h, rec = _prolog(tmp_path, errno.EIO)
    out = tuning.retry_skipped_irqs(h, str(tmp_path / "s"), JOB, prolog_record=rec, log=Q,
                                    clock=Clock(_started(tmp_path) + 61.0))
    assert [(o["irq"], o["result"], o["reason"]) for o in out] == \
        [(str(BAD), "skipped", "EIO (kernel-managed or not movable)")]
    entry = tuning.status(HostFS(root), str(tmp_path / "s"))["changes"][0]
    assert entry["skipped"] == {str(BAD): "4-11"} and str(BAD) not in entry["target"]
    reason = settings_json(json.loads(rec.read_text()))[0]["reason"]
    assert reason.endswith(f"retried once 61 s into the job: IRQ {BAD} still skipped: EIO "
                           "(kernel-managed or not movable)")
    assert tuning.epilog_restore(HostFS(root), str(tmp_path / "s"), JOB, log=Q)["ok"]
    assert diff(base, snapshot(root)) == []


def test_once_per_job(tmp_path):
    root, _, h, rec = _prolog(tmp_path)
    first = tuning.retry_skipped_irqs(h, str(tmp_path / "s"), JOB, prolog_record=rec, log=Q)
    assert [o["result"] for o in first] == ["skipped"]       # still no vector
    h.fail_path = None
    n_writes, text = len(h.writes), rec.read_text()
    assert tuning.retry_skipped_irqs(h, str(tmp_path / "s"), JOB, prolog_record=rec, log=Q) == []
    assert len(h.writes) == n_writes and rec.read_text() == text
    job = json.loads((tmp_path / "s" / "tuning" / "jobs" / f"{JOB}.json").read_text())
    assert job["irq_retry"]["outcomes"] == first


def test_nothing_after_the_job_left_the_node(tmp_path):
    root, base, h, rec = _prolog(tmp_path)
    assert tuning.epilog_restore(HostFS(root), str(tmp_path / "s"), JOB, log=Q)["ok"]
    h.fail_path = None
    n_writes, text = len(h.writes), rec.read_text()
    assert tuning.retry_skipped_irqs(h, str(tmp_path / "s"), JOB, prolog_record=rec, log=Q) == []
    assert len(h.writes) == n_writes and rec.read_text() == text
    assert diff(base, snapshot(root)) == []
    # a node without any tuning state, and a job without skipped IRQs
    assert tuning.retry_skipped_irqs(HostFS(root), str(tmp_path / "none"), JOB, log=Q) == []


def test_nothing_when_every_irq_took_its_cpus(tmp_path):
    root = add_host_tuning(make_tree(tmp_path / "h", swap=False))
    h = CountingHostFS(root)
    tuning.prolog_tune(h, str(tmp_path / "s"), JOB, "irq=local", None, None, True, log=Q, scope=SCOPE)
    n = len(h.writes)
    assert tuning.retry_skipped_irqs(h, str(tmp_path / "s"), JOB, log=Q) == []
    assert len(h.writes) == n


def test_irq_gone_since_the_prolog(tmp_path):
    """The device's driver was reloaded: IRQ 45 no longer exists; nothing is written."""
    root, base, h, rec = _prolog(tmp_path)
    (root / f"proc/irq/{BAD}/smp_affinity_list").unlink()
    out = tuning.retry_skipped_irqs(h, str(tmp_path / "s"), JOB, prolog_record=rec, log=Q)
    assert [(o["result"], o["reason"]) for o in out] == [("gone", "no such IRQ any more")]
    assert f"IRQ {BAD} gone" in settings_json(json.loads(rec.read_text()))[0]["reason"]
