"""The per-job Prometheus textfile (gsrun/node/metrics_textfile.py): the exact
exposition for a known sampler state, label escaping, MIG labels, unknown
values left out (never 0), window means between writes, the idle flag from
the detector's state, the file's name/mode/atomicity and its safe removal."""

from __future__ import annotations

import os
import stat

import pytest

from gsrun.base.errors import InputError
from gsrun.facts.nvml import NA, FakeNvml, Seq
from gsrun.facts.sampler_state import GpuRef
from gsrun.node.metrics import JOB_SERIES, idle_flag, window_mean
from gsrun.node.metrics_textfile import (TextfileExporter, build_samples, file_name, is_our_file, remove_job_file,
                                         render)
from gsrun.node.sampler import new_state, update_gpu

from helpers.sampler_sim import SimClock, h200_data, make_sampler, run_job

pytestmark = pytest.mark.pure

GIB = 1 << 30
UUID0 = "GPU-00000000-1111-2222-3333-444444444440"
MIG0 = "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"


def reading(t: int, util: float | None, power_w: float | None = 300.0, mem: int | None = 2 * GIB,
            energy_mj: int | None = None, gpm: dict | None = None) -> dict:
    """One poll's raw readings in read_gpu's form (util from the sample buffer)."""
    r = {"memory": NA("Not Supported", 3) if mem is None else {"total": 141 * GIB, "used": mem, "reserved": 0},
         "power_mw": NA("Not Supported", 3) if power_w is None else int(power_w * 1000),
         "util_samples": NA("Not Supported", 3) if util is None else [[1_000_000 * (t + 1), util]]}
    if energy_mj is not None:
        r["energy_mj"] = energy_mj
    if gpm is not None:
        r["gpm"] = gpm
    return r


def one_gpu_state(ref: GpuRef, polls: list[dict], interval_s: float = 5.0) -> dict:
    st = new_state("4242", "gpu-node01", [ref], None, [], 1000.0, interval_s, 100)
    for k, r in enumerate(polls):
        update_gpu(st["gpus"][0], r, k * interval_s, interval_s if k else 0.0)
    return st


def ref0(**kw) -> GpuRef:
    return GpuRef(0, 0, kw.pop("uuid", UUID0), "00000000:10:00.0", "NVIDIA H200", 141 * GIB,
                  gpm=kw.pop("gpm", True), **kw)


def test_exact_exposition_for_a_known_state():
    """Three polls 5 s apart: the first only sets the utilization baseline,
    then 60 % and 80 % (mean 0.7); power 250 W then 350 W twice (time-weighted
    over the two 5-s intervals after the first poll: 350 W; the first poll
    carries no time); GPM SM 40 % / tensor 10 %; energy counter 1,000,000 ->
    4,500,000 mJ (3500 J); the detector says idle since t = 12 s."""
    polls = [reading(0, 0, 250.0, 2 * GIB, 1_000_000, {"sm_active_pct": 40.0, "tensor_active_pct": 10.0}),
             reading(1, 60, 350.0, 2 * GIB, 2_750_000, {"sm_active_pct": 40.0, "tensor_active_pct": 10.0}),
             reading(2, 80, 350.0, 4 * GIB, 4_500_000, {"sm_active_pct": 40.0, "tensor_active_pct": 10.0})]
    st = one_gpu_state(ref0(), polls)
    st["watch"] = [_Watch(12.0)]
    samples, _ = build_samples(st, "alice")
    labels = f'gpu="0",job_id="4242",node="gpu-node01",user="alice",uuid="{UUID0}"'
    assert render(samples).decode() == f"""\
# HELP gsrun_gpu_utilization_ratio GPU busy share 0-1 (NVML utilization), mean over the last sampler flush window
# TYPE gsrun_gpu_utilization_ratio gauge
gsrun_gpu_utilization_ratio{{{labels}}} 0.7
# HELP gsrun_gpu_sm_active_ratio GPM SM activity 0-1, mean over the last sampler flush window
# TYPE gsrun_gpu_sm_active_ratio gauge
gsrun_gpu_sm_active_ratio{{{labels}}} 0.4
# HELP gsrun_gpu_tensor_active_ratio GPM tensor-core activity 0-1, mean over the last sampler flush window
# TYPE gsrun_gpu_tensor_active_ratio gauge
gsrun_gpu_tensor_active_ratio{{{labels}}} 0.1
# HELP gsrun_gpu_memory_used_bytes GPU memory used in bytes (NVML), mean over the last sampler flush window
# TYPE gsrun_gpu_memory_used_bytes gauge
gsrun_gpu_memory_used_bytes{{{labels}}} {float(3 * GIB):.9e}
# HELP gsrun_gpu_power_watts GPU power draw in watts (NVML), mean over the last sampler flush window
# TYPE gsrun_gpu_power_watts gauge
gsrun_gpu_power_watts{{{labels}}} 350.0
# HELP gsrun_gpu_energy_joules_total GPU energy in joules since the job started on this node (NVML energy counter)
# TYPE gsrun_gpu_energy_joules_total counter
gsrun_gpu_energy_joules_total{{{labels}}} 3500.0
# HELP gsrun_gpu_idle 1 while gsrun's idle detector holds the GPU idle, else 0
# TYPE gsrun_gpu_idle gauge
gsrun_gpu_idle{{{labels}}} 1.0
"""
    assert len(samples) == len(JOB_SERIES) == 7


def test_label_values_are_escaped():
    """A user or node name cannot break the format: backslash, quote and
    newline are escaped as the text format requires (prometheus_client)."""
    st = one_gpu_state(ref0(), [reading(0, 0), reading(1, 50)])
    st["node"] = 'n"1\\x\ny'
    text = render(build_samples(st, 'bob"}\n#')[0]).decode()
    assert 'node="n\\"1\\\\x\\ny"' in text and 'user="bob\\"}\\n#"' in text
    # every sample is one line: 7 HELP/TYPE pairs are absent for missing families, the rest one line each
    lines = [x for x in text.splitlines() if not x.startswith("#")]
    assert len(lines) == 3 and all(x.startswith("gsrun_gpu_") for x in lines)   # util, memory, power


def test_mig_device_gets_a_mig_instance_label_a_full_gpu_none():
    """A MIG device (its NVML UUID is MIG-...) is labelled with its instance;
    its utilization is N/A on MIG (field case 12) and is left out, not 0."""
    mig = one_gpu_state(ref0(uuid=MIG0, mig=True, gpm=False), [reading(0, None), reading(1, None)])
    text = render(build_samples(mig, "alice")[0]).decode()
    assert f'mig_instance="{MIG0}"' in text and f'uuid="{MIG0}"' in text
    assert "gsrun_gpu_utilization_ratio" not in text
    assert f'gsrun_gpu_memory_used_bytes{{gpu="0",job_id="4242",mig_instance="{MIG0}",node="gpu-node01",' \
           f'user="alice",uuid="{MIG0}"}} {float(2 * GIB):.9e}' in text.splitlines()
    full = one_gpu_state(ref0(), [reading(0, 0), reading(1, 50)])
    assert "mig_instance" not in render(build_samples(full, "alice")[0]).decode()
    # a GPU in MIG mode sampled as the whole GPU (GPU- UUID): no instance is claimed
    parent = one_gpu_state(ref0(mig=True), [reading(0, None), reading(1, None)])
    assert "mig_instance" not in render(build_samples(parent, "alice")[0]).decode()


def test_unknown_values_are_left_out_never_zero():
    """Power and memory NOT_SUPPORTED, no GPM, no energy counter, no detector
    state: only utilization is written."""
    st = one_gpu_state(ref0(gpm=False), [reading(0, 0, None, None), reading(1, 30, None, None)])
    samples, _ = build_samples(st, "alice")
    assert [(s.family, s.value) for s in samples] == [("gsrun_gpu_utilization_ratio", 0.3)]
    assert render([]) == b""          # no series: an empty file, not HELP lines or zeros


def test_window_means_between_writes_and_new_values_only():
    """The second write's gauges cover only the polls since the first; a
    window with no new value (the GPU went N/A) leaves the series out."""
    ref = ref0(gpm=False)
    st = new_state("4242", "n1", [ref], None, [], 0.0, 5.0, 100)
    g = st["gpus"][0]
    for k, (u, p) in enumerate([(0, 100), (20, 100), (40, 100)]):
        update_gpu(g, reading(k, u, p), 5.0 * k, 5.0 if k else 0.0)
    s1, marks = build_samples(st, "u")
    assert {s.family: s.value for s in s1}["gsrun_gpu_utilization_ratio"] == pytest.approx(0.3)
    for k, (u, p) in enumerate([(90, 500), (70, 300)], start=3):
        update_gpu(g, reading(k, u, p), 5.0 * k, 5.0)
    s2, marks = build_samples(st, "u", marks)
    v2 = {s.family: s.value for s in s2}
    assert v2["gsrun_gpu_utilization_ratio"] == pytest.approx(0.8) and v2["gsrun_gpu_power_watts"] == 400.0
    update_gpu(g, reading(5, None, None, None), 25.0, 5.0)
    s3, _ = build_samples(st, "u", marks)
    assert s3 == []


def test_window_mean_edges():
    assert window_mean((1, 0.0, 0.0, 42.0), None) == 42.0            # one value, no time yet
    assert window_mean((3, 10.0, 500.0, 150.0), (3, 10.0, 500.0, 150.0)) is None
    assert window_mean((2, 5.0, 100.0, 40.0), (9, 40.0, 900.0, 300.0)) == 20.0   # state went back: from 0


class _Watch:
    def __init__(self, since):
        self.idle_since_s = since


def test_idle_flag_from_the_detector_state():
    st = {"watch": [_Watch(120.0), _Watch(None), {"other": 1}]}
    assert [idle_flag(st, i) for i in range(4)] == [1.0, 0.0, None, None]
    assert idle_flag({}, 0) is None


def test_lost_gpu_keeps_its_energy_but_no_gauges_or_idle_flag():
    st = one_gpu_state(ref0(gpm=False), [reading(0, 0, 300.0, GIB, 10_000), reading(1, 50, 300.0, GIB, 1_510_000)])
    s1, marks = build_samples(st, "u")
    st["gpus"][0]["lost_at_s"] = 7.0
    st["watch"] = [_Watch(None)]
    s2, _ = build_samples(st, "u", marks)
    assert [(s.family, s.value) for s in s2] == [("gsrun_gpu_energy_joules_total", 1500.0)]


def test_file_names_and_our_pattern_only():
    assert file_name("4242") == "gsrun_job_4242.prom"
    with pytest.raises(InputError):
        file_name("../4242")
    assert is_our_file("gsrun_job_4242.prom", "4242") and not is_our_file("gsrun_job_4242.prom", "424")
    assert is_our_file(".gsrun_job_4242.prom.123.0a1b2c3d", "4242")
    for name in ("gsrun_job_4242.prom.bak", "xgsrun_job_4242.prom", "gsrun_job_4242_1.prom", "gsrun_job_.prom",
                 "node.prom", ".gsrun_job_4242.prom.x.0a1b2c3d", "gsrun_job_4242.prom/"):
        assert not is_our_file(name), name


def test_remove_is_idempotent_and_touches_only_our_files(tmp_path):
    d = tmp_path / "textfile"
    d.mkdir()
    keep = ["gsrun_job_4243.prom", "node_custom.prom", "gsrun_job_4242.prom.bak", ".gsrun_job_4243.prom.1.0a1b2c3d"]
    for n in keep + ["gsrun_job_4242.prom", ".gsrun_job_4242.prom.77.deadbeef"]:
        (d / n).write_text("x\n")
    assert remove_job_file(str(d), "4242") == [".gsrun_job_4242.prom.77.deadbeef", "gsrun_job_4242.prom"]
    assert sorted(os.listdir(d)) == sorted(keep)
    assert remove_job_file(str(d), "4242") == []                     # again: nothing, no error
    assert remove_job_file(str(tmp_path / "absent"), "4242") == []   # no directory: no error
    link = tmp_path / "link"
    link.symlink_to(d)
    (d / "gsrun_job_4242.prom").write_text("x\n")
    with pytest.raises(OSError):                                     # a symlinked directory is not followed
        remove_job_file(str(link), "4242")
    assert (d / "gsrun_job_4242.prom").exists()
    with pytest.raises(InputError):
        remove_job_file(str(d), "4242/../x")


def test_sampler_writes_the_file_at_each_flush_0644_atomic(tmp_path, capsys):
    """The real Sampler with the exporter: the file appears at the first
    flush, mode 0640, no temp file left; a missing directory is one warning
    and the sampler's own state is still written."""
    d = tmp_path / "textfile"
    d.mkdir()
    fake = FakeNvml(h200_data(1))
    fake.set(0, "util_samples", Seq([{"ok": [[1_000_000 * (k + 1), 25 * (k % 5)]]} for k in range(6)]))
    s = make_sampler(tmp_path, fake, [0], SimClock(), flush_s=10.0)
    s.export = TextfileExporter(str(d), "4242", "alice")
    run_job(s, 5)
    assert os.listdir(d) == ["gsrun_job_4242.prom"]
    st = os.stat(d / "gsrun_job_4242.prom")
    assert stat.S_IMODE(st.st_mode) == 0o640
    text = (d / "gsrun_job_4242.prom").read_text()
    assert f'gsrun_gpu_utilization_ratio{{gpu="0",job_id="4242",node="n1",user="alice",uuid="{UUID0}"}}' in text
    bad = TextfileExporter(str(tmp_path / "absent"), "4242", "alice")
    assert bad({"job_id": "4242", "node": "n1", "gpus": []}) is False
    assert bad({"job_id": "4242", "node": "n1", "gpus": []}) is False
    err = capsys.readouterr().err
    assert err.count("gsrun: sampler: metrics: cannot write") == 1 and "hint: check [metrics] textfile_dir" in err


def test_idle_flag_follows_the_samplers_detector(tmp_path):
    """The real detector (gsrun/request/waste.py) in the real Sampler: a GPU
    whose driver buffer says 0 % is idle (flag 1), one at 90 % is busy (0)."""
    d = tmp_path / "textfile"
    d.mkdir()
    fake = FakeNvml(h200_data(2))
    for gpu, util in ((0, 0), (1, 90)):
        fake.set(gpu, "util_samples", Seq([{"ok": [[1_000_000 * (k + 1), util]]} for k in range(8)]))
    s = make_sampler(tmp_path, fake, [0, 1], SimClock(), flush_s=10.0)
    s.export = TextfileExporter(str(d), "4242", "alice")
    run_job(s, 6)
    lines = [x for x in (d / "gsrun_job_4242.prom").read_text().splitlines() if x.startswith("gsrun_gpu_idle{")]
    assert [(x.split('gpu="')[1][0], x.rsplit(" ", 1)[1]) for x in lines] == [("0", "1.0"), ("1", "0.0")]


def test_grafana_dashboard_uses_only_series_we_write():
    """docs/grafana-gsrun-jobs.json: valid JSON, every gsrun_ name in its
    queries is one the exporter writes, and each written family has a panel."""
    import json
    import re

    from gsrun.node.metrics import JOB_SERIES
    from helpers.paths import REPO

    dash = json.loads((REPO / "docs" / "grafana-gsrun-jobs.json").read_text())
    text = json.dumps(dash)
    used = set(re.findall(r"gsrun_[a-z_]+", text)) - {"gsrun_job_"}
    ours = {s.name for s in JOB_SERIES}
    assert used == ours
    assert {v["name"] for v in dash["templating"]["list"]} >= {"job_id", "datasource"}


def test_privacy_settings_hide_figures_from_other_local_users(tmp_path):
    """A local user who is not in node_exporter's group reads no job's user,
    id or figures: the file is 0640 with the directory's (or the set) group;
    ``metrics.user_label = false`` leaves the user name out of every series."""
    from gsrun.node.metrics_textfile import exporter_from_config

    d = tmp_path / "textfile"
    d.mkdir()
    cfg = {"metrics.textfile_dir": str(d), "metrics.textfile_mode": "0640", "metrics.textfile_group": "",
           "metrics.user_label": False}
    exp = exporter_from_config(cfg, "4242", os.getuid())
    assert exp.user is None and exp.mode == 0o640
    fake = FakeNvml(h200_data(1))
    s = make_sampler(tmp_path, fake, [0], SimClock(), flush_s=10.0)
    s.export = exp
    run_job(s, 3)
    st = os.stat(d / "gsrun_job_4242.prom")
    assert stat.S_IMODE(st.st_mode) & 0o007 == 0, "world-readable .prom file"
    text = (d / "gsrun_job_4242.prom").read_text()
    assert "user=" not in text and 'job_id="4242"' in text
    cfg["metrics.user_label"] = True
    assert exporter_from_config(cfg, "4242", 0).user == "root"


def test_textfile_mode_setting_refuses_world_writable():
    from gsrun.request.config import SETTINGS

    check = {s.key: s for s in SETTINGS}["metrics.textfile_mode"].check
    assert check("0640") is None and check("0644") is None and check("0600") is None
    assert check("0666") and check("0755") and check("640x") and check(640)
