"""gsrun-report's digests through the mail spool to a real SMTP server (aiosmtpd on
127.0.0.1): one mail per user per window, never the same job twice, rate limit, dry run."""

from __future__ import annotations

from datetime import datetime, timezone
from email import policy
from email.parser import BytesParser
from pathlib import Path

import pytest

from gsrun.report import fleet_mail
from gsrun.report.fleet_render import Scope
from gsrun.request.config import parse_config
from gsrun.wrapper.gsreport import run_report

aiosmtpd_controller = pytest.importorskip("aiosmtpd.controller")
pytestmark = pytest.mark.usefixtures("utc_tz")      # sacct's local times read as UTC
DATA = Path(__file__).resolve().parents[1] / "data"
START, END = (datetime(2024, 4, 30, tzinfo=timezone.utc).timestamp(),
              datetime(2024, 5, 1, tzinfo=timezone.utc).timestamp())


class Sink:
    def __init__(self):
        self.messages = []

    async def handle_DATA(self, server, session, envelope):
        self.messages.append(envelope)
        return "250 OK"


def _cfg(port):
    return parse_config(f'[mail]\nsmtp_host = "127.0.0.1"\nsmtp_port = {port}\nfrom_addr = "gsrun@example.org"\n'
                        'default_domain = "example.org"\n[report]\ndoc_url = "https://example.org/gpu-help"\n')


def _run(cfg, spool, lines, scope):
    state = fleet_mail.read_state(spool)
    rep = run_report(scope, cfg, lines_of=lambda argv: iter(lines), shares={}, digests=True,
                     digest_after=fleet_mail.digest_after(state))
    return fleet_mail.plan_digests(rep.digests(), scope, cfg, state, scope.end_s + 60)


def test_digest_once_per_user_and_window(tmp_path):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sink = Sink()
    ctl = aiosmtpd_controller.Controller(sink, hostname="127.0.0.1", port=port)
    ctl.start()
    try:
        cfg = _cfg(port)
        spool = tmp_path / "spool"
        spool.mkdir()
        lines = (DATA / "sacct" / "report_2411.txt").read_text().splitlines(True)
        scope = Scope(START, END)
        out, skipped = _run(cfg, spool, lines, scope)
        assert sorted(o.user for o in out) == ["alice", "bob", "dave"]   # dave: 10 min of a 1 h limit
        dry = fleet_mail.dry_run_text(out, skipped)
        assert "would send digest.bob." in dry and "bob@example.org" in dry and not sink.messages
        res = fleet_mail.send(out, cfg, spool, now=END + 60)
        assert res["queued"] == 3 and res["sent"] == 3
        assert sorted(m.rcpt_tos[0] for m in sink.messages) == ["alice@example.org", "bob@example.org", "dave@example.org"]
        bob = next(m for m in sink.messages if m.rcpt_tos == ["bob@example.org"])
        text = BytesParser(policy=policy.default).parsebytes(bob.original_content).get_body(("plain",)).get_content()
        assert "4102" in text and "GPUs left idle" in text and "https://example.org/gpu-help" in text
        # the same window again: no job twice, no second mail
        out2, skipped2 = _run(cfg, spool, lines, scope)
        assert out2 == []
        # a later window with the same jobs (sacct answering them again): still nothing new
        out3, _ = _run(cfg, spool, lines, Scope(START, END + 86400 * 7))
        assert out3 == []
    finally:
        ctl.stop()


def test_rate_limit_and_outage_keeps_mail(tmp_path):
    cfg = _cfg(1)          # nothing listens on port 1: an outage
    spool = tmp_path / "spool"
    spool.mkdir()
    lines = (DATA / "sacct" / "report_2411.txt").read_text().splitlines(True)
    out, _ = _run(cfg, spool, lines, Scope(START, END))
    res = fleet_mail.send(out, cfg, spool, now=END + 60)
    assert res["sent"] == 0 and res["deferred"] == 3
    assert len(list((spool / "mail" / "new").glob("digest.*.eml"))) == 3      # kept for the mail timer
    state = fleet_mail.read_state(spool)
    out2, skipped = fleet_mail.plan_digests([], Scope(START, END), cfg, state, END + 120)
    assert out2 == [] and skipped == []
