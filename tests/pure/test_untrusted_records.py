"""Text users put into their jobs (names, comments, accounts) reaching root's
decisions and an admin's terminal: the idle cancel's exemption record, the
escaping of every record string on gseff's and gsrun's text output, the
prune timer among the installed units and doctor's last-prune line."""

from __future__ import annotations

import json
import os

from gsrun.base.log import escape_strings, safe_text
from gsrun.facts.slurm import EXEMPTION_FIELDS, exemption_argv, parse_exemption_record

HOSTILE = "\x1b]0;pwned\x07\x1b[2J\u202etxt.exe\u2066x\u2069\x9b31m\nJobId=1"


def test_exemption_record_reads_only_admin_fields():
    argv = exemption_argv("42")
    assert argv[:4] == ["squeue", "-h", "-j", "42"]
    assert all(f"{f}:0|" in argv[-1] for f in EXEMPTION_FIELDS)
    names = {f.split(":")[0] for f in argv[-1].split(",")}
    assert names == set(EXEMPTION_FIELDS) and not names & {"Name", "Comment", "MailUser", "WorkDir", "Command"}
    assert parse_exemption_record("42|gpu|normal|alice|lab|1|\n", "42") == {
        "partition": "gpu", "qos": "normal", "user": "alice", "account": "lab", "interactive": False}
    assert parse_exemption_record("42|gpu|normal|alice|lab|0|\n", "42")["interactive"] is True


def test_exemption_record_a_user_broke_does_not_parse():
    # an unenforced account with a separator or a newline, another job's line, junk
    for text in ("42|gpu|normal|alice|la|b|1|\n", "42|gpu|normal|alice|la\nb|1|\n", "43|gpu|normal|alice|lab|1|\n",
                 "42|gpu-exempt|normal|alice|lab|1|\n42|gpu|normal|alice|lab|1|\n", "42|gpu|normal|alice|lab|2|\n",
                 "", "42|gpu|normal|alice|lab|1|x\n"):
        assert parse_exemption_record(text, "42") is None, text


def test_record_strings_reach_a_terminal_escaped():
    out = safe_text(HOSTILE)
    assert out.isprintable() and "\x1b" not in out and "\u202e" not in out and "\x9b" not in out
    assert "\\x1b" in out and "\\u202e" in out and "\\u2066" in out and "\\n" in out
    tree = escape_strings({"job": {"name": HOSTILE, "nodes": [HOSTILE], "n": 3}, HOSTILE: None})
    assert all(s.isprintable() for s in json.dumps(tree, ensure_ascii=False).split("\n"))
    assert tree["job"]["n"] == 3


def test_gseff_text_report_escapes_every_record_string(tmp_path):
    from types import SimpleNamespace

    from gsrun.request.config import Config, SETTINGS
    from gsrun.wrapper.gseff import load_summary, render_accounting, report_text
    from helpers.paths import REPO

    cfg = Config({s.key: s.default for s in SETTINGS})
    s = json.loads((REPO / "tests/data/golden/summaries/job-1gpu.json").read_text())
    s["job"]["name"] = HOSTILE
    s["job"]["partition"] = HOSTILE
    s.setdefault("notes", []).append(HOSTILE)
    (tmp_path / "summary.json").write_text(json.dumps(s))
    paths = SimpleNamespace(spool_job=lambda _job_id: tmp_path)
    assert load_summary(paths, "1", cfg).job.name == HOSTILE        # as stored (gseff --json)
    text = report_text(load_summary(paths, "1", cfg, escape=True), cfg, color=False)
    bad = [c for c in text if c != "\n" and not c.isprintable()]
    assert not bad and "\u202e" not in text, bad
    assert "\\x1b]0;pwned" in text
    rec = {"job_id": "1", "efficiency": {"state": HOSTILE, "elapsed_s": 1, "nodes": HOSTILE, "alloc_cpus": 1,
                                         "alloc_gpus": 1, "cpu_time_s": 1, "cpu_eff_pct": 1.0,
                                         "cpu_time_source": HOSTILE, "mem_peak_bytes": 1, "mem_req_bytes": 1,
                                         "mem_eff_pct": 1.0, "mem_peak_source": "", "notes": [HOSTILE]},
           "gpu": {"gpus": [{"node": HOSTILE, "index": "0", "util_pct": 1.0, "mem_used_bytes": 1,
                             "mem_total_bytes": 2}], "util_mean_pct": 1.0, "mem_mean_pct": 50.0},
           "js1_error": None}
    text = render_accounting(rec)
    assert not [c for c in text if c != "\n" and not c.isprintable()]


def test_gsrun_status_line_escapes_the_reason():
    from gsrun.wrapper.submit import JobState, status_line

    line = status_line("5", JobState("PENDING", "", 0, 0, None, "", HOSTILE), 3.0)
    assert line.isprintable() and "\x1b" not in line


def test_install_writes_the_prune_timer_with_the_mail_timer():
    from gsrun.admin import install

    units = install.render_units("/opt/gsrun/venv/bin/gsrun-node", None)
    assert "ExecStart=/opt/gsrun/venv/bin/gsrun-node prune" in units["gsrun-prune.service"]
    assert "OnCalendar=daily" in units["gsrun-prune.timer"] and "WantedBy=timers.target" in units["gsrun-prune.timer"]


def test_prune_records_its_run_for_doctor(tmp_path):
    from gsrun.report import retention

    assert retention.last_run(tmp_path) is None
    retention.record_run(tmp_path, [{"job": "1", "action": "remove", "result": "removed"},
                                    {"job": "2", "action": "keep"}], 3, 180.0, now=1000.0)
    last = retention.last_run(tmp_path)
    assert (last["time"], last["removed"], last["kept"], last["mails_removed"]) == (1000.0, 1, 1, 3)
    os.chmod(tmp_path / retention.LAST_RUN, 0o666)       # writable by others: not trusted
    assert retention.last_run(tmp_path) is None


def test_spool_reads_are_bounded_and_trust_only_roots_files(tmp_path):
    from gsrun.base.fsutil import read_spool_json

    p = tmp_path / "user-live-n2.json"
    p.write_text('{"a": 1}')
    os.chmod(p, 0o440)
    assert read_spool_json(p) == {"a": 1}
    assert read_spool_json(p, max_bytes=4) is None                    # over the cap: refused after fstat
    os.chmod(p, 0o460)
    assert read_spool_json(p) is None                                 # group-writable: the job's group could write it
    os.chmod(p, 0o440)
    (tmp_path / "link.json").symlink_to(p)
    assert read_spool_json(tmp_path / "link.json") is None            # never followed
    os.mkfifo(tmp_path / "fifo.json")
    assert read_spool_json(tmp_path / "fifo.json") is None            # never blocked on
