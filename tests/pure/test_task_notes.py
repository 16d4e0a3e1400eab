"""The task notes gsrun-bind leaves for the epilog (memlock, the allocator it
preloaded and whether the task's maps show it) and how they reach the
report's node settings: read as untrusted input (owner, size, links,
allow-listed values), once per node."""

from __future__ import annotations

import json
import os

import pytest

from gsrun.facts.task_notes import MAX_BYTES, clean_notes, read_task_notes, task_dir
from gsrun.report.node_end import node_settings
from gsrun.report.records import NodeSetting
from gsrun.report.render import fmt_setting

pytestmark = pytest.mark.pure
PROLOG = {"request": {"malloc": "jemalloc"}, "steps": {}}
LIB = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"


def settings_json(*args) -> list[dict]:
    """node_settings' records in their JSON form, as a node summary holds them."""
    return [s.to_json() for s in node_settings(*args)]


def fmt(st: dict) -> str:
    """The report's line of a setting in its JSON form."""
    return fmt_setting(NodeSetting.from_json(st))


def notes_file(tmp_path, obj) -> tuple[str, str]:
    d = task_dir(str(tmp_path), "4242", "gpu01")
    os.makedirs(d)
    p = os.path.join(d, "bind.json")
    with open(p, "w") as f:
        f.write(obj if isinstance(obj, str) else json.dumps(obj))
    return str(tmp_path), p


def test_verified_preload_is_what_the_report_says():
    notes = {"malloc": {"name": "jemalloc", "state": "verified", "path": LIB,
                        "detail": "mapped in local rank 0's /proc/4711/maps"}}
    st = [s for s in settings_json(PROLOG, notes) if s["key"] == "malloc"]
    assert st == [{"key": "malloc", "value": "jemalloc", "state": "applied", "source": "request",
                   "reason": f"LD_PRELOAD={LIB} by gsrun-bind; verified: mapped in local rank 0's /proc/4711/maps"}]
    assert fmt(st[0]) == (f"malloc=jemalloc (LD_PRELOAD={LIB} by gsrun-bind; verified: mapped in local "
                          "rank 0's /proc/4711/maps)")


def test_not_found_and_not_verified_say_why():
    nf = {"malloc": {"name": "jemalloc", "state": "not found", "path": None,
                     "detail": "libjemalloc.so.2 not found (looked in /usr/lib64, ldconfig -p)"}}
    st = settings_json(PROLOG, nf)[0]
    assert st["state"] == "unsupported"
    assert fmt(st) == "malloc=jemalloc (not found: libjemalloc.so.2 not found (looked in /usr/lib64, " \
                      "ldconfig -p))"
    nv = {"malloc": {"name": "jemalloc", "state": "not verified", "path": LIB,
                     "detail": "not in local rank 0's /proc/9/maps 2 s after exec (a static or setuid program "
                               "ignores LD_PRELOAD)"}}
    st = settings_json(PROLOG, nv)[0]
    assert st["state"] == "requested" and "not verified: not in local rank 0's" in fmt(st)
    # no notes (no task ran gsrun-bind here): what was asked
    assert fmt(settings_json(PROLOG)[0]) == "malloc=jemalloc (preloaded by gsrun-bind)"


def test_memlock_warning_once_per_node_in_the_settings():
    problem = ("memlock: hard RLIMIT_MEMLOCK 65536 bytes (64 KiB), below unlimited: ...; RDMA devices: mlx5_0; "
               "hint: ...")
    st = settings_json({"steps": {}}, {"memlock": {"soft": 65536, "hard": 65536, "rdma": ["mlx5_0"],
                                                    "problem": problem}})
    assert st == [{"key": "memlock", "value": "65536", "state": "warning", "reason": problem, "source": "node"}]
    assert fmt(st[0]) == f"memlock warning ({problem})"
    assert settings_json({"steps": {}}, {"memlock": {"soft": None, "hard": None, "rdma": [], "problem": None}}) == []


def test_reader_takes_the_users_regular_file_only(tmp_path):
    good = {"malloc": {"name": "jemalloc", "state": "verified", "path": LIB, "detail": "x"},
            "memlock": {"soft": 1, "hard": 2, "rdma": ["mlx5_0"], "problem": None}}
    spool, p = notes_file(tmp_path, good)
    uid = os.getuid()
    assert read_task_notes(spool, "4242", "gpu01", uid) == good
    assert read_task_notes(spool, "4242", "gpu01", uid + 1) is None          # another owner
    assert read_task_notes(spool, "../x", "gpu01", uid) is None              # not a job id
    os.replace(p, p + ".real")
    os.symlink(p + ".real", p)
    assert read_task_notes(spool, "4242", "gpu01", uid) is None              # a link is never followed
    os.unlink(p)
    with open(p, "w") as f:
        f.write(" " * (MAX_BYTES + 1))
    assert read_task_notes(spool, "4242", "gpu01", uid) is None              # too big


def test_hostile_values_are_dropped_or_cut():
    got = clean_notes({"malloc": {"name": "evil", "state": "verified"}, "x": 1,
                       "memlock": {"soft": -1, "hard": True, "problem": "a\nb" + "c" * 1000,
                                   "rdma": ["mlx5_0\x1b[31m"] * 40}})
    assert "malloc" not in got and "x" not in got
    ml = got["memlock"]
    assert ml["soft"] is None and ml["hard"] is None and len(ml["problem"]) == 400 and ml["problem"][:3] == "a?b"
    assert len(ml["rdma"]) == 16 and ml["rdma"][0] == "mlx5_0?[31m"
