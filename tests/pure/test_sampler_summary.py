"""The node summary the sampler writes at its final flush
(:mod:`gsrun.epilog.sampler`), completed by the epilog
(:func:`gsrun.report.node_end.finish`), is byte for byte the summary the
epilog computes from ``sampler.json``: same state, same
end time, same job context -> same file."""

from __future__ import annotations

import json

import pytest

from gsrun.base.fsutil import read_json
from gsrun.epilog.sampler import write_summary
from gsrun.facts.nvml import FakeNvml, NvmlUnavailable, Seq
from gsrun.report.node_end import SAMPLER_SUMMARY_NAME, finish
from gsrun.report.summary import node_summary

from helpers.sampler_sim import SimClock, cpu_usage, energy_stream, h200_data, make_sampler, util_sample_stream

INTERVAL = 5.0


def encoded(summ: dict) -> str:
    # what the epilog writes (gsrun.base.fsutil.atomic_write_json)
    return json.dumps(summ, separators=(",", ":"), sort_keys=True) + "\n"


def busy_job(tmp_path, n_gpus=2, lose=None):
    n = 121
    fake = FakeNvml(h200_data(n_gpus))
    for i in range(n_gpus):
        fake.set(i, "util_samples", Seq(util_sample_stream(n, INTERVAL, lambda t, i=i: 30 + 20 * i)))
        fake.set(i, "energy_mj", Seq(energy_stream(n, INTERVAL, lambda t: 300.0 + t / 10)))
    clock = SimClock()
    if lose is not None:
        clock.at(300, lambda: fake.data["devices"][lose].__setitem__("lost", True))
    s = make_sampler(tmp_path, fake, list(range(n_gpus)), clock, interval_s=INTERVAL,
                     usage=cpu_usage(clock, 3.5, 2 << 30, 3 << 30))
    return s, n


def no_nvml_job(tmp_path):
    def boom():
        raise NvmlUnavailable("LIB_RM_VERSION_MISMATCH", "Driver/library version mismatch")
    return make_sampler(tmp_path, None, [0], SimClock(), nvml=boom), 3


@pytest.mark.parametrize("case", ["two_gpus", "gpu_lost", "no_nvml", "no_gpus"])
def test_sampler_written_summary_equals_the_epilogs(tmp_path, case):
    if case == "no_nvml":
        s, n = no_nvml_job(tmp_path)
    elif case == "no_gpus":
        s, n = make_sampler(tmp_path, FakeNvml(h200_data(1)), [], SimClock()), 4
    else:
        s, n = busy_job(tmp_path, 4 if case == "gpu_lost" else 2, lose=2 if case == "gpu_lost" else None)
    final = s.run(max_samples=n)
    write_summary(final, str(tmp_path))
    pre = read_json(tmp_path / SAMPLER_SUMMARY_NAME)
    on_disk = read_json(s.state_path)            # what the epilog's fallback reads
    assert on_disk["done"] is True and pre["nvml_error"] == on_disk["nvml_error"]
    env = {"job_id": "4242", "node": "n1", "cpus_on_node": 16, "gpus": [0, 1], "prolog_time": 1.0}
    end = on_disk["start_time"] + 3600.25
    want = encoded(node_summary(on_disk, env, end))
    got = encoded(finish(pre["summary"], env, end))
    assert got == want
    assert json.loads(got)["elapsed_s"] == 3600.25 and json.loads(got)["cpus_alloc"] == 16
    if case == "gpu_lost":
        assert [g["lost_at_s"] is not None for g in json.loads(got)["gpus"]] == [False, False, True, False]
    if case == "no_nvml":
        assert pre["nvml_error"] == "NVML init failed: LIB_RM_VERSION_MISMATCH"


def test_unknown_job_context_stays_unknown(tmp_path):
    """A job context without cpus/GPUs gives what node_summary gives: None and []."""
    s, n = busy_job(tmp_path, 1)
    final = s.run(max_samples=5)
    write_summary(final, str(tmp_path))
    pre = read_json(tmp_path / SAMPLER_SUMMARY_NAME)
    env = {"job_id": "4242", "node": "n1", "cpus_on_node": None, "gpus": None}
    end = final["start_time"] + 30
    got = finish(pre["summary"], env, end)
    assert got["cpus_alloc"] is None and got["gres_gpus"] == []
    assert encoded(got) == encoded(node_summary(read_json(s.state_path), env, end))


def test_a_failing_summary_leaves_no_file_and_says_so(tmp_path, capsys):
    write_summary({"job_id": "4242", "node": "n1", "version": -1}, str(tmp_path))
    assert not (tmp_path / SAMPLER_SUMMARY_NAME).exists()
    assert "node summary not written" in capsys.readouterr().err
