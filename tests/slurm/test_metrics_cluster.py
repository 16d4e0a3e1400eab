"""The node monitor's Prometheus endpoint on the real local cluster: each node's daemon serves
every GPU of its node (gpu01 on :9410, gpu02 on :9411: ``tests/cluster/up``), idle GPUs with an
empty ``job_id``, a running job's GPUs with its id and user, and the job's series leave once its
epilog ran. Scraped over HTTP as Prometheus does; the job's end state comes from Slurm."""

from __future__ import annotations

import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from helpers.fake_nvml import work_then_idle

PORTS = {"gpu01": 9410, "gpu02": 9411}


def scrape(port: int) -> dict[str, list]:
    """family name -> [(labels, value)] of one scrape of ``127.0.0.1:port``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def power_by_job(port: int) -> dict[str, list[str]]:
    """job_id label -> the gpu labels of ``gsrun_gpu_power_watts``."""
    out: dict[str, list[str]] = {}
    for labels, _v in scrape(port).get("gsrun_gpu_power_watts", []):
        out.setdefault(labels.get("job_id", ""), []).append(labels["gpu"])
    return {k: sorted(v) for k, v in out.items()}


def wait_for(pred, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.5)
    return pred()


def test_every_gpu_is_served_idle_or_with_its_jobs_labels(cluster):
    with cluster.fake_nvml(work_then_idle(4, 0.0)):
        for node, port in PORTS.items():
            idle = wait_for(lambda: power_by_job(port).get("") == ["0", "1", "2", "3"] and power_by_job(port))
            assert idle == {"": ["0", "1", "2", "3"]}, (node, idle)
            watts = {lb["gpu"]: v for lb, v in scrape(port)["gsrun_gpu_power_watts"]}
            assert watts == {"0": 70.0, "1": 70.0, "2": 70.0, "3": 70.0}
            assert {lb["node"] for lb, _v in scrape(port)["gsrun_gpu_power_watts"]} == {node}
        script = cluster.user_script("metrics-sleep.sh", "#!/bin/bash\nsleep 12\necho slept\n")
        cp = cluster.as_user(["gsrun", "--gpus", "2", "--nodes", "1", "--output", "metrics-%j.out", script])
        assert cp.returncode == 0, cp.stdout + cp.stderr
        job = cluster.job_id_from(cp.stderr)
        on = wait_for(lambda: next((n for n, p in PORTS.items() if job in power_by_job(p)), None), 60)
        assert on, "the job's GPUs never appeared with its id"
        got = power_by_job(PORTS[on])
        assert len(got[job]) == 2 and sorted(got[job] + got.get("", [])) == ["0", "1", "2", "3"], got
        users = {lb.get("user") for lb, _v in scrape(PORTS[on])["gsrun_gpu_power_watts"]
                 if lb.get("job_id") == job}
        assert users == {"gsrun-test"}
        cluster.wait_job_done(job, 120)
        cluster.assert_job_end(job, "COMPLETED", "0:0")
        back = wait_for(lambda: job not in power_by_job(PORTS[on]) and power_by_job(PORTS[on]), 30)
        assert back == {"": ["0", "1", "2", "3"]}, back
