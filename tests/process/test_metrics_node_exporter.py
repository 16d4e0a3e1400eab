"""The per-job textfile through the real node_exporter (Debian's
``prometheus-node-exporter``): the real prolog has the real node monitor
sample the job on a fake-NVML host with ``[metrics] textfile_dir`` set,
node_exporter's textfile collector serves what the monitor wrote, and after the real epilog the job's
series are gone from the next scrape."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import stat
import subprocess
import time
import urllib.request

import pytest

from helpers.node_site import kill_fakes, make_site, nvml_devices, run_node

NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
pytestmark = [pytest.mark.process,
              pytest.mark.skipif(NODE_EXPORTER is None, reason="node_exporter is not installed (Debian package "
                                 "prometheus-node-exporter; tests/cluster/up installs it)")]

JOB = "4861"
GIB = 1 << 30
MIG_UUID = "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
ENERGY_RISES_S = 4.0


def two_gpus() -> dict:
    """GPU 0: a full H200 at 50 % (nvmlDeviceGetUtilizationRates: no sample
    buffer), 123.456 W, 3 GiB used (v2: the answer has "reserved"), energy
    counter 1.0e6 until ENERGY_RISES_S after the monitor's start (the job begins
    before), then 2.5e6 -> 3.5e6 mJ and steady (2500 J over the job).
    GPU 1: a MIG device (MIG- UUID) with no utilization (field case 12), no
    power reading and no energy counter, 5 GiB used. Neither lists a
    compute process."""
    d = nvml_devices(2)
    g0, g1 = d["devices"]
    g0["memory"] = {"ok": {"total": 141 * GIB, "used": 3 * GIB, "free": 138 * GIB, "reserved": 0}}
    g0["power_mw"] = {"ok": 123456}
    # a time script (seconds since the monitor opened NVML), not a per-call sequence: the monitor
    # also reads the GPUs no job holds, before the prolog's begin
    g0["energy_mj"] = {"script": [[0, {"ok": 1_000_000}], [ENERGY_RISES_S, {"ok": 2_500_000}],
                                  [ENERGY_RISES_S + 0.5, {"ok": 3_500_000}]]}
    g1["uuid"] = {"ok": MIG_UUID}
    g1["name"] = {"ok": "NVIDIA H200 MIG 1g.18gb"}
    g1["mig_mode"] = {"ok": [1, 1]}
    g1["utilization"] = {"error": "Not Supported", "code": 3}
    g1["power_mw"] = {"error": "Not Supported", "code": 3}
    g1["memory"] = {"ok": {"total": 18 * GIB, "used": 5 * GIB, "free": 13 * GIB, "reserved": 0}}
    return d


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict:
    """``/metrics`` -> {(name, sorted label items): value} for the gsrun_ series
    (parsed by prometheus_client's own parser) and node_exporter's textfile
    error flag."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("gsrun_") or s.name == "node_textfile_scrape_error":
                # node_exporter gives every sample of a family the same label names (mig_instance=""
                # on a full GPU); Prometheus stores a label with an empty value as no label
                labels = tuple(sorted((k, v) for k, v in s.labels.items() if v != ""))
                out[(s.name, labels)] = s.value
    return out


def start_exporter(textfile_dir) -> tuple[subprocess.Popen, int]:
    for _ in range(5):
        port = free_port()
        p = subprocess.Popen([NODE_EXPORTER, f"--collector.textfile.directory={textfile_dir}",
                              f"--web.listen-address=127.0.0.1:{port}", "--collector.disable-defaults",
                              "--collector.textfile"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and p.poll() is None:
            try:
                scrape(port)
                return p, port
            except OSError:
                time.sleep(0.1)
        p.kill()
        p.wait()
    pytest.fail(f"node_exporter did not start: {p.stderr.read().decode()[-500:]}")


def test_node_exporter_serves_the_monitors_file_and_drops_it_after_the_epilog():
    site = make_site(nvml=two_gpus())
    tdir = site.base / "textfile"
    tdir.mkdir()
    (tdir / "other.prom").write_text("site_other_metric 1\n")      # a file of someone else: left alone
    site.config.write_text(site.config.read_text().replace("[metrics]\n", f'[metrics]\ntextfile_dir = "{tdir}"\n'))
    env = site.env(job_id=JOB, gpus="0,1")
    exporter = None
    try:
        cp = run_node(["prolog"], env)
        assert cp.returncode == 0, cp.stderr
        prom = tdir / f"gsrun_job_{JOB}.prom"
        deadline = time.monotonic() + 30
        # the energy counter reaches its last value ENERGY_RISES_S + 0.5 s into the monitor; a flush after it
        # has 2500 J
        while time.monotonic() < deadline and not (prom.exists() and " 2500.0\n" in prom.read_text()):
            time.sleep(0.1)
        assert prom.exists(), (site.base / "daemon.log").read_text()      # the node daemon's and its monitor's
        # not world-readable: root's, the textfile directory's group (node_exporter's), 0640
        assert stat.S_IMODE(os.stat(prom).st_mode) == 0o640 and os.stat(prom).st_uid == os.geteuid()
        assert os.stat(prom).st_gid == os.stat(tdir).st_gid
        exporter, port = start_exporter(tdir)
        got = scrape(port)
        user = pwd.getpwuid(65534).pw_name
        base = {"job_id": JOB, "user": user, "node": "gpu-node01"}
        g0 = tuple(sorted(dict(base, gpu="0", uuid="GPU-00000000-0000-0000-0000-000000000000").items()))
        g1 = tuple(sorted(dict(base, gpu="1", uuid=MIG_UUID, mig_instance=MIG_UUID).items()))
        expect = {
            ("gsrun_gpu_utilization_ratio", g0): 0.5,
            ("gsrun_gpu_memory_used_bytes", g0): 3.0 * GIB,
            ("gsrun_gpu_power_watts", g0): 123.456,
            ("gsrun_gpu_energy_joules_total", g0): 2500.0,
            ("gsrun_gpu_memory_used_bytes", g1): 5.0 * GIB,
            # the idle detector (gsrun/request/waste.py): GPU 0 at 50 % is busy; GPU 1 has no
            # utilization (MIG) and no process of the job (there is none here): idle
            ("gsrun_gpu_idle", g0): 0.0,
            ("gsrun_gpu_idle", g1): 1.0,
            ("node_textfile_scrape_error", ()): 0.0,
        }
        assert got == expect

        cp = run_node(["epilog"], env)
        assert cp.returncode == 0, cp.stderr
        assert sorted(os.listdir(tdir)) == ["other.prom"]
        after = scrape(port)
        assert after == {("node_textfile_scrape_error", ()): 0.0}
        cp = run_node(["epilog"], env)      # a second epilog: nothing to remove, no error
        assert cp.returncode == 0, cp.stderr
    finally:
        if exporter is not None:
            exporter.kill()
            exporter.wait()
        kill_fakes(site)        # and the site's node daemon
