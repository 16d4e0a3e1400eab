"""The node daemon's Prometheus collector (gsrun/node/metrics_http.py) on
readings made in the test: a GPU a job holds and an idle GPU no job holds,
unknown values left out (never 0), the caps, a failing readings(), the
shared series table (gsrun/node/metrics.py) and the config keys."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gsrun.base.errors import ConfigError
from gsrun.node.metrics import GPU_SERIES, JOB_SERIES, GpuReading, job_readings
from gsrun.node.metrics_http import MAX_GPUS, MAX_JOBS_PER_GPU, GpuCollector, admit
from gsrun.request.config import SETTINGS, parse_config

from helpers.paths import REPO

pytestmark = pytest.mark.pure

GIB = 1 << 30
UUID0 = "GPU-00000000-1111-2222-3333-444444444440"
UUID1 = "GPU-00000000-1111-2222-3333-444444444441"
MIG0 = "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"


def busy() -> GpuReading:
    """GPU 0, job 4242 of alice: 87.5 % busy, SM 40 %, no tensor figure
    (unknown), 3 GiB of 141 GiB, 350.25 W, 61 C, 1234.5 J, detector: busy."""
    return GpuReading(0, UUID0, "NVIDIA H200", None, "4242", "alice", util_pct=87.5, sm_active_pct=40.0,
                      mem_used_bytes=3 * GIB, mem_total_bytes=141 * GIB, power_w=350.25, temperature_c=61.0,
                      energy_j=1234.5, idle=False)


def free() -> GpuReading:
    """GPU 1, no job: 0 % busy, 0 bytes used, 71.5 W, 33 C, the device's
    counter 9.0e6 J; no GPM, no detector (idle None)."""
    return GpuReading(1, UUID1, "NVIDIA H200", util_pct=0.0, mem_used_bytes=0, mem_total_bytes=141 * GIB,
                      power_w=71.5, temperature_c=33.0, energy_j=9.0e6)


def scrape(collector) -> dict:
    """The collector's exposition, parsed back by prometheus_client's own
    parser: {(sample name, sorted label items): value}."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    text = generate_latest(reg).decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def job_labels(gpu: str, uuid: str, job: str, user: str) -> tuple:
    return tuple(sorted({"gpu": gpu, "job_id": job, "node": "gpu-node01", "user": user, "uuid": uuid}.items()))


def dev_labels(gpu: str, uuid: str, node: str = "gpu-node01", **more) -> tuple:
    return tuple(sorted({"gpu": gpu, "node": node, "uuid": uuid, **more}.items()))


def test_two_gpus_one_held_one_idle_exact_values():
    got = scrape(GpuCollector(lambda: [busy(), free()], "gpu-node01"))
    j0, j1 = job_labels("0", UUID0, "4242", "alice"), job_labels("1", UUID1, "", "")
    d0, d1 = dev_labels("0", UUID0), dev_labels("1", UUID1)
    gpu = {k: v for k, v in got.items() if k[0].startswith("gsrun_gpu_")}
    assert gpu == {
        ("gsrun_gpu_utilization_ratio", j0): 0.875, ("gsrun_gpu_utilization_ratio", j1): 0.0,
        ("gsrun_gpu_sm_active_ratio", j0): 0.4,
        ("gsrun_gpu_memory_used_bytes", j0): 3 * GIB, ("gsrun_gpu_memory_used_bytes", j1): 0.0,
        ("gsrun_gpu_power_watts", j0): 350.25, ("gsrun_gpu_power_watts", j1): 71.5,
        ("gsrun_gpu_energy_joules_total", j0): 1234.5, ("gsrun_gpu_energy_joules_total", j1): 9.0e6,
        ("gsrun_gpu_idle", j0): 0.0,
        ("gsrun_gpu_memory_total_bytes", d0): 141 * GIB, ("gsrun_gpu_memory_total_bytes", d1): 141 * GIB,
        ("gsrun_gpu_temperature_celsius", d0): 61.0, ("gsrun_gpu_temperature_celsius", d1): 33.0,
        ("gsrun_gpu_info", dev_labels("0", UUID0, name="NVIDIA H200")): 1.0,
        ("gsrun_gpu_info", dev_labels("1", UUID1, name="NVIDIA H200")): 1.0,
    }
    # unknown values are absent, never 0: no tensor figure anywhere, no SM figure and no idle flag for GPU 1
    assert not any(k[0] == "gsrun_gpu_tensor_active_ratio" for k in got)
    assert ("gsrun_gpu_sm_active_ratio", j1) not in got and ("gsrun_gpu_idle", j1) not in got
    assert got[("gsrun_exporter_scrape_success", ())] == 1.0
    assert got[("gsrun_exporter_errors_total", ())] == 0.0
    assert got[("gsrun_exporter_readings_dropped", (("cause", "bad"),))] == 0.0
    assert got[("gsrun_exporter_info", (("version", __import__("gsrun").__version__),))] == 1.0


def test_help_and_types_at_the_endpoint():
    reg = CollectorRegistry(auto_describe=False)
    reg.register(GpuCollector(lambda: [busy()], "n"))
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}
    assert fams["gsrun_gpu_energy_joules"].type == "counter"
    assert fams["gsrun_gpu_utilization_ratio"].documentation.endswith("over the last sampler interval "
                                                                       "(sampler.interval_s)")
    assert "since the driver loaded" in fams["gsrun_gpu_energy_joules"].documentation


def test_user_label_off_and_mig_instance():
    mig = GpuReading(3, MIG0, "NVIDIA H200 MIG 1g.18gb", MIG0, "77", "bob", mem_used_bytes=5 * GIB)
    got = scrape(GpuCollector(lambda: [mig], "n1", user_label=False))
    labels = tuple(sorted({"gpu": "3", "job_id": "77", "node": "n1", "uuid": MIG0, "mig_instance": MIG0}.items()))
    assert got[("gsrun_gpu_memory_used_bytes", labels)] == 5 * GIB
    assert not any("user" in dict(k[1]) for k in got)


def test_two_jobs_on_one_gpu_one_device_series():
    """A GPU two jobs share (MPS, shard): a job series per job, one
    temperature and memory-total series for the device."""
    a = busy()
    b = GpuReading(0, UUID0, "NVIDIA H200", None, "4243", "carol", util_pct=10.0, temperature_c=99.0)
    got = scrape(GpuCollector(lambda: [a, b], "gpu-node01"))
    assert got[("gsrun_gpu_utilization_ratio", job_labels("0", UUID0, "4243", "carol"))] == 0.1
    temps = [v for k, v in got.items() if k[0] == "gsrun_gpu_temperature_celsius"]
    assert temps == [61.0]                            # the first reading of the GPU
    assert sum(k[0] == "gsrun_gpu_info" for k in got) == 1


def test_failing_readings_give_no_gpu_series_and_count(capsys):
    def broken():
        raise RuntimeError("monitor lock timed out")

    c = GpuCollector(broken, "n")
    got = scrape(c)
    got = scrape(c)
    assert not any(k[0].startswith("gsrun_gpu_") for k in got)
    assert got[("gsrun_exporter_scrape_success", ())] == 0.0
    assert got[("gsrun_exporter_errors_total", ())] == 2.0
    err = capsys.readouterr().err
    assert err.count("gsrun: daemon: metrics endpoint: readings failed: RuntimeError") == 1   # once per cause
    assert scrape(GpuCollector(lambda: None, "n"))[("gsrun_exporter_scrape_success", ())] == 0.0


def test_nan_and_inf_are_unknown():
    r = GpuReading(0, UUID0, util_pct=float("nan"), power_w=float("inf"), temperature_c=40.0)
    got = scrape(GpuCollector(lambda: [r], "n"))
    assert not any(k[0] in ("gsrun_gpu_utilization_ratio", "gsrun_gpu_power_watts") for k in got)
    assert got[("gsrun_gpu_temperature_celsius", dev_labels("0", UUID0, "n"))] == 40.0


def test_admit_caps_gpus_and_jobs_per_gpu_and_drops_bad_readings():
    many = [GpuReading(i, f"GPU-{i}", util_pct=1.0) for i in range(MAX_GPUS + 5)]
    kept, over, bad = admit(many)
    assert len(kept) == MAX_GPUS and over == 5 and bad == 0
    shared = [GpuReading(0, "GPU-0", job_id=str(j)) for j in range(1, MAX_JOBS_PER_GPU + 4)]
    kept, over, bad = admit(shared)
    assert len(kept) == MAX_JOBS_PER_GPU and over == 3
    bads = [GpuReading(0, "GPU-0", job_id="12;rm"), GpuReading(0, "GPU-0", job_id="12_3"),
            GpuReading(-1, "GPU-0"), GpuReading(True, "GPU-0"), GpuReading(0, "x" * 300),
            GpuReading(0, "GPU-0", user="a\0b"), {"gres_index": 0}]
    assert admit(bads) == ([], 0, len(bads))
    got = scrape(GpuCollector(lambda: many + bads, "n"))
    assert got[("gsrun_exporter_readings_dropped", (("cause", "over_cap"),))] == 5.0
    assert got[("gsrun_exporter_readings_dropped", (("cause", "bad"),))] == float(len(bads))
    assert sum(k[0] == "gsrun_gpu_utilization_ratio" for k in got) == MAX_GPUS


def test_label_values_are_escaped():
    r = GpuReading(0, UUID0, 'H200 "x"\\\n', job_id="5", user='bob"}\n#', util_pct=50.0)
    got = scrape(GpuCollector(lambda: [r], 'n"1'))
    assert got[("gsrun_gpu_utilization_ratio", tuple(sorted({"gpu": "0", "job_id": "5", "node": 'n"1',
                                                             "user": 'bob"}\n#', "uuid": UUID0}.items())))] == 0.5


def test_job_readings_from_a_sampler_state_feed_both_outputs():
    """The monitor's path: a sampler state -> readings (window means since
    the last call) -> the endpoint; memory total from the GPU's ref."""
    from gsrun.facts.sampler_state import GpuRef
    from gsrun.node.sampler import new_state, update_gpu

    ref = GpuRef(2, 2, UUID0, "00000000:10:00.0", "NVIDIA H200", 141 * GIB, gpm=False)
    st = new_state("4242", "gpu-node01", [ref], None, [], 0.0, 5.0, 100)
    for k, (u, p) in enumerate([(0, 100.0), (60, 300.0), (80, 300.0)]):
        poll = {"memory": {"total": 141 * GIB, "used": 2 * GIB, "reserved": 0}, "power_mw": int(p * 1000),
                "util_samples": [[1_000_000 * (k + 1), u]], "temperature_c": 50 + k}
        update_gpu(st["gpus"][0], poll, 5.0 * k, 5.0 if k else 0.0)
    readings, marks = job_readings(st, "alice")
    (r,) = readings
    assert (r.gres_index, r.job_id, r.user, r.mem_total_bytes, r.util_pct, r.power_w) == \
        (2, "4242", "alice", 141 * GIB, 70.0, 300.0)
    assert r.energy_j is None and r.idle is None and r.sm_active_pct is None
    got = scrape(GpuCollector(lambda: readings, "gpu-node01"))
    assert got[("gsrun_gpu_utilization_ratio", job_labels("2", UUID0, "4242", "alice"))] == 0.7
    assert got[("gsrun_gpu_memory_total_bytes", dev_labels("2", UUID0))] == 141 * GIB
    again, _ = job_readings(st, "alice", marks)
    assert again[0].util_pct is None                     # no poll since: unknown, not 0


def series_table() -> str:
    """The docs' table of every series (docs/ADMIN.md), Markdown, from the one table."""
    rows = ["| series | type | value |", "| --- | --- | --- |"]
    rows += [f"| `{s.name}` | {s.kind} | {s.doc} |" for s in JOB_SERIES + GPU_SERIES]
    return "\n".join(rows)


def test_one_table_and_the_docs_show_it():
    names = [s.name for s in JOB_SERIES + GPU_SERIES]
    assert len(names) == len(set(names)) == 9
    admin = (REPO / "docs" / "ADMIN.md").read_text()
    assert series_table() in admin, "docs/ADMIN.md's series table differs from the series table of gsrun.node.metrics"


def test_config_keys_defaults_and_checks():
    keys = {s.key: s for s in SETTINGS}
    assert keys["metrics.http_port"].default == 9400 and keys["metrics.http_address"].default == ""
    cfg = parse_config("[metrics]\nhttp_port = 0\nhttp_address = \"127.0.0.1\"\n")
    assert cfg["metrics.http_port"] == 0 and cfg["metrics.http_address"] == "127.0.0.1"
    for addr in ("", "::", "::1", "10.1.2.3", "fe80::1%eth0", "mgmt-gpu01.example.org"):
        assert keys["metrics.http_address"].check(addr) is None, addr
    for addr in ("10.1.2.3:9400", "a b", "x" * 254, "host/0", "[::1]"):
        assert keys["metrics.http_address"].check(addr), addr
    for bad in ("http_port = 65536", "http_port = -1", "http_port = \"9400\"", "http_address = \"a;b\""):
        with pytest.raises(ConfigError) as e:
            parse_config(f"[metrics]\n{bad}\n")
        assert "metrics.http_" in str(e.value)
