"""gsrun.report.mail: message building, spool queue, sender with retry, exactly-once.

Real mail goes to a real SMTP server (aiosmtpd) on 127.0.0.1; outages are the
server really stopped (connection refused) or a socket that never answers.
Field cases (docs/field-cases.md; ``test_caseN_...`` names the case): 12 (MIG
utilization N/A), 15 (NVML init failed), 23 (cancelled before start, zero
divisors), 16 (Xid / GPU lost flagged).
"""

from __future__ import annotations

import copy
import io
import os
import socket
import shutil
import stat
import struct
import subprocess
import threading
import time
import zlib
from email import policy
from email.parser import BytesParser

import pytest

from gsrun.request.config import parse_config
from gsrun.base.errors import ConfigError, InputError, NodeError
from gsrun.report import mail
from gsrun.report.records import JobSummary
from gsrun.report.render import render_text
from gsrun.report.mail import (backoff_s, build_message, enqueue, flush, mail_kind, mail_wanted,
                        queue_status, subject_line, validate_addr)

aiosmtpd_controller = pytest.importorskip("aiosmtpd.controller")
from aiosmtpd.smtp import AuthResult, LoginPassword  # noqa: E402

TO = "alice@example.org"
FROM = "gsrun@cluster.example"


# ----------------------------------------------------------------------------- helpers

def tiny_png(width: int = 3, height: int = 2) -> bytes:
    """A valid RGB PNG built by hand (signature, IHDR, IDAT, IEND)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    raw = b"".join(b"\x00" + bytes([255, 0, 0] * width) for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def summary_json(**job_over) -> dict:
    """A job summary's JSON form; ``job_over`` overrides job fields."""
    job = {"id": "42", "array": None, "user": "user1", "name": "train", "partition": "gpu",
           "state": "COMPLETED", "exit_code": 0, "nodes": ["gpu01", "gpu02"], "elapsed_s": 3600.0,
           "cpus_alloc": 8, "gpus_alloc": 2, "mail_user": TO, "mail_type": "END"}
    job.update(job_over)
    dev = {"node": "gpu01", "index": 0, "name": "NVIDIA H200", "uuid": "GPU-aaaa", "pci_bus_id": "0000:00:06.0",
           "util_mean_pct": 40.0, "sm_active_mean_pct": 11.0, "tensor_active_mean_pct": 2.0,
           "mem_peak_bytes": 40 << 30, "mem_total_bytes": 141 << 30, "energy_j": 720000.0,
           "power_mean_w": 200.0, "throttle_s": {"thermal": 0, "power": 3.5}, "xid": [], "lost_at_s": None}
    dev2 = dict(dev, node="gpu02", uuid="GPU-bbbb", util_mean_pct=60.0)
    return {"schema": "gsrun.summary/1", "kind": "job", "job": job,
            "cpu": {"time_s": 12096.0, "efficiency_pct": 42.0, "source": "cgroup v2 cpu.stat"},
            "memory": {"peak_bytes": 3 << 30, "req_bytes": 8 << 30, "efficiency_pct": 37.5},
            "gpu": {"available": True, "reason": None, "devices": [dev, dev2], "energy_j": 1440000.0,
                    "gpu_hours_alloc": 2.0, "gpu_hours_used": 1.0},
            "findings": [{"code": "low_sm_activity", "severity": "warn",
                          "text": "SM activity 11% while utilization 50%: kernels too small", "value": 11.0}]}


def make_summary(**job_over) -> JobSummary:
    return JobSummary.from_json(summary_json(**job_over))


def parts(msg):
    """content types of the whole tree, depth first"""
    return [p.get_content_type() for p in msg.walk()]


def text_of(msg) -> str:
    return msg.get_body(("plain",)).get_content()


def html_of(msg) -> str:
    return msg.get_body(("html",)).get_content()


def cfg_for(port: int, **over):
    c = {"mail.smtp_host": "127.0.0.1", "mail.smtp_port": port, "mail.starttls": False, "mail.username": "",
         "mail.password_file": "", "mail.mailprog": "", "mail.max_attempts": 48, "timeouts.command_s": 5.0,
         "mail.from_addr": FROM}
    c.update(over)
    return c


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Sink:
    """aiosmtpd handler: keeps every message received (bytes) and envelope."""

    def __init__(self, delay_s: float = 0.0, refuse_rcpt: str | None = None):
        self.messages: list[dict] = []
        self.delay_s = delay_s
        self.refuse_rcpt = refuse_rcpt
        self.lock = threading.Lock()

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if self.refuse_rcpt and address == self.refuse_rcpt:
            return "550 5.1.1 no such user"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        if self.delay_s:
            import asyncio
            await asyncio.sleep(self.delay_s)
        with self.lock:
            self.messages.append({"from": envelope.mail_from, "rcpt": list(envelope.rcpt_tos),
                                  "data": envelope.original_content or envelope.content})
        return "250 Message accepted for delivery"

    def parsed(self, i: int = 0):
        return BytesParser(policy=policy.default).parsebytes(self.messages[i]["data"])


class Server:
    """A real SMTP server on 127.0.0.1 that a test can stop and start again on the same port."""

    def __init__(self, sink: Sink, port: int | None = None, **smtp_kwargs):
        self.sink = sink
        self.port = port or free_port()
        self.kwargs = smtp_kwargs
        self.ctl = None

    def start(self):
        self.ctl = aiosmtpd_controller.Controller(self.sink, hostname="127.0.0.1", port=self.port, **self.kwargs)
        self.ctl.start()
        return self

    def stop(self):
        if self.ctl:
            self.ctl.stop()
            self.ctl = None


@pytest.fixture
def server():
    srv = Server(Sink()).start()
    yield srv
    srv.stop()


@pytest.fixture
def spool(tmp_path):
    d = tmp_path / "spool"
    d.mkdir()
    return d


def queued(spool, sub):
    return sorted(p.name for p in (spool / "mail" / sub).iterdir() if not p.name.startswith("."))


# ----------------------------------------------------------------------------- message structure

def test_message_headers_parts_and_subject():
    png = tiny_png()
    s = make_summary()
    msg = build_message(s, render_text(s), png, TO, FROM, date=1_700_000_000)
    # (40 + 60) / 2 = 50 % GPU busy, judged against the default targets; CPU eff from the summary
    assert msg["Subject"] == "[gsrun] job 42 (train) COMPLETED: GPU busy 50% (good), CPU eff 42%"
    assert msg["To"] == TO
    assert msg["From"].addresses[0].addr_spec == FROM
    assert msg["Auto-Submitted"] == "auto-generated"
    assert msg["Message-ID"].startswith("<gsrun.job-42.") and msg["Message-ID"].endswith("@cluster.example>")
    assert "2023" in msg["Date"]
    assert parts(msg) == ["multipart/alternative", "text/plain", "multipart/related", "text/html", "image/png"]
    text, html = text_of(msg), html_of(msg)
    # the text part is the 76-column report itself, verdict first
    assert text.startswith(render_text(s))
    lines = text.splitlines()
    assert max(len(ln) for ln in lines) <= 76
    assert "CPU efficiency  42%  could be better  of 8 cores" in lines
    assert "Host memory     38%  could be better  peak 3.0 of 8.0 GiB requested" in lines   # 37.5 %
    assert "    memory peak 40.0 of 141.0 GiB, power 200 W, energy 200 Wh" in lines
    assert "  !  SM activity 11% while utilization 50%: kernels too small" in lines
    assert "  GPU-hours busy 1.00 of 2.00 allocated; energy 400 Wh" in lines           # 1.44 MJ / 3600
    assert "37.5" not in text and "kWh" not in text and " J" not in text
    # the HTML: the same figures in the same units, the report-text copy dropped
    for frag in ("<td style=\"padding: 4px 8px 4px 0; text-align: right; font-weight: bold; vertical-align: top;\">42%</td>",
                 "peak 3.0 of 8.0 GiB requested", "40.0 of 141.0 GiB", "SM activity 11% while utilization 50%",
                 "energy 400 Wh", "slowed by power 00:00:04"):                  # 3.5 s of power capping
        assert frag in html, frag
    assert "gsrun report: job 42" not in html and "37.5" not in html
    # every byte is 7-bit: any relay takes it
    assert max(msg.as_bytes()) < 128


def test_inline_png_content_id_matches_html():
    png = tiny_png(5, 4)
    msg = build_message(make_summary(), "r", png, TO, FROM)
    img = next(p for p in msg.walk() if p.get_content_type() == "image/png")
    cid = img["Content-ID"].strip("<>")
    assert f'src="cid:{cid}"' in html_of(msg)
    assert img.get_content_disposition() == "inline"
    data = img.get_content()
    assert data == png
    # the bytes really decode as a 5x4 RGB picture
    import matplotlib.image
    arr = matplotlib.image.imread(io.BytesIO(data), format="png")
    assert arr.shape[:2] == (4, 5)
    assert arr[0, 0, 0] == pytest.approx(1.0) and arr[0, 0, 1] == pytest.approx(0.0)


def test_no_png_gives_plain_alternative_and_bad_png_is_dropped_with_note():
    msg = build_message(make_summary(), "r", None, TO, FROM)
    assert parts(msg) == ["multipart/alternative", "text/plain", "text/html"]
    assert "cid:" not in html_of(msg) and "unavailable" not in text_of(msg)
    bad = build_message(make_summary(), "r", b"GIF89a not a png", TO, FROM)
    assert "image/png" not in parts(bad)
    assert "Timeline picture unavailable" in text_of(bad)
    assert "cid:" not in html_of(bad)


def test_message_id_is_stable_per_job_and_differs_between_jobs():
    a1 = build_message(make_summary(), "r", None, TO, FROM)
    a2 = build_message(make_summary(), "other text", None, TO, FROM)
    b = build_message(make_summary(id="43"), "r", None, TO, FROM)
    arr = build_message(make_summary(id="15055386", array="15053872_1491"), "r", None, TO, FROM)
    assert a1["Message-ID"] == a2["Message-ID"]
    assert a1["Message-ID"] != b["Message-ID"]
    assert arr["Message-ID"].startswith("<gsrun.job-15053872_1491.")
    assert arr["Subject"].startswith("[gsrun] job 15053872_1491 (train) COMPLETED")


HOSTILE_NAME = '<script>alert(1)</script>"; rm -rf / $(reboot)\r\nBcc: victim@evil.example\x1b[31m\u202e'
HOSTILE_USER = '"><img src=x onerror=alert(2)>'


def test_hostile_job_name_and_user_are_escaped_and_cannot_inject_headers(server, spool):
    d = summary_json(name=HOSTILE_NAME, user=HOSTILE_USER)
    d["findings"][0]["text"] = "<b>bold</b> & co"
    s = JobSummary.from_json(d)
    msg = build_message(s, render_text(s) + "<pre>not html</pre>\n", tiny_png(), TO, FROM)
    for k, v in msg.items():
        assert "\r" not in str(v) and "\n" not in str(v).replace("\n ", ""), (k, v)
        assert "\x1b" not in str(v) and "\u202e" not in str(v)
    assert msg["Bcc"] is None
    html = html_of(msg)
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<img src=x" not in html and "&#34;&gt;&lt;img src=x onerror=alert(2)&gt;" in html
    assert "<b>bold</b>" not in html and "&lt;b&gt;bold&lt;/b&gt; &amp; co" in html
    assert "not html" not in html                       # the report-text copy is not in the HTML part
    assert html.count("<img ") == 1                       # only our timeline
    text = text_of(msg)
    assert "\x1b" not in text and "\u202e" not in text
    # shown literally (the report wraps the title at 76 columns; CR LF became a space)
    assert '"; rm -rf / $(reboot) Bcc: victim@evil.example' in " ".join(text.split())
    assert not any(ln.startswith("Bcc:") for ln in text.splitlines())
    assert "<pre>not html</pre>" in text                 # plain text stays plain

    # and through a real server: one recipient only, Subject intact, no Bcc smuggled in
    enqueue(spool, "42", msg)
    assert flush(spool, cfg_for(server.port))["sent"] == 1
    got = server.sink.messages[0]
    assert got["rcpt"] == [TO]
    rx = server.sink.parsed()
    assert rx["Bcc"] is None
    assert rx["Subject"].startswith('[gsrun] job 42 (<script>alert(1)</script>"; rm -rf / $(reboot) Bcc:')


@pytest.mark.parametrize("bad", [
    "alice@example.org\r\nBcc: eve@evil.example",
    "alice@example.org\nX: y",
    "alice@example.org, eve@evil.example",
    "user1",                      # Slurm's default MailUser: the bare user name
    "",
    "   ",
    "<>",
    "alice@",
    "@example.org",
    "al ice@example.org",
    "alice@exa_mple.org",
    "alice@example.org\x00",
    "a..b@example.org",
])
def test_bad_addresses_are_refused(bad):
    with pytest.raises(InputError) as ei:
        build_message(make_summary(), "r", None, bad, FROM)
    assert str(ei.value).startswith("gsrun: mail: bad recipient address")
    with pytest.raises(InputError):
        build_message(make_summary(), "r", None, TO, bad)


def test_good_addresses_are_normalised():
    assert validate_addr("Alice Smith <alice.smith+gpu@mail.example.org>") == "alice.smith+gpu@mail.example.org"
    assert validate_addr("x@localhost") == "x@localhost"
    with pytest.raises(InputError) as ei:
        validate_addr("user1")
    assert "mail domain" in str(ei.value)


def test_non_ascii_job_name_is_encoded_not_mangled():
    s = make_summary(name="训练 ✓")
    msg = build_message(s, render_text(s), None, TO, FROM)
    assert max(msg.as_bytes()) < 128
    rx = BytesParser(policy=policy.default).parsebytes(msg.as_bytes())
    assert rx["Subject"] == "[gsrun] job 42 (训练 ✓) COMPLETED: GPU busy 50% (good), CPU eff 42%"
    assert "训练 ✓" in text_of(rx)


# ----------------------------------------------------------------------------- field cases

def test_case23_cancelled_before_start_gets_no_efficiency_lecture():
    d = summary_json(id="15055386", array="15053872_1491", state="CANCELLED by 1000", elapsed_s=0.0,
                     cpus_alloc=0, exit_code=0)
    d["cpu"] = {"time_s": 0.0, "efficiency_pct": None, "source": "sacct"}
    d["memory"] = {"peak_bytes": None, "req_bytes": 4 << 30, "efficiency_pct": None}
    d["gpu"] = {"available": True, "reason": None, "devices": [], "energy_j": None,
                "gpu_hours_alloc": 0.0, "gpu_hours_used": 0.0}
    d["findings"] = [{"code": "cpu_idle", "severity": "warn", "text": "CPU efficiency 0%: ask for fewer CPUs",
                      "value": 0.0}]
    s = JobSummary.from_json(d)
    assert mail_kind(s) == "cancelled_before_start"
    msg = build_message(s, "CPU efficiency 0.0%", None, TO, FROM)
    assert msg["Subject"] == "[gsrun] job 15053872_1491 (train) CANCELLED before start"
    for body in (text_of(msg), html_of(msg)):
        assert "cancelled before it started" in body
        assert "15053872_1491" in body
        assert "%" not in body                       # no efficiency figure at all
        assert "ask for fewer CPUs" not in body and "What to change" not in body


def test_case23_instant_failure_says_figures_not_meaningful():
    d = summary_json(id="13421658", state="FAILED", elapsed_s=0.0, exit_code=1)
    d["cpu"]["efficiency_pct"] = None
    d["memory"]["efficiency_pct"] = None
    s = JobSummary.from_json(d)
    assert mail_kind(s) == "no_run"
    msg = build_message(s, render_text(s), None, TO, FROM)
    assert msg["Subject"] == "[gsrun] job 13421658 (train) FAILED after 0 s: no efficiency figures"
    text = text_of(msg)
    assert "The job ended after 0 s: CPU, memory and GPU efficiency are not meaningful" in text
    assert "gsrun report: job 13421658 (train) FAILED on gpu01 and 1 more" in text.splitlines()
    # no verdict for a job that did not run: no judgement word anywhere
    assert not any(w in text for w in ("good", "could be better", "wasteful", "efficiency 42%", "38%"))


def test_case23_requeued_is_not_mailed_now():
    assert mail_kind(make_summary(state="REQUEUED")) == "requeued"
    assert mail_kind(make_summary(state="PENDING", elapsed_s=0)) == "requeued"
    assert mail_wanted("END", "job", state="REQUEUED") is False
    assert mail_wanted("ALL", "always", state="PENDING") is False
    assert "report follows" in subject_line(make_summary(state="REQUEUED"))


def test_case15_gpu_unavailable_still_mails_cpu_and_memory():
    d = summary_json()
    d["gpu"] = {"available": False, "reason": "NVML init failed: LIB_RM_VERSION_MISMATCH", "devices": [],
                "energy_j": None, "gpu_hours_alloc": 2.0, "gpu_hours_used": None}
    s = JobSummary.from_json(d)
    msg = build_message(s, render_text(s), None, TO, FROM)
    assert msg["Subject"] == "[gsrun] job 42 (train) COMPLETED: GPU data unavailable, CPU eff 42%"
    text, html = text_of(msg), html_of(msg)
    for body in (text, html):
        assert "NVML init failed: LIB_RM_VERSION_MISMATCH" in body
        assert "peak 3.0 of 8.0 GiB requested" in body
    assert "CPU efficiency  42%  could be better  of 8 cores" in text.splitlines()
    assert "  unavailable (NVML init failed: LIB_RM_VERSION_MISMATCH)" in text.splitlines()
    assert "vertical-align: top;\">42%</td>" in html


def test_case12_mig_utilization_is_na_never_did_not_use_gpu():
    d = summary_json(gpus_alloc=1)
    mig = {"node": "gpu01", "index": 0, "name": "NVIDIA H100 80GB HBM3 MIG 1g.10gb",
           "uuid": "MIG-6d4f1b2c-2a6b-5c3e-9f1e-0123456789ab", "pci_bus_id": "0000:00:06.0",
           "util_mean_pct": None, "sm_active_mean_pct": None, "tensor_active_mean_pct": None,
           "mem_peak_bytes": int(9.5 * (1 << 30)), "mem_total_bytes": int(9.75 * (1 << 30)),
           "energy_j": None, "power_mean_w": None, "throttle_s": {}, "xid": [], "lost_at_s": None}
    d["gpu"]["devices"] = [mig]
    # a findings engine that forgot about MIG: the mail must not repeat it
    d["findings"] = [{"code": "idle_gpu", "severity": "warn", "text": "Your job did not use the GPU",
                      "value": 0.0}]
    s = JobSummary.from_json(d)
    msg = build_message(s, render_text(s), None, TO, FROM)
    assert msg["Subject"] == "[gsrun] job 42 (train) COMPLETED: GPU busy N/A (MIG), CPU eff 42%"
    for body in (text_of(msg), html_of(msg)):
        assert "N/A (MIG)" in body, body
        assert "did not use" not in body.lower()
        assert "0%" not in body.replace("100%", "")  # no 0 % utilization anywhere
        assert "9.5 of 9.8 GiB" in body              # memory still reported, in the total's unit


def test_case16_xid_and_lost_gpu_flagged():
    d = summary_json()
    d["gpu"]["devices"][1].update(xid=[79], lost_at_s=1800.0)
    s = JobSummary.from_json(d)
    msg = build_message(s, render_text(s), None, TO, FROM)
    text, html = text_of(msg), html_of(msg)
    lines = text.splitlines()
    i = lines.index("  gpu02 GPU 0, NVIDIA H200")
    assert lines[i + 3] == "    lost 00:30:00 into the job; Xid 79"
    assert '<b style="color: #c62828;">lost 00:30:00 into the job</b> <b style="color: #c62828;">Xid 79</b>' in html


def test_cpu_only_job_has_no_gpu_part():
    d = summary_json(gpus_alloc=0)
    d["gpu"] = {"available": True, "reason": None, "devices": [], "energy_j": None,
                "gpu_hours_alloc": 0.0, "gpu_hours_used": 0.0}
    s = JobSummary.from_json(d)
    msg = build_message(s, "r", None, TO, FROM)
    assert msg["Subject"] == "[gsrun] job 42 (train) COMPLETED: CPU eff 42%"
    assert "GPU" not in text_of(msg).split("---- report")[0].replace("[gsrun]", "")


# ----------------------------------------------------------------------------- mail_wanted

@pytest.mark.parametrize("mail_type,policy_,state,want", [
    ("END", "job", None, True),
    ("ALL", "job", None, True),
    ("END,FAIL", "job", None, True),
    ("INVALID_DEPEND,BEGIN,END,FAIL,REQUEUE,STAGE_OUT", "job", None, True),   # how scontrol prints ALL
    ("BEGIN", "job", None, False),
    ("NONE", "job", None, False),
    ("(null)", "job", None, False),
    (None, "job", None, False),
    ("", "job", None, False),
    ("INVALID_DEPEND", "job", None, False),
    ("TIME_LIMIT_90", "job", None, False),
    ("REQUEUE,ARRAY_TASKS", "job", None, False),
    ("FAIL", "job", "COMPLETED", False),
    ("FAIL", "job", "FAILED", True),
    ("FAIL", "job", "OUT_OF_MEMORY", True),
    ("end", "job", None, True),
    ("NONE", "always", None, True),
    (None, "always", "COMPLETED", True),
    ("ALL", "never", None, False),
    ("END", "job", "RUNNING", False),
])
def test_mail_wanted(mail_type, policy_, state, want):
    assert mail_wanted(mail_type, policy_, state=state) is want


def test_mail_wanted_disabled_and_bad_policy():
    assert mail_wanted("END", "job", enabled=False) is False
    with pytest.raises(ConfigError):
        mail_wanted("END", "sometimes")


# ----------------------------------------------------------------------------- spool + SMTP

def test_enqueue_flush_delivers_real_mail_and_moves_to_sent(server, spool):
    png = tiny_png()
    msg = build_message(make_summary(), render_text(make_summary()), png, TO, FROM)
    path = enqueue(spool, "42", msg)
    assert path == spool / "mail" / "new" / "42.eml"
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.lstat(spool / "mail").st_mode) == 0o700
    res = flush(spool, cfg_for(server.port))
    assert res == {"sent": 1, "failed": 0, "deferred": 0, "busy": False}
    assert len(server.sink.messages) == 1
    got = server.sink.messages[0]
    assert got["from"] == FROM and got["rcpt"] == [TO]
    rx = server.sink.parsed()
    assert rx["Subject"] == "[gsrun] job 42 (train) COMPLETED: GPU busy 50% (good), CPU eff 42%"
    assert rx["Message-ID"] == msg["Message-ID"]
    assert parts(rx) == ["multipart/alternative", "text/plain", "multipart/related", "text/html", "image/png"]
    img = next(p for p in rx.walk() if p.get_content_type() == "image/png")
    assert img.get_content() == png and f'cid:{img["Content-ID"].strip("<>")}' in html_of(rx)
    assert text_of(rx).replace("\r\n", "\n").startswith(render_text(make_summary()))
    assert queued(spool, "new") == [] and queued(spool, "sent") == ["42.eml"]
    assert queue_status(spool)["sent"] == ["42"]
    # a second flush sends nothing
    assert flush(spool, cfg_for(server.port))["sent"] == 0
    assert len(server.sink.messages) == 1


def test_enqueue_is_idempotent_per_job(server, spool):
    m1 = build_message(make_summary(), "first", None, TO, FROM)
    m2 = build_message(make_summary(), "second", None, TO, FROM)
    p1 = enqueue(spool, "42", m1)
    p2 = enqueue(spool, "42", m2)
    assert p1 == p2 and queued(spool, "new") == ["42.eml"]
    assert queued(spool, "tmp") == []                      # no staging litter
    flush(spool, cfg_for(server.port))
    # after delivery a rerun epilog still does not mail twice
    p3 = enqueue(spool, "42", m2)
    assert p3 == spool / "mail" / "sent" / "42.eml"
    assert flush(spool, cfg_for(server.port))["sent"] == 0
    assert len(server.sink.messages) == 1
    assert "first" in text_of(server.sink.parsed())


def test_concurrent_enqueue_of_same_job_gives_one_message(spool):
    msgs = [build_message(make_summary(), f"text {i}", None, TO, FROM) for i in range(8)]
    paths = []
    ts = [threading.Thread(target=lambda m=m: paths.append(enqueue(spool, "42", m))) for m in msgs]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert len(set(paths)) == 1 and queued(spool, "new") == ["42.eml"]
    assert [p for p in (spool / "mail" / "tmp").iterdir()] == []


def test_outage_then_recovery_delivers_exactly_once(spool):
    sink = Sink()
    srv = Server(sink).start()
    port = srv.port
    srv.stop()                                              # relay down: connection refused
    enqueue(spool, "42", build_message(make_summary(), "r", None, TO, FROM))
    enqueue(spool, "43", build_message(make_summary(id="43"), "r", None, TO, FROM))
    t0 = 1_000_000.0
    res = flush(spool, cfg_for(port), now=t0)
    assert res == {"sent": 0, "failed": 0, "deferred": 2, "busy": False}
    assert queued(spool, "new") == ["42.eml", "43.eml"]
    st = mail.read_json(spool / "mail" / "state" / "42.json")
    assert st["attempts"] == 1 and st["next_try"] == t0 + backoff_s(1) == t0 + 60
    assert "unreachable" in st["last_error"]
    # before next_try nothing is tried (attempts unchanged)
    assert flush(spool, cfg_for(port), now=t0 + 30) == {"sent": 0, "failed": 0, "deferred": 2, "busy": False}
    assert mail.read_json(spool / "mail" / "state" / "42.json")["attempts"] == 1
    srv = Server(sink, port=port).start()                  # relay back, same port
    try:
        res = flush(spool, cfg_for(port), now=t0 + 61)
        assert res == {"sent": 2, "failed": 0, "deferred": 0, "busy": False}
        assert flush(spool, cfg_for(port), now=t0 + 10_000)["sent"] == 0
        assert sorted(m["data"].count(b"Message-ID: <gsrun.job-42.") for m in sink.messages) == [0, 1]
        assert len(sink.messages) == 2
        assert queued(spool, "sent") == ["42.eml", "43.eml"]
        assert mail.read_json(spool / "mail" / "state" / "42.json")["attempts"] == 2
    finally:
        srv.stop()


def test_silent_server_times_out_instead_of_blocking(spool):
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(8)                       # accepts (kernel backlog) but never says 220
    try:
        for i in range(3):
            enqueue(spool, str(100 + i), build_message(make_summary(id=str(100 + i)), "r", None, TO, FROM))
        t = time.monotonic()
        res = flush(spool, cfg_for(lsock.getsockname()[1], **{"timeouts.command_s": 0.5}), now=5000.0)
        took = time.monotonic() - t
    finally:
        lsock.close()
    assert res["deferred"] == 3 and res["sent"] == 0
    # one timeout for the first message; the others are not tried against a dead relay
    assert took < 2.5, took
    for i in range(3):
        assert mail.read_json(spool / "mail" / "state" / f"{100 + i}.json")["attempts"] == 1


def test_max_attempts_moves_to_failed(spool):
    port = free_port()                                      # nothing listens: refused
    enqueue(spool, "42", build_message(make_summary(), "r", None, TO, FROM))
    cfg = cfg_for(port, **{"mail.max_attempts": 3})
    t = 0.0
    results = []
    for _ in range(3):
        results.append(flush(spool, cfg, now=t))
        t += backoff_s(4) + 1
    assert [r["deferred"] for r in results] == [1, 1, 0]
    assert results[-1]["failed"] == 1
    assert queued(spool, "failed") == ["42.eml"] and queued(spool, "new") == []
    st = mail.read_json(spool / "mail" / "state" / "42.json")
    assert st["attempts"] == 3 and st["next_try"] is None
    assert flush(spool, cfg, now=t + 1e6) == {"sent": 0, "failed": 0, "deferred": 0, "busy": False}


def test_retry_failed_requeues_with_fresh_attempts(server, spool):
    enqueue(spool, "42", build_message(make_summary(), "r", None, TO, FROM))
    flush(spool, cfg_for(free_port(), **{"mail.max_attempts": 1}), now=0.0)
    assert queued(spool, "failed") == ["42.eml"]
    assert mail.retry_failed(spool) == ["42"]
    assert queued(spool, "new") == ["42.eml"] and mail.read_json(spool / "mail" / "state" / "42.json") is None
    assert flush(spool, cfg_for(server.port, **{"mail.max_attempts": 1}), now=1.0)["sent"] == 1
    assert len(server.sink.messages) == 1


def test_garbage_in_the_spool_is_failed_not_retried_forever(server, spool):
    enqueue(spool, "42", build_message(make_summary(), "r", None, TO, FROM))
    (spool / "mail" / "new" / "41.eml").write_bytes(b"this is not a mail\n\x00\xff")
    res = flush(spool, cfg_for(server.port), now=0.0)
    assert res == {"sent": 1, "failed": 1, "deferred": 0, "busy": False}
    assert queued(spool, "failed") == ["41.eml"]
    assert "bad queued message" in mail.read_json(spool / "mail" / "state" / "41.json")["last_error"]
    assert len(server.sink.messages) == 1


def test_backoff_is_exponential_and_capped():
    assert [backoff_s(n) for n in (1, 2, 3, 4)] == [60, 120, 240, 480]
    assert backoff_s(7) == 3600 and backoff_s(48) == 3600


def test_permanent_refusal_fails_at_once(spool):
    srv = Server(Sink(refuse_rcpt=TO)).start()
    try:
        enqueue(spool, "42", build_message(make_summary(), "r", None, TO, FROM))
        res = flush(spool, cfg_for(srv.port), now=10.0)
    finally:
        srv.stop()
    assert res == {"sent": 0, "failed": 1, "deferred": 0, "busy": False}
    st = mail.read_json(spool / "mail" / "state" / "42.json")
    assert st["attempts"] == 1 and "550" in st["last_error"]
    assert queued(spool, "failed") == ["42.eml"]


def test_two_concurrent_flushes_deliver_each_message_once(spool):
    sink = Sink(delay_s=0.3)                                # slow relay: the flushes overlap
    srv = Server(sink).start()
    try:
        for i in range(3):
            enqueue(spool, str(i + 1), build_message(make_summary(id=str(i + 1)), "r", None, TO, FROM))
        results = []
        barrier = threading.Barrier(2)

        def run():
            barrier.wait()
            results.append(flush(spool, cfg_for(srv.port)))
        ts = [threading.Thread(target=run) for _ in range(2)]
        [t.start() for t in ts]
        [t.join(30) for t in ts]
    finally:
        srv.stop()
    assert sum(r["sent"] for r in results) == 3
    assert len(sink.messages) == 3
    ids = sorted(BytesParser(policy=policy.default).parsebytes(m["data"])["X-Gsrun-Job"] for m in sink.messages)
    assert ids == ["1", "2", "3"]


def test_two_flush_processes_deliver_each_message_once(spool):
    """Same as above with two real processes (separate flock owners)."""
    import json
    import sys
    from pathlib import Path
    repo = Path(__file__).resolve().parents[2]
    sink = Sink(delay_s=0.2)
    srv = Server(sink).start()
    try:
        for i in range(4):
            enqueue(spool, str(i + 1), build_message(make_summary(id=str(i + 1)), "r", None, TO, FROM))
        code = ("import sys, json; from gsrun.report.mail import flush; "
                "print(json.dumps(flush(sys.argv[2], json.loads(sys.argv[3]))))")
        cfg = json.dumps(cfg_for(srv.port, **{"timeouts.command_s": 10.0}))
        procs = [subprocess.Popen([sys.executable, "-P", "-c", code, str(repo), str(spool), cfg],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        srv.stop()
    assert [p.returncode for p in procs] == [0, 0], outs
    results = [json.loads(o[0]) for o in outs]
    assert sum(r["sent"] for r in results) == 4
    assert len(sink.messages) == 4


def test_claim_by_rename_succeeds_once(spool):
    enqueue(spool, "42", build_message(make_summary(), "r", None, TO, FROM))
    base = spool / "mail"
    assert mail._move(base, "42", "new", "tmp") is True
    assert mail._move(base, "42", "new", "tmp") is False


def test_flush_busy_when_another_holds_the_spool_past_timeout(spool):
    """The second flush waits at most timeouts.command_s, then reports busy and touches nothing."""
    enqueue(spool, "42", build_message(make_summary(), "r", None, TO, FROM))
    started, release = threading.Event(), threading.Event()
    sent = []

    def slow_send(msg, cfg):
        started.set()
        release.wait(10)
        sent.append(msg["X-Gsrun-Job"])
    th = threading.Thread(target=lambda: flush(spool, cfg_for(1), send=slow_send))
    th.start()
    assert started.wait(5)
    t = time.monotonic()
    res = flush(spool, cfg_for(1, **{"timeouts.command_s": 0.5}), send=slow_send)
    assert res == {"sent": 0, "failed": 0, "deferred": 0, "busy": True}
    assert time.monotonic() - t < 2
    release.set()
    th.join(10)
    assert sent == ["42"]


def test_message_left_claimed_by_a_dead_flush_is_recovered_once(server, spool):
    enqueue(spool, "42", build_message(make_summary(), "r", None, TO, FROM))
    os.rename(spool / "mail" / "new" / "42.eml", spool / "mail" / "tmp" / "42.eml")   # flush died mid-send
    assert enqueue(spool, "42", build_message(make_summary(), "x", None, TO, FROM)).parent.name == "tmp"
    assert flush(spool, cfg_for(server.port))["sent"] == 1
    assert flush(spool, cfg_for(server.port))["sent"] == 0
    assert len(server.sink.messages) == 1


def test_transport_bug_keeps_the_message(spool):
    enqueue(spool, "42", build_message(make_summary(), "r", None, TO, FROM))

    def broken(msg, cfg):
        raise RuntimeError("boom")
    res = flush(spool, cfg_for(1), now=0.0, send=broken)
    assert res["deferred"] == 1 and queued(spool, "new") == ["42.eml"]
    assert "RuntimeError: boom" in mail.read_json(spool / "mail" / "state" / "42.json")["last_error"]


@pytest.mark.filterwarnings("ignore:Requiring AUTH")
def test_smtp_auth_with_password_file(spool, tmp_path):
    def auth(server, session, envelope, mechanism, auth_data):
        ok = isinstance(auth_data, LoginPassword) and auth_data.login == b"gsrun" and auth_data.password == b"s3cret"
        return AuthResult(success=ok, handled=False)
    sink = Sink()
    srv = Server(sink, authenticator=auth, auth_required=True, auth_require_tls=False).start()
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    pw.chmod(0o600)
    try:
        enqueue(spool, "1", build_message(make_summary(id="1"), "r", None, TO, FROM))
        enqueue(spool, "2", build_message(make_summary(id="2"), "r", None, TO, FROM))
        good = cfg_for(srv.port, **{"mail.username": "gsrun", "mail.password_file": str(pw)})
        wrong = tmp_path / "wrong"
        wrong.write_text("nope")
        wrong.chmod(0o600)
        bad = dict(good, **{"mail.password_file": str(wrong)})
        res = flush(spool, bad, now=0.0)
        assert res["deferred"] == 2 and sink.messages == []
        assert "authentication" in mail.read_json(spool / "mail" / "state" / "1.json")["last_error"]
        pw_world = tmp_path / "pw_world"
        pw_world.write_text("s3cret")
        pw_world.chmod(0o644)
        res = flush(spool, dict(good, **{"mail.password_file": str(pw_world)}), now=1000.0)
        assert res["sent"] == 0
        assert "world-readable" in mail.read_json(spool / "mail" / "state" / "1.json")["last_error"]
        res = flush(spool, good, now=5000.0)
        assert res["sent"] == 2 and len(sink.messages) == 2
    finally:
        srv.stop()


def test_starttls_required_but_not_offered_is_deferred(server, spool):
    enqueue(spool, "42", build_message(make_summary(), "r", None, TO, FROM))
    res = flush(spool, cfg_for(server.port, **{"mail.starttls": True}), now=0.0)
    assert res["deferred"] == 1 and server.sink.messages == []
    assert "not supported" in mail.read_json(spool / "mail" / "state" / "42.json")["last_error"]


@pytest.mark.skipif(not shutil.which("openssl"), reason="needs openssl to make a certificate")
def test_starttls_checks_the_certificate(spool, tmp_path):
    """A relay with a self-signed certificate is not trusted: deferred, nothing sent in clear."""
    import ssl
    key, crt = tmp_path / "k.pem", tmp_path / "c.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                    "-out", str(crt), "-days", "1", "-subj", "/CN=127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(crt), str(key))
    sink = Sink()
    srv = Server(sink, tls_context=ctx, require_starttls=True).start()
    try:
        enqueue(spool, "42", build_message(make_summary(), "r", None, TO, FROM))
        res = flush(spool, cfg_for(srv.port, **{"mail.starttls": True}), now=0.0)
        err1 = mail.read_json(spool / "mail" / "state" / "42.json")["last_error"]
        # and without STARTTLS the relay refuses to take mail in clear (530): not sent either
        res2 = flush(spool, cfg_for(srv.port), now=1e6)
    finally:
        srv.stop()
    assert res["deferred"] == 1 and res2["sent"] == 0 and sink.messages == []
    assert "STARTTLS failed" in err1 and "CERTIFICATE_VERIFY_FAILED" in err1
    st = mail.read_json(spool / "mail" / "state" / "42.json")
    assert st["attempts"] == 2 and "530" in st["last_error"]


def test_flush_accepts_a_real_config_object(server, spool):
    cfg = parse_config(f'[mail]\nsmtp_host = "127.0.0.1"\nsmtp_port = {server.port}\n')
    enqueue(spool, "42", build_message(make_summary(), "r", None, TO, cfg["mail.from_addr"]))
    assert flush(spool, cfg)["sent"] == 1
    assert server.sink.messages[0]["from"] == "gsrun@localhost"


# ----------------------------------------------------------------------------- MailProg

def fake_mailprog(tmp_path, rc: int = 0) -> tuple[str, object]:
    out = tmp_path / "mailprog.out"
    script = tmp_path / "sendmail"
    script.write_text(f"""#!/bin/sh
printf '%s\\n' "$@" > "{out}.args"
cat >> "{out}"
exit {rc}
""")
    script.chmod(0o755)
    return str(script), out


def test_mailprog_gets_message_on_stdin_with_list_args(spool, tmp_path):
    prog, out = fake_mailprog(tmp_path)
    png = tiny_png()
    msg = build_message(make_summary(name="x; touch /tmp/pwned"), "r", png, TO, FROM)
    enqueue(spool, "42", msg)
    res = flush(spool, cfg_for(1, **{"mail.mailprog": prog}))
    assert res == {"sent": 1, "failed": 0, "deferred": 0, "busy": False}
    assert out.with_name("mailprog.out.args").read_text().split("\n")[:-1] == ["-i", "-f", FROM, "--", TO]
    rx = BytesParser(policy=policy.default).parsebytes(out.read_bytes())
    assert rx["Message-ID"] == msg["Message-ID"]
    assert rx["Subject"].startswith("[gsrun] job 42 (x; touch /tmp/pwned) COMPLETED")
    assert next(p for p in rx.walk() if p.get_content_type() == "image/png").get_content() == png
    assert queued(spool, "sent") == ["42.eml"]
    assert flush(spool, cfg_for(1, **{"mail.mailprog": prog}))["sent"] == 0
    assert out.read_bytes().count(b"\nMessage-ID: ") == 1


@pytest.mark.parametrize("rc,where", [(75, "new"), (67, "failed")])   # EX_TEMPFAIL retried, EX_NOUSER final
def test_mailprog_exit_codes(spool, tmp_path, rc, where):
    prog, _out = fake_mailprog(tmp_path, rc)
    enqueue(spool, "42", build_message(make_summary(), "r", None, TO, FROM))
    flush(spool, cfg_for(1, **{"mail.mailprog": prog}), now=0.0)
    assert queued(spool, where) == ["42.eml"]
    assert f"exit {rc}" in mail.read_json(spool / "mail" / "state" / "42.json")["last_error"]


def test_mailprog_timeout_and_missing(spool, tmp_path):
    hang = tmp_path / "hang"
    hang.write_text("#!/bin/sh\nexec sleep 30\n")
    hang.chmod(0o755)
    enqueue(spool, "42", build_message(make_summary(), "r", None, TO, FROM))
    t = time.monotonic()
    res = flush(spool, cfg_for(1, **{"mail.mailprog": str(hang), "timeouts.command_s": 0.5}), now=0.0)
    assert time.monotonic() - t < 5
    assert res["deferred"] == 1
    assert "timed out" in mail.read_json(spool / "mail" / "state" / "42.json")["last_error"]
    res = flush(spool, cfg_for(1, **{"mail.mailprog": str(tmp_path / "nonexistent")}), now=1000.0)
    assert res["deferred"] == 1
    assert "cannot run MailProg" in mail.read_json(spool / "mail" / "state" / "42.json")["last_error"]


# ----------------------------------------------------------------------------- spool safety

def test_planted_symlink_spool_is_refused(spool, tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    os.symlink(target, spool / "mail")
    with pytest.raises(NodeError) as ei:
        enqueue(spool, "42", build_message(make_summary(), "r", None, TO, FROM))
    assert "planted" in str(ei.value)
    assert list(target.iterdir()) == []


def test_missing_spool_and_bad_job_id(tmp_path, spool):
    msg = build_message(make_summary(), "r", None, TO, FROM)
    with pytest.raises(NodeError):
        enqueue(tmp_path / "nope", "42", msg)
    for bad in ("../42", "42/x", "", ".hidden", "42\n", "a" * 80):
        with pytest.raises(InputError):
            enqueue(spool, bad, msg)


def test_prune_removes_old_sent(server, spool):
    enqueue(spool, "42", build_message(make_summary(), "r", None, TO, FROM))
    flush(spool, cfg_for(server.port))
    assert mail.prune(spool, max_age_s=3600) == 0
    assert mail.prune(spool, max_age_s=3600, now=time.time() + 7200) == 1
    assert queued(spool, "sent") == []
    # once pruned the job id may be queued again
    assert enqueue(spool, "42", build_message(make_summary(), "r", None, TO, FROM)).parent.name == "new"


def test_summary_is_not_mutated():
    s = make_summary()
    before = copy.deepcopy(s)
    build_message(s, "r", tiny_png(), TO, FROM)
    assert s == before
