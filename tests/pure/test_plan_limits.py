"""The step plan's limits are the same on both sides: the daemon that writes a plan
(Python) and the SPANK plugin that reads it in slurmstepd (C)."""

import re
from pathlib import Path

from gsrun.bind.plan import MAX_LOCAL_RANKS
from gsrun.daemon import server

C_SOURCE = Path(__file__).resolve().parents[2] / "spank_py" / "gsrun_spank.c"


def _c_define(name: str) -> int:
    m = re.search(rf"^#define {name} \(?(?:\(size_t\))?(\d+)(?: << (\d+))?\)?", C_SOURCE.read_text(), re.M)
    assert m, f"#define {name} not found in {C_SOURCE}"
    return int(m[1]) << int(m[2] or 0)


def test_the_plugin_reads_every_plan_the_daemon_may_send():
    assert _c_define("GS_MAX_PLAN_BYTES") == server.MAX_PLAN_BYTES
    assert _c_define("GS_MAX_LOCAL_TASKS") == MAX_LOCAL_RANKS
