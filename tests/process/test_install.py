"""gsrun-node install: version detection, slurm.conf lines, timeout
recommendation, directories, the never-overwrite config, the thin hooks."""

import os
import sys
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from gsrun.admin import install
from gsrun.request.config import DEFAULT_CONFIG_PATH, parse_config, render_commented_config
from gsrun.base.errors import InputError

REPO = Path(__file__).resolve().parents[2]
DEFAULTS = parse_config("")


class FakeRun:
    """subprocess.run stand-in: answers by argv[0]."""

    def __init__(self, answers):
        self.answers = answers
        self.calls = []

    def __call__(self, argv, **kw):
        self.calls.append((list(argv), kw))
        assert "timeout" in kw and kw["timeout"] > 0
        a = self.answers.get(argv[0])
        if a is None:
            raise FileNotFoundError(argv[0])
        if a == "timeout":
            raise subprocess.TimeoutExpired(argv, kw["timeout"])
        rc, out = a
        return subprocess.CompletedProcess(argv, rc, out, "")


@pytest.mark.parametrize("text,want", [
    ("slurm-wlm 22.05.8\n", "22.05.8"), ("slurm 24.11.1", "24.11.1"), ("slurm 23.02.7-1", "23.02.7"),
    ("sinfo: error: fetch_config: DNS SRV lookup failed", None), ("", None)])
def test_parse_slurm_version(text, want):
    assert install.parse_slurm_version(text) == want


def test_detect_slurm_version_tries_commands_in_order_with_timeouts():
    run = FakeRun({"slurmd": "timeout", "scontrol": (0, "slurm 24.11.1\n")})
    v = install.detect_slurm_version(timeout_s=2.0, run=run)
    assert v == install.SlurmVersion("24.11.1", "scontrol -V")
    assert [c[0][0] for c in run.calls] == ["slurmctld", "slurmd", "scontrol"]
    assert all(c[1]["timeout"] == 2.0 for c in run.calls)
    assert install.detect_slurm_version(run=FakeRun({"sinfo": (1, "sinfo: fatal: no config")})) is None


def test_parse_slurm_conf():
    conf = install.parse_slurm_conf(
        "# c\nProctrackType=proctrack/cgroup  # x\nPrologFlags=X11\n"
        "NodeName=gpu01 CPUs=4\nprolog=/etc/slurm/prolog.d/*\nPrologFlags=Alloc\n")
    assert conf == {"proctracktype": "proctrack/cgroup", "prologflags": "X11", "prolog": "/etc/slurm/prolog.d/*"}


@pytest.mark.parametrize("existing,proctrack,want", [
    (None, None, "Alloc"), ("", "proctrack/linuxproc", "Alloc"), ("None", None, "Alloc"),
    (None, "proctrack/cgroup", "Alloc,Contain"), ("X11", "proctrack/cgroup", "X11,Alloc,Contain"),
    ("Alloc", None, "Alloc"), ("Contain,Alloc", "proctrack/cgroup", "Contain,Alloc"),
    ("alloc,Serial", None, "alloc,Serial")])
def test_prolog_flags(existing, proctrack, want):
    flags, why = install.prolog_flags(existing, proctrack)
    assert flags == want
    assert "before the batch script" in why
    assert ("Contain because" in why) == ("Contain" in want and "Contain" not in (existing or ""))


def test_recommend_timeout():
    t, why = install.recommend_timeout_s(install.HookCost(0.4, 0.3, 3), DEFAULTS)
    assert t == 120   # epilog budget 90 + 30
    assert "0.40 s" in why and "epilog budget" in why
    t, why = install.recommend_timeout_s(install.HookCost(15.04, 2.0, 3), DEFAULTS)
    assert t == 160   # 10 x 15.04 = 150.4 -> 160
    assert "10 x measured" in why
    small = parse_config("[timeouts]\nprolog_budget_s = 10\nepilog_budget_s = 10\n")
    assert install.recommend_timeout_s(install.HookCost(0.1, 0.1, 3), small)[0] == 60
    t, why = install.recommend_timeout_s(install.HookCost(None, None, 0, "skipped"), DEFAULTS, current="60")
    assert t == 120 and "not measured (skipped)" in why and "current 60 s is too short" in why


def test_measure_hook_cost_with_fake_runs():
    ticks = iter([0.0, 0.5, 1.0, 1.8, 2.0, 2.4, 3.0, 3.25])
    run = FakeRun({"/py": (0, "{}")})
    cost = install.measure_hook_cost("/etc/x.toml", runs=3, python="/py", run=run, clock=lambda: next(ticks))
    assert cost == install.HookCost(0.8, 0.25, 3)
    argv, kw = run.calls[0]
    assert argv == ["/py", "-P", "-s", "-m", "gsrun.admin.node", "prolog", "--dry-run"]
    assert kw["cwd"] == "/" and all(c[1]["cwd"] == "/" for c in run.calls)   # never the admin's directory
    assert run.calls[-1][0][:4] == ["/py", "-P", "-s", "-c"]
    assert kw["env"]["GSRUN_CONFIG"] == "/etc/x.toml" and kw["env"]["SLURM_JOB_ID"] == "0"
    assert kw["env"]["SPANK_GS_REPORT"] == "1"   # no scontrol call from the dry run
    assert "GSRUN_LOG_FILE" not in kw["env"]
    bad = install.measure_hook_cost(None, python="/py", run=FakeRun({"/py": (2, "gsrun: boom\n")}),
                                    clock=lambda: 0.0)
    assert bad.prolog_s is None and "exited 2" in bad.error and bad.worst_s is None
    slow = install.measure_hook_cost(None, python="/py", run=FakeRun({"/py": "timeout"}), clock=lambda: 0.0)
    assert "longer than" in slow.error


def test_plan_and_apply_dirs(tmp_path):
    cfg = parse_config(f'[paths]\nstate_dir = "{tmp_path}/run/gsrun"\nspool_dir = "{tmp_path}/spool/gsrun"\n'
                       f'mps_dir = "{tmp_path}/run/gsrun/mps"\n')
    plan = install.plan_dirs(cfg)
    want = {f"{tmp_path}/run/gsrun": 0o755, f"{tmp_path}/run/gsrun/jobs": 0o700,
            f"{tmp_path}/spool/gsrun": 0o755, f"{tmp_path}/spool/gsrun/jobs": 0o711,
            f"{tmp_path}/spool/gsrun/mail": 0o700, f"{tmp_path}/run/gsrun/mps": 0o711}
    assert {d.path: d.mode for d in plan} == want
    lines = install.apply_dirs(plan)
    assert all(line.startswith("created") for line in lines)
    for p, mode in want.items():
        assert stat.S_IMODE(os.stat(p).st_mode) == mode, p
    os.chmod(f"{tmp_path}/spool/gsrun/jobs", 0o777)
    lines = install.apply_dirs(plan)
    assert all(line.startswith("ok") for line in lines)
    assert stat.S_IMODE(os.stat(f"{tmp_path}/spool/gsrun/jobs").st_mode) == 0o711


def test_apply_dirs_refuses_planted_symlink(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "spool").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(Exception, match="not a plain directory"):
        install.apply_dirs([install.DirSpec(str(tmp_path / "spool"), 0o755, "x")])


def test_write_new_file_never_overwrites(tmp_path):
    p = tmp_path / "etc" / "gsrun" / "gsrun.toml"
    assert install.write_new_file(str(p), "one\n", 0o644) is True
    assert stat.S_IMODE(p.stat().st_mode) == 0o644
    assert install.write_new_file(str(p), "two\n", 0o644) is False
    assert p.read_text() == "one\n"
    link = tmp_path / "link.toml"
    link.symlink_to(tmp_path / "target.toml")
    assert install.write_new_file(str(link), "x", 0o644) is False
    assert not (tmp_path / "target.toml").exists()


HOOKS = {"prolog": "/opt/gsrun/venv/lib/python3.11/site-packages/gsrun/prolog/gsrun-prolog",
         "epilog": "/opt/gsrun/venv/lib/python3.11/site-packages/gsrun/epilog/gsrun-epilog",
         "epilog-ctld": "/opt/gsrun/venv/lib/python3.11/site-packages/gsrun/epilog/gsrun-epilog-ctld"}


def test_render_slurm_lines_single():
    text = install.render_slurm_lines("22.05.8", HOOKS, "Alloc", "why", 120, "because")
    lines = [x for x in text.splitlines() if x and not x.startswith("#")]
    assert lines == ["PrologFlags=Alloc", f"Prolog={HOOKS['prolog']}", f"Epilog={HOOKS['epilog']}",
                     f"EpilogSlurmctld={HOOKS['epilog-ctld']}", "PrologEpilogTimeout=120"]
    assert "Slurm 22.05.8" in text and "# PrologFlags: why" in text


def test_render_slurm_lines_prolog_d():
    text = install.render_slurm_lines("24.11.1", HOOKS, "Alloc,Contain", "why", 150, "because",
                                      layout="prolog.d", prolog_d="/etc/slurm/prolog.d/", epilog_d="/etc/slurm/epilog.d")
    lines = [x for x in text.splitlines() if x and not x.startswith("#")]
    assert "Prolog=/etc/slurm/prolog.d/*" in lines and "Epilog=/etc/slurm/epilog.d/*" in lines
    assert f"EpilogSlurmctld={HOOKS['epilog-ctld']}" in lines
    assert f"#   ln -sfn {HOOKS['prolog']} /etc/slurm/prolog.d/50-gsrun" in text
    with pytest.raises(InputError, match="layout"):
        install.render_slurm_lines("1", HOOKS, "Alloc", "", 1, "", layout="both")
    with pytest.raises(InputError, match="prolog hook path"):
        install.render_slurm_lines("1", dict(HOOKS, prolog="/opt/my gsrun/x"), "Alloc", "", 1, "")


def test_render_units():
    u = install.render_units("/opt/gsrun/venv/bin/gsrun-node", DEFAULT_CONFIG_PATH)
    assert "ExecStart=/opt/gsrun/venv/bin/gsrun-node mail flush" in u["gsrun-mail.service"]
    assert "GSRUN_CONFIG" not in u["gsrun-mail.service"]
    assert "OnUnitActiveSec=1min" in u["gsrun-mail.timer"] and "WantedBy=timers.target" in u["gsrun-mail.timer"]
    u = install.render_units("/opt/gsrun/venv/bin/gsrun-node", "/srv/gsrun.toml")
    assert "Environment=GSRUN_CONFIG=/srv/gsrun.toml" in u["gsrun-mail.service"]


def _fake_node(bindir: Path) -> Path:
    bindir.mkdir(parents=True, exist_ok=True)
    node = bindir / "gsrun-node"
    node.write_text('#!/bin/sh\necho "ran $0 $* config=${GSRUN_CONFIG:-unset}"\n')
    node.chmod(0o755)
    return node


def test_render_hook_runs_the_baked_gsrun_node(tmp_path):
    node = _fake_node(tmp_path / "my venv" / "bin")
    hook = tmp_path / "gsrun-prolog"
    hook.write_text(install.render_hook(str(node), "prolog", "/srv/it's.toml"))
    hook.chmod(0o755)
    out = subprocess.run([str(hook)], capture_output=True, text=True, timeout=10, env={}).stdout
    assert out == f"ran {node} prolog config=/srv/it's.toml\n"
    assert "GSRUN_CONFIG" not in install.render_hook(str(node), "epilog", DEFAULT_CONFIG_PATH)
    with pytest.raises(InputError):
        install.render_hook(str(node), "rm -rf", None)


def _opts(tmp_path, **kw):
    base = dict(config_path=str(tmp_path / "etc" / "gsrun.toml"), state_dir=str(tmp_path / "state"),
                spool_dir=str(tmp_path / "spool"), hooks_dir=str(tmp_path / "hooks"), measure=False,
                irqbalance_script=str(tmp_path / "libexec" / "gsrun-irqbalance-policy"))
    base.update(kw)
    return install.InstallOptions(**base)


def test_run_print_changes_nothing(tmp_path):
    out = []
    rc = install.run(_opts(tmp_path, print_only=True), out=out.append, environ={"SLURM_CONF": "/nonexistent"})
    text = "\n".join(out)
    assert rc == 0
    assert list(tmp_path.iterdir()) == []
    assert f"would create {tmp_path}/spool/jobs root 0711" in text
    assert f"would write {tmp_path}/etc/gsrun.toml" in text
    assert install.config_text(str(tmp_path / "state"), str(tmp_path / "spool")) in text
    assert f"Prolog={tmp_path}/hooks/gsrun-prolog" in text
    assert f"exec {shutil.which('gsrun-node') or ''}" in text or "gsrun-node prolog" in text
    assert "PrologFlags=Alloc" in text and "PrologEpilogTimeout=120" in text
    assert "spank install" in text and "gsrun-mail.timer" in text


def test_run_installs_and_never_overwrites_the_config(tmp_path):
    out = []
    opts = _opts(tmp_path, units_dir=str(tmp_path / "units"))
    assert install.run(opts, out=out.append, environ={}) == 0
    cfgp = tmp_path / "etc" / "gsrun.toml"
    cfg = parse_config(cfgp.read_text())
    assert cfg["paths.state_dir"] == str(tmp_path / "state") and cfg["paths.spool_dir"] == str(tmp_path / "spool")
    assert cfg["paths.mps_dir"] == str(tmp_path / "state" / "mps")
    assert stat.S_IMODE(os.stat(tmp_path / "state" / "mps").st_mode) == 0o711
    assert stat.S_IMODE(os.stat(tmp_path / "state" / "jobs").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "spool" / "jobs").st_mode) == 0o711
    hook = (tmp_path / "hooks" / "gsrun-epilog-ctld").read_text()
    assert f"GSRUN_CONFIG={cfgp}" in hook and hook.rstrip().endswith("epilog-ctld")
    # every hook goes through the daemon's client, built beside them, on the state dir's socket
    client = tmp_path / "hooks" / "gsrun-hook"
    assert os.access(client, os.X_OK)
    assert f"exec {client} {tmp_path}/state/daemon.sock " in hook
    assert (tmp_path / "units" / "gsrun-mail.timer").exists()
    unit = (tmp_path / "units" / "gsrun-daemon.service").read_text()
    assert f"daemon run --socket {tmp_path}/state/daemon.sock" in unit
    assert all(k in unit.splitlines() for k in ("Restart=always", "MemoryMax=512M", "TasksMax=512"))
    cfgp.write_text("[sampler]\ninterval_s = 2.0\n")
    out2 = []
    assert install.run(opts, out=out2.append, environ={}) == 0
    assert cfgp.read_text() == "[sampler]\ninterval_s = 2.0\n"
    assert any("exists: left as it is" in line for line in out2)
    assert any("exists, left as it is" in line for line in out2)
    out3 = []
    install.run(_opts(tmp_path, spool_dir=str(tmp_path / "other")), out=out3.append, environ={})
    assert any("--spool-dir" in line and "differs" in line for line in out3)


def test_config_text():
    assert install.config_text() == render_commented_config()
    cfg = parse_config(install.config_text("/srv/state", "/srv/spool"))
    assert (cfg["paths.state_dir"], cfg["paths.mps_dir"], cfg["paths.spool_dir"]) == \
        ("/srv/state", "/srv/state/mps", "/srv/spool")
    assert cfg["sampler.interval_s"] == 5.0


def test_hook_with_log_file(tmp_path):
    node = _fake_node(tmp_path / "bin")
    body = install.render_hook(str(node), "epilog", None, "/var/log/gsrun.log")
    assert "GSRUN_LOG_FILE=/var/log/gsrun.log exec" in body
    with pytest.raises(InputError):
        install.render_hook(str(node), "epilog", None, "/var/log/$(reboot)")
    assert "SLURM_CONF=/srv/slurm.conf GSRUN" not in body
    body = install.render_hook(str(node), "epilog-ctld", None, None, "/srv/slurm.conf")
    assert f"SLURM_CONF=/srv/slurm.conf exec {node} epilog-ctld" in body
    assert "SLURM_CONF" not in install.render_hook(str(node), "epilog-ctld", None, None, "/etc/slurm/slurm.conf")


def test_default_hooks_dir_is_the_installations_libexec(tmp_path):
    out = []
    opts = _opts(tmp_path, hooks_dir=None, print_only=True)
    install.run(opts, out=out.append, environ={})
    text = "\n".join(out)
    inst = install.find_installation()
    want = str(Path(inst.gsrun_node).parent.parent / "libexec" / "gsrun")
    assert f"would build {want}/gsrun-hook" in text and f"Prolog={want}/gsrun-prolog" in text


def test_run_notes_an_existing_prolog(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("Prolog=/etc/slurm/site-prolog\nProctrackType=proctrack/cgroup\nPrologFlags=X11\n")
    out = []
    install.run(_opts(tmp_path, print_only=True), out=out.append, environ={"SLURM_CONF": str(conf)})
    text = "\n".join(out)
    assert "already have Prolog=/etc/slurm/site-prolog" in text
    assert "PrologFlags=X11,Alloc,Contain" in text


def test_run_rejects_unquotable_paths(tmp_path):
    with pytest.raises(InputError):
        install.run(_opts(tmp_path, config_path=str(tmp_path / "my config.toml"), print_only=True), out=print,
                    environ={})


def test_run_installs_the_irqbalance_policy_script_and_prints_the_option(tmp_path):
    out = []
    assert install.run(_opts(tmp_path), out=out.append, environ={}) == 0
    script = tmp_path / "libexec" / "gsrun-irqbalance-policy"
    assert script.read_text() == (REPO / "templates" / "irqbalance-policy.sh").read_text()
    assert stat.S_IMODE(script.stat().st_mode) == 0o755
    if os.geteuid() == 0:
        assert script.stat().st_uid == 0
    text = "\n".join(out)
    assert f"wrote {script} (0755)" in text
    assert f"#   Environment=IRQBALANCE_ARGS=--policyscript={script}" in text
    assert f'tuning.irqbalance_policy_script = "{script}"' in text      # not the configured path: say so
    assert "GSRUN_IRQ_BAN_DIR" not in text                                # the default ban dir
    assert install.render_irqbalance_lines("/s", "/run/b", "/run/gsrun/irqbalance-ban").count(
        "Environment=GSRUN_IRQ_BAN_DIR=/run/b") == 1


def _fake_venv_python(venv):
    """<venv>/bin/python3.11 that prints its argv, and a pyvenv.cfg."""
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    py = venv / "bin" / "python3.11"
    py.write_text('#!/bin/sh\nfor a in "$0" "$@"; do printf "%s\\n" "$a"; done\n')
    py.chmod(0o755)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = false\n")
    return py


def test_render_hook_with_the_interpreter_argv(tmp_path):
    from gsrun.admin.node_entry import HOOK_BOOTSTRAP

    py = _fake_venv_python(tmp_path / "venv")
    argv = [str(py), "-I", "-S", "-c", HOOK_BOOTSTRAP, "/opt/v/lib/python3.11/site-packages", "epilog"]
    hook = tmp_path / "gsrun-epilog"
    hook.write_text(install.render_hook("/opt/v/bin/gsrun-node", "epilog", "/srv/g.toml", argv=argv))
    hook.chmod(0o755)
    out = subprocess.run([str(hook)], capture_output=True, text=True, timeout=10, env={})
    assert out.stdout.splitlines() == argv
    with pytest.raises(InputError):
        install.render_hook("/opt/v/bin/gsrun-node", "prolog", None, argv=argv)      # argv for another hook


def test_hook_argv_only_for_a_venv_that_holds_gsrun():
    from gsrun.admin.node_entry import hook_argv

    # this test run's gsrun: an editable checkout (no gsrun/prolog/ folder beside gsrun/) or an install
    import gsrun

    site_dir = os.path.dirname(os.path.dirname(os.path.abspath(gsrun.__file__)))
    a = hook_argv("prolog")
    if os.path.isfile(os.path.join(site_dir, "gsrun", "prolog", "main.py")) and \
            os.path.isfile(os.path.join(sys.prefix, "pyvenv.cfg")):
        assert a[-2:] == [site_dir, "prolog"] and a[1:4] == ["-I", "-S", "-c"]
    else:
        assert a is None


def test_a_hook_started_without_site_still_sees_paths_added_by_pth_files(tmp_path):
    """-I -S skips .pth files; a venv that sees another Python's packages through one
    (tests/gpu/install-venv) must still find them from a hook; setuptools'
    distutils-precedence.pth alone is no reason to run site."""
    sp = tmp_path / "site-packages"
    other = tmp_path / "parent-site"
    (other / "parentmod").mkdir(parents=True)
    (other / "parentmod" / "__init__.py").write_text("X = 42\n")
    sp.mkdir()
    (sp / "parent.pth").write_text(f"{other}\n")   # what tests/gpu/install-venv writes
    (sp / "distutils-precedence.pth").write_text("import os; os.environ['PTH_RAN'] = '1'\n")
    (sp / "gsrun" / "admin").mkdir(parents=True)
    for init in (sp / "gsrun" / "__init__.py", sp / "gsrun" / "admin" / "__init__.py"):
        init.write_text("")
    shutil.copy2(REPO / "admin" / "node_entry.py", sp / "gsrun" / "admin" / "node_entry.py")  # os, sys only
    boot = "import sys; sys.path.append(sys.argv.pop(1)); "
    code = ("from gsrun.admin.node_entry import _site_when_needed\n_site_when_needed()\n"
            "import os, parentmod; print(parentmod.X, os.environ.get('PTH_RAN'))")

    def run(first=False):     # first: the bootstrap of hooks written by older releases
        # the base interpreter: a venv made --system-site-packages (a release root's) runs site
        # itself, the other branch of _site_when_needed
        return subprocess.run([getattr(sys, "_base_executable", sys.executable), "-I", "-S", "-c",
                               (boot.replace("sys.path.append(sys.argv.pop(1))", "sys.path[:0] = [sys.argv.pop(1)]")
                                if first else boot) + code, str(sp)], capture_output=True, text=True, timeout=30)

    for first in (False, True):
        out = run(first)
        assert out.stdout.split() == ["42", "1"], out.stderr     # the .pth files processed (both)
    (sp / "parent.pth").unlink()
    out = run()
    assert "No module named 'parentmod'" in out.stderr and "PTH_RAN" not in out.stdout


def test_the_hook_bootstrap_keeps_the_standard_library_ahead_of_site_packages(tmp_path):
    """With site, a venv's site-packages comes after the standard library; a module there
    named like a standard one (enum34's enum/, the pathlib 1.0 backport: old packages still
    pull them in, harmless on a normal start) must not replace it in a hook started -I -S,
    where a failed import fails the prolog and drains the node."""
    from gsrun.admin.node_entry import HOOK_BOOTSTRAP

    sp = tmp_path / "site-packages"
    (sp / "gsrun" / "admin").mkdir(parents=True)
    (sp / "gsrun" / "__init__.py").write_text("")
    (sp / "gsrun" / "admin" / "__init__.py").write_text("")
    (sp / "gsrun" / "admin" / "node_entry.py").write_text(
        "def main():\n    import enum, sys\n    print(enum.__file__)\n    print(sys.argv[1:])\n")
    (sp / "enum").mkdir()
    (sp / "enum" / "__init__.py").write_text("raise ImportError('enum34 on Python 3')\n")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", HOOK_BOOTSTRAP, str(sp), "prolog"],
                         capture_output=True, text=True, timeout=30, cwd="/")
    assert out.returncode == 0, out.stderr
    enum_file, argv = out.stdout.splitlines()
    assert not enum_file.startswith(str(sp)) and argv == "['prolog']"


def test_hook_command_is_hook_argv_quoted_else_gsrun_node(monkeypatch):
    """What tests/cluster/up and tests/gpu/cluster/up write into their hooks."""
    from gsrun.admin import node_entry

    monkeypatch.setattr(node_entry, "hook_argv", lambda c: ["/v/bin/python3", "-I", "-S", "-c", "import sys; x()",
                                                           "/v/site packages", c])
    assert node_entry.hook_command("epilog", "/v/bin/gsrun-node") == \
        "/v/bin/python3 -I -S -c 'import sys; x()' '/v/site packages' epilog"
    monkeypatch.setattr(node_entry, "hook_argv", lambda c: None)      # an editable install
    assert node_entry.hook_command("epilog-ctld", "/v/bin/gsrun-node") == "/v/bin/gsrun-node epilog-ctld"


def test_run_without_units_dir_names_the_units_in_one_line(tmp_path):
    """Outside --print the units' text is not printed (it was most of a 378-line output):
    one line names them and how to write or see them; the whole run stays short."""
    out = []
    assert install.run(_opts(tmp_path, measure=False), out=out.append, environ={}) == 0
    text = "\n".join(out)
    (line,) = [ln for ln in text.splitlines() if ln.startswith("# not written: ")]
    assert line.startswith("# not written: gsrun-mail.service, gsrun-mail.timer, gsrun-prune.service, "
                           "gsrun-prune.timer, gsrun-report.service, gsrun-report.timer")
    assert line.endswith("; --units-dir /etc/systemd/system writes them, --print shows them")
    assert "[Unit]" not in text and "[Timer]" not in text
    assert len(text.splitlines()) < 120, len(text.splitlines())


def test_epilog_slurmctld_of_a_slurmuser_goes_to_the_root_daemons_controller_door(tmp_path):
    """slurmctld runs EpilogSlurmctld as SlurmUser, whose merge must read and write the
    root-owned spool: with SlurmUser=slurm, the one root daemon opens ctld.sock to slurm
    (--ctld-user) and the EpilogSlurmctld hook goes there; with root (the default), to
    the daemon's own socket."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=t\nSlurmUser=slurm\n")
    out = []
    assert install.run(_opts(tmp_path, units_dir=str(tmp_path / "units")), out=out.append,
                       environ={"SLURM_CONF": str(conf)}) == 0
    ctld = (tmp_path / "hooks" / "gsrun-epilog-ctld").read_text()
    assert f"exec {tmp_path}/hooks/gsrun-hook {tmp_path}/state/ctld.sock " in ctld
    assert f"{tmp_path}/state/daemon.sock " in (tmp_path / "hooks" / "gsrun-prolog").read_text()
    assert sorted(p.name for p in (tmp_path / "units").glob("gsrun-daemon*")) == ["gsrun-daemon.service"]
    unit = (tmp_path / "units" / "gsrun-daemon.service").read_text().splitlines()
    assert not any(l.startswith("User=") for l in unit)
    assert any(l.endswith(f"daemon run --socket {tmp_path}/state/daemon.sock --ctld-user slurm") for l in unit)
    assert any("systemctl enable --now gsrun-mail.timer gsrun-prune.timer" in l for l in out), out
    assert install.ctld_daemon({"slurmuser": "slurm"}, "/run/gsrun/daemon.sock") == ("slurm", "/run/gsrun/ctld.sock")
    assert install.ctld_daemon({}, "/run/gsrun/daemon.sock") == (None, "/run/gsrun/daemon.sock")
    assert install.ctld_daemon({"slurmuser": "root"}, "/x.sock") == (None, "/x.sock")
    with pytest.raises(InputError):
        install.ctld_daemon({"slurmuser": "slurm;reboot"}, "/x.sock")


def test_the_measured_prolog_dry_run_does_not_wait_for_a_node_monitor(tmp_path):
    """install times its prolog dry runs before the node daemon runs (step 4): the dry
    run does not wait the 15 s a hook gives a restarting monitor, so neither install's
    time nor the PrologEpilogTimeout it derives carries that wait."""
    from helpers.node_site import make_site

    site = make_site()
    try:
        cost = install.measure_hook_cost(str(site.config), runs=1, timeout_s=60)
        assert cost.error is None, cost.error
        assert cost.prolog_s < 5.0, cost
        assert not (site.state / "monitor.sock").exists()
    finally:
        shutil.rmtree(site.base, ignore_errors=True)
