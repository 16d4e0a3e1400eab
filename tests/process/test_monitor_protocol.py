"""The node monitor's protocol (gsrun.node.monitor): what a request may carry, what the hooks may read
through it, and that a bad request fails alone (the monitor answers the next one)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import pytest

from gsrun.base.paths import Paths
from gsrun.facts.hostfs import HostFS
from gsrun.facts.nvml import NA, FakeNvml, is_na
from gsrun.node import monitor
from gsrun.request.config import load_config_or_defaults
from helpers.node_site import kill_fakes, make_site, nvml_devices, node_daemon

GOOD = {"job_id": "42", "uid": 1000, "node": "gpu01", "gpus": [0, 1], "dma_latency_us": None}


@pytest.mark.parametrize("field,value", [
    ("job_id", "42;rm"), ("job_id", 42), ("job_id", "4243_7"), ("uid", True), ("uid", -1), ("uid", 2 ** 32), ("node", "a b"),
    ("gpus", list(range(65))), ("gpus", [0, "1"]), ("gpus", [4096]), ("dma_latency_us", -1),
    ("dma_latency_us", 2 ** 31), ("dma_latency_us", False),
])
def test_a_begin_field_outside_its_allow_list_is_refused_with_its_name(field, value):
    with pytest.raises(ValueError, match=field):
        monitor.check_begin(dict(GOOD, **{field: value}))


def test_a_good_begin_is_kept_sorted_and_deduplicated():
    assert monitor.check_begin(dict(GOOD, gpus=[3, 1, 3])) == dict(GOOD, gpus=[1, 3])


@pytest.mark.parametrize("line", [b"[]", b'{"op": "exec"}', b"not json", b'"begin"'])
def test_a_line_that_is_no_request_is_refused(line):
    with pytest.raises(ValueError):
        monitor.parse_request(line)


def _monitor(tmp_path) -> monitor.Monitor:
    class _Err:
        error = staticmethod(print)

    paths = Paths(str(tmp_path / "st"), str(tmp_path / "sp"), str(tmp_path / "mps"))
    return monitor.Monitor(HostFS(str(tmp_path)), paths, load_config_or_defaults(_Err),
                           nvml=FakeNvml(nvml_devices(2)), log=lambda m: None)


def test_hooks_read_only_the_served_facts(tmp_path):
    mon = _monitor(tmp_path)
    mon.nv.set(1, "compute_processes", NA("Not Supported", 3))
    out = mon.get()
    assert out["ok"] and len(out["devices"]) == 2
    assert all(sorted(d) == sorted(monitor.REMOTE_KEYS) for d in out["devices"])   # nothing else is read
    assert out["devices"][1]["minor"] == {"value": 1}
    assert out["devices"][0]["compute_processes"] == {"value": []}
    assert out["devices"][1]["compute_processes"] == {"na": "Not Supported", "code": 3}   # never a value
    mon.nv = None
    assert mon.get()["na"]


def _raw(sock: str, data: bytes) -> bytes:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(sock)
    try:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out
    except OSError:
        return b""
    finally:
        s.close()


def test_bad_requests_fail_alone_and_the_hooks_backend_reads_through_the_monitor(monkeypatch):
    ask = monitor.ask
    site = make_site()
    try:
        node_daemon(site.env())
        sock = str(site.state / "monitor.sock")
        assert os.stat(sock).st_mode & 0o777 == 0o600
        assert json.loads(_raw(sock, b'{"op": "exec"}\n'))["ok"] is False
        assert json.loads(_raw(sock, b'{"op": "begin", "job_id": "1;x"}\n'))["error"].startswith("job_id")
        t0 = time.monotonic()
        assert _raw(sock, b"x" * (monitor.MAX_REQUEST_BYTES + 2)) == b""      # too long: dropped unanswered
        assert _raw(sock, b'{"op": "status"') == b""                          # cut short: dropped
        assert time.monotonic() - t0 < 2 * monitor.REQUEST_TIMEOUT_S + 1
        st = monitor.ask(site.state, {"op": "status"})
        assert st["ok"] and st["jobs"] == [] and st["nvml_inits"] == 1
        asked = []
        monkeypatch.setattr(monitor, "ask", lambda *a, **kw: asked.append(a[1]) or ask(*a, **kw))
        nv = monitor.RemoteNvml(site.state)
        assert nv.count() >= 1 and nv.get(0, "minor") == 0
        assert is_na(nv.get(0, "power_mw"))          # not served to hooks
        assert is_na(nv.get(nv.count(), "minor"))    # no such device
        assert nv.get(0, "pci_bus_id") == ask(site.state, {"op": "get"})["devices"][0]["pci_bus_id"]["value"]
        assert asked == [{"op": "get"}]              # every read answered from one request
    finally:
        kill_fakes(site)


def test_the_irqs_refused_at_the_prolog_are_tried_again_once_a_minute_into_the_job(tmp_path, monkeypatch):
    calls = []

    def retry(hostfs, state_dir, job_id, prolog_record=None, log=print):
        calls.append((job_id, str(prolog_record)))
        return [{"irq": "45", "outcome": "applied"}]
    monkeypatch.setattr(monitor.tuning, "retry_skipped_irqs", retry)
    now = [1_800_000_000.0]
    mon = _monitor(tmp_path)
    mon.clock = lambda: now[0]
    mon.begin(dict(GOOD, gpus=[0]))
    mon.tick()
    now[0] += monitor.IRQ_RETRY_AFTER_S - 1
    mon.tick()
    assert calls == []
    for _ in range(3):                 # once, however many polls follow
        now[0] += 5
        mon.tick()
        for t in threading.enumerate():
            if t.name.startswith("irq-retry-"):
                t.join(10)
    assert calls == [("42", str(tmp_path / "sp" / "jobs" / "42" / "prolog-gpu01.json"))]


def test_a_job_is_taken_up_only_from_a_root_job_directory_and_a_checked_baseline(tmp_path):
    mon = _monitor(tmp_path)
    jobs = tmp_path / "st" / "jobs"
    for job, base, mode in (("51", {"0": 1024}, 0o700), ("52", {"0": "zz"}, 0o700), ("53", {"0": 1}, 0o755)):
        d = jobs / job
        d.mkdir(parents=True, mode=mode)
        d.chmod(mode)
        (d / monitor.JOB_FILE).write_text(json.dumps(dict(GOOD, job_id=job, gpus=[0], mem_baseline=base)))
    (jobs / "54").mkdir(mode=0o700)         # never begun: no monitor.json, nothing said
    assert mon.readopt() == ["51", "52"]
    assert mon.jobs["51"].sampler.state["gpus"][0]["mem_baseline_bytes"] == 1024
    assert mon.jobs["52"].sampler.state["gpus"][0]["mem_baseline_bytes"] is None     # "zz": no baseline
    assert monitor.check_mem_baseline({"0": True}) == {} and monitor.check_mem_baseline([1]) == {}
