"""Hostile site-config values: ``gsrun-node config check`` exits non-zero
and names the key (and nothing of the value is executed); the hooks fall
back to built-in defaults instead of using a bad value."""

from __future__ import annotations

import os
import shutil

import pytest

from helpers.node_site import make_site, run_node

BAD = [
    ("paths", "state_dir", '"relative/dir"'),
    ("paths", "spool_dir", '"/var/spool/gsrun\\n/etc"'),
    ("paths", "mps_dir", '"/run/x\\u0000y"'),
    ("mail", "smtp_host", '"mail;touch /tmp/gsrun-MARK"'),
    ("mail", "smtp_host", '"$(touch /tmp/gsrun-MARK)"'),
    ("mail", "from_addr", '"a@b\\nBcc: x@y"'),
    ("mail", "mailprog", '"sendmail -t"'),
    ("mail", "smtp_port", "70000"),
    ("mail", "policy", '"sometimes"'),
    ("tuning", "defaults", '"governor=$(id)"'),
    ("tuning", "defaults", '"swappiness=10;rm -rf /"'),
    ("tuning", "allowed_keys", '["governor", "kernel.core_pattern"]'),
    ("timeouts", "command_s", "0"),
    ("timeouts", "epilog_budget_s", '"90"'),
    ("timeouts", "prolog_budget_s", "1e9"),
    ("sampler", "interval_s", "-1"),
    ("mps", "pinned_mem_limit", '"0=16G;id"'),
    ("mps", "default_active_thread_percentage", "101"),
    ("nccl", "env", '{ "NCCL DEBUG" = "x" }'),
    ("nccl", "env", '{ NCCL_DEBUG = "x\\ny" }'),
    ("mig", "layouts", '{ "a b" = "7x1g.18gb" }'),
    ("paths", "no_such_key", '"/x"'),
]


@pytest.mark.parametrize("section,key,value", BAD, ids=lambda x: str(x)[:24])
def test_config_check_names_the_bad_key(tmp_path, section, key, value):
    site = make_site()
    try:
        cfg = tmp_path / "gsrun.toml"
        cfg.write_text(f"[{section}]\n{key} = {value}\n")
        cp = run_node(["config", "check", "--file", str(cfg)], site.env())
        assert cp.returncode != 0
        assert f"{section}.{key}" in cp.stderr or key in cp.stderr, cp.stderr
        assert "Traceback" not in cp.stderr
        assert not os.path.exists("/tmp/gsrun-MARK")
    finally:
        shutil.rmtree(site.base, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="the hooks run as root")
def test_hooks_with_a_bad_config_use_defaults_and_say_so():
    site = make_site()
    try:
        good = site.config.read_text()
        site.config.write_text(good + '\n[mail]\nsmtp_host = "x;touch /tmp/gsrun-MARK"\n')
        # paths come from the env here (defaults would point at /run/gsrun)
        cp = run_node(["prolog"], site.env())
        assert cp.returncode == 0
        assert "mail.smtp_host" in cp.stderr and "using built-in defaults" in cp.stderr
        run_node(["epilog"], site.env())
        assert not os.path.exists("/tmp/gsrun-MARK")
    finally:
        shutil.rmtree(site.base, ignore_errors=True)
