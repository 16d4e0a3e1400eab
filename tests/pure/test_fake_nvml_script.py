"""FakeNvml time scripts: the answer of the last step whose time has passed (the local cluster's
replayed work-then-idle job, tests/cluster/up --fake-nvml)."""

from gsrun.facts.nvml import NA, FakeNvml


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def _fake(clock):
    dev = {"minor": {"ok": 0},
           "utilization": {"script": [[0, {"ok": {"gpu": 97, "memory": 40}}], [20, {"ok": {"gpu": 0, "memory": 0}}]]},
           "power_mw": {"script": [[0, {"ok": 480000}], [20, {"ok": 72000}], [60, {"error": "GPU is lost", "code": 15}]]},
           "util_samples": {"script": [[0, {"ok": 55}]]}}
    return FakeNvml({"devices": [dev]}, clock=clock)


def test_script_answers_by_seconds_since_open():
    c = Clock()
    nv = _fake(c)
    assert nv.get(0, "utilization") == {"gpu": 97, "memory": 40}
    assert nv.get(0, "power_mw") == 480000
    c.t += 19.9
    assert nv.get(0, "utilization")["gpu"] == 97
    c.t += 0.1
    assert nv.get(0, "utilization")["gpu"] == 0
    assert nv.get(0, "power_mw") == 72000
    c.t += 40
    lost = nv.get(0, "power_mw")
    assert isinstance(lost, NA) and lost.code == 15
    # the plain recorded answers are untouched
    assert nv.get(0, "minor") == 0


def test_scripted_util_samples_number_is_one_fresh_sample():
    nv = _fake(Clock())
    s = nv.get(0, "util_samples")
    assert len(s) == 1 and s[0][1] == 55 and s[0][0] > 1_600_000_000 * 10**6
