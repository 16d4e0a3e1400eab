"""The node daemon's Prometheus endpoint over real HTTP
(gsrun/node/metrics_http.py): started in this process on a free port,
scraped with urllib as Prometheus would, readings changing between scrapes;
a port in use and a bad address are NodeErrors; the config's port 0 turns
it off."""

from __future__ import annotations

import gzip
import socket
import types
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gsrun.base.errors import NodeError
from gsrun.node import monitor
from gsrun.node.metrics import GpuReading
from gsrun.node.metrics_http import GpuCollector, start_http

pytestmark = pytest.mark.process

GIB = 1 << 30
UUID0 = "GPU-00000000-1111-2222-3333-444444444440"
UUID1 = "GPU-00000000-1111-2222-3333-444444444441"


def get(url: str, headers: dict | None = None) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status, dict(resp.headers), resp.read()


def values(text: str) -> dict:
    """{(sample name, job_id or gpu): value} of the gsrun_gpu_ series."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("gsrun_gpu_"):
                out[(s.name, s.labels.get("job_id", "gpu" + s.labels["gpu"]))] = s.value
    return out


@pytest.fixture
def endpoint():
    state = {"readings": [
        GpuReading(0, UUID0, "NVIDIA H200", job_id="4242", user="alice", util_pct=90.0, power_w=650.0,
                   mem_used_bytes=100 * GIB, mem_total_bytes=141 * GIB, temperature_c=70.0, energy_j=5000.0,
                   idle=False),
        GpuReading(1, UUID1, "NVIDIA H200", util_pct=0.0, power_w=70.0, mem_total_bytes=141 * GIB,
                   temperature_c=30.0)]}
    ep = start_http("127.0.0.1", 0, GpuCollector(lambda: state["readings"], "gpu-node01"))
    yield ep, state
    ep.close()


def test_scrape_over_http_with_changing_readings(endpoint):
    ep, state = endpoint
    assert ep.port > 0 and ep.address == "127.0.0.1"
    status, headers, body = get(f"http://127.0.0.1:{ep.port}/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    got = values(body.decode())
    assert got[("gsrun_gpu_utilization_ratio", "4242")] == 0.9
    assert got[("gsrun_gpu_utilization_ratio", "")] == 0.0          # the GPU no job holds
    assert got[("gsrun_gpu_power_watts", "")] == 70.0
    assert got[("gsrun_gpu_energy_joules_total", "4242")] == 5000.0
    assert got[("gsrun_gpu_idle", "4242")] == 0.0 and ("gsrun_gpu_idle", "") not in got
    assert got[("gsrun_gpu_temperature_celsius", "gpu1")] == 30.0
    assert got[("gsrun_gpu_memory_total_bytes", "gpu0")] == 141 * GIB
    assert b"python_gc" not in body and b"process_cpu" not in body    # own registry: only our series
    # the job ended: GPU 0 is free now, and its job series are gone from the next scrape
    state["readings"] = [GpuReading(0, UUID0, "NVIDIA H200", util_pct=0.0), state["readings"][1]]
    got = values(get(f"http://127.0.0.1:{ep.port}/metrics")[2].decode())
    assert not any(k[1] == "4242" for k in got)
    assert got[("gsrun_gpu_utilization_ratio", "")] == 0.0
    # gzip as Prometheus asks for it
    _, headers, body = get(f"http://127.0.0.1:{ep.port}/metrics", {"Accept-Encoding": "gzip"})
    assert headers.get("Content-Encoding") == "gzip" and b"gsrun_exporter_scrape_success 1.0" in gzip.decompress(body)


def test_port_in_use_and_bad_address_are_node_errors(endpoint):
    ep, _ = endpoint
    with pytest.raises(NodeError) as e:
        start_http("127.0.0.1", ep.port, GpuCollector(list, "n"))
    msg = str(e.value)
    assert msg.startswith(f"gsrun: daemon: metrics endpoint: cannot listen on 127.0.0.1:{ep.port}: ")
    assert "hint: set [metrics] http_port" in msg and "dcgm-exporter" in msg
    with pytest.raises(NodeError, match="cannot listen on 198.51.100.1:0"):   # TEST-NET-2 (release roots own 192.0.2.1)
        start_http("198.51.100.1", 0, GpuCollector(list, "n"))
    with pytest.raises(NodeError, match="cannot listen on no-such-host.invalid:0"):
        start_http("no-such-host.invalid", 0, GpuCollector(list, "n"))


def test_every_address_and_config_switch():
    cfg = {"metrics.http_port": 0, "metrics.http_address": "", "metrics.user_label": True}
    mon = types.SimpleNamespace(latest=[GpuReading(0, UUID0, util_pct=12.5)])
    assert monitor._endpoint(cfg, mon, "n", None) is None               # 0 = off
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    cfg["metrics.http_port"] = free
    ep = monitor._endpoint(cfg, mon, "n", None)
    try:
        assert ep.port == free and ep.address in ("::", "0.0.0.0")
        got = values(get(f"http://127.0.0.1:{free}/")[2].decode())      # IPv4 reaches "every address"
        assert got[("gsrun_gpu_utilization_ratio", "")] == 0.125
    finally:
        ep.close()
    with pytest.raises(OSError):                                        # closed: nothing listens
        get(f"http://127.0.0.1:{free}/metrics")


def test_connections_beyond_the_cap_are_closed_unanswered(endpoint):
    """MAX_PER_ADDRESS clients of one address that connect and say nothing hold
    that address's slots: its next scrape is closed unanswered, another
    address's is served, and once they go a scrape works."""
    import http.client
    import time

    from gsrun.node.metrics_http import MAX_PER_ADDRESS

    ep, _ = endpoint
    idle = [socket.create_connection(("127.0.0.1", ep.port), timeout=5) for _ in range(MAX_PER_ADDRESS)]
    try:
        time.sleep(0.2)                        # the server has accepted them all
        with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError)):
            get(f"http://127.0.0.1:{ep.port}/metrics")
        other = http.client.HTTPConnection("127.0.0.1", ep.port, timeout=5, source_address=("127.0.0.2", 0))
        other.request("GET", "/metrics")                                  # from another address: served
        assert other.getresponse().status == 200
        other.close()
    finally:
        for s in idle:
            s.close()
    deadline = time.monotonic() + 5
    while True:
        try:
            assert get(f"http://127.0.0.1:{ep.port}/metrics")[0] == 200
            break
        except (http.client.RemoteDisconnected, ConnectionResetError):
            assert time.monotonic() < deadline, "slots not released after the idle clients left"
            time.sleep(0.05)


def test_a_client_trickling_its_headers_is_cut_off_at_the_request_deadline(endpoint):
    """One header line every second keeps a per-read timeout happy; the
    connection still ends REQUEST_DEADLINE_S after it was accepted."""
    import time

    from gsrun.node.metrics_http import REQUEST_DEADLINE_S

    ep, _ = endpoint
    s = socket.create_connection(("127.0.0.1", ep.port), timeout=REQUEST_DEADLINE_S + 5)
    t0 = time.monotonic()
    try:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        while time.monotonic() - t0 < REQUEST_DEADLINE_S + 4:
            try:
                s.sendall(b"X-a: b\r\n")
            except OSError:
                break
            s.settimeout(1.0)
            try:
                if s.recv(1024) == b"":
                    break
            except socket.timeout:
                pass
        took = time.monotonic() - t0
    finally:
        s.close()
    assert REQUEST_DEADLINE_S - 0.5 <= took < REQUEST_DEADLINE_S + 3, took
