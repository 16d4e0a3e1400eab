"""spank_py/hooks.py against a fake ``_spank`` module (pure tier).

The fake records what the hooks ask of Slurm (job control env, log lines), so
each test checks the values that would reach the prolog. A step's plan
(:func:`step_actions`, :func:`format_actions`: what the node daemon answers
slurmstepd with) is checked as text; the plugin applies it in C
(tests/process/test_spank_build.py).
"""

import os
import sys
import types

import pytest

from gsrun.spank_py import hooks
from helpers.paths import DATA
from helpers.tuning_tree import TARBALL


class FakeSpank(types.ModuleType):
    class SpankError(OSError):
        pass

    def __init__(self, ctx="allocator", options=None, job_control_fails=False):
        super().__init__("_spank")
        self.ctx = ctx
        self.options = dict(options or {})
        self.job_control = {}
        self.logs = []
        self.job_control_fails = job_control_fails

    def context(self):
        return self.ctx

    def option_getopt(self, name):
        assert name in {o[0] for o in hooks.OPTIONS}, name
        return self.options.get(name)

    def job_control_setenv(self, name, value, overwrite=True):
        if self.job_control_fails:
            raise self.SpankError(8, "Not in local context")
        self.job_control[name] = value

    def log(self, level, msg):
        self.logs.append((level, msg))


@pytest.fixture
def fake(monkeypatch):
    def make(**kw):
        m = FakeSpank(**kw)
        monkeypatch.setitem(sys.modules, "_spank", m)
        return m
    yield make


ARGS = {"pythonpath": [], "on_error": None}


# ------------------------------------------------------------ option table

def test_option_table_shape():
    table = hooks.OPTIONS                      # compiled into the shim by spank_py/build.py
    names = [t[0] for t in table]
    assert names == ["gs-mps", "gs-mig", "gs-tune", "gs-bind", "gs-report"]
    by_name = {t[0]: t for t in table}
    assert by_name["gs-mps"][3] == 2          # optional argument: --gs-mps or --gs-mps=50
    assert all(by_name[n][3] == 1 for n in names if n != "gs-mps")
    for name, arginfo, usage, has_arg in table:
        assert len(name) <= 75 and name.replace("-", "").isalnum()
        assert usage.startswith("gsrun:")


# ------------------------------------------------------------ validation

def test_valid_options_are_exported_normalized(fake):
    sp = fake(options={"gs-mps": "50", "gs-tune": "swappiness=10, thp=never", "gs-mig": "7X1g.18gb",
                       "gs-bind": "Isolate", "gs-report": "none"})
    assert hooks.slurm_spank_init_post_opt("allocator", ARGS) == 0
    assert sp.job_control == {"GS_MPS": "50", "GS_TUNE": "swappiness=10,thp=never",
                              "GS_MIG": "7x1g.18gb", "GS_BIND": "isolate", "GS_REPORT": "none"}
    assert not [m for lvl, m in sp.logs if lvl == "error"]


def test_mps_flag_alone_exports_empty_value(fake):
    sp = fake(options={"gs-mps": ""})
    assert hooks.slurm_spank_init_post_opt("allocator", ARGS) == 0
    assert sp.job_control == {"GS_MPS": ""}
    # the prolog's reader: "" = MPS with the site default percentage
    from gsrun.node.mps import requested_pct
    env = {"SPANK_" + k: v for k, v in sp.job_control.items()}
    assert "SPANK_GS_MPS" in env and requested_pct(env, None) is None


def test_no_options_exports_nothing(fake):
    sp = fake(options={})
    assert hooks.slurm_spank_init_post_opt("allocator", ARGS) == 0
    assert sp.job_control == {} and sp.logs == []


def test_stale_plugin_table_is_named_with_the_fix(fake):
    """A .so built before an option was added: the new option cannot be
    given (Slurm does not know it), the others still work, the admin is told."""
    sp = fake(options={"gs-mps": "50"})
    args = dict(ARGS, options=["gs-mps", "gs-mig", "gs-tune", "gs-bind"])
    assert hooks.slurm_spank_init_post_opt("allocator", args) == 0
    assert sp.job_control == {"GS_MPS": "50"}
    assert [m for _lvl, m in sp.logs] == [
        "gsrun: spank: options: the plugin was built with gs-mps, gs-mig, gs-tune, gs-bind but this gsrun "
        "defines gs-mps, gs-mig, gs-tune, gs-bind, gs-report",
        "hint: rebuild and reinstall it: gsrun-node spank build && gsrun-node spank install"]


def test_current_plugin_table_logs_nothing(fake):
    sp = fake(options={"gs-report": "mail"})
    args = dict(ARGS, options=[o[0] for o in hooks.OPTIONS])
    assert hooks.slurm_spank_init_post_opt("allocator", args) == 0
    assert sp.job_control == {"GS_REPORT": "mail"} and sp.logs == []


@pytest.mark.parametrize("opt,value,needle", [
    ("gs-mps", "150", "1-100"),
    ("gs-mps", "abc", "1-100"),
    ("gs-mps", "0", "1-100"),
    ("gs-tune", "bogus=1", "bogus"),
    ("gs-tune", "swappiness=999", "0-200"),
    ("gs-tune", "swappiness", "swappiness"),
    ("gs-tune", "", "needs a value"),
    ("gs-mig", "7x1g.18gb;rm -rf /", "gs-mig"),
    ("gs-mig", "banana", "banana"),
    ("gs-bind", "spread", "auto|none|isolate"),
    ("gs-report", "sms", "mail|none"),
])
def test_bad_value_fails_submission_with_clear_message(fake, opt, value, needle):
    sp = fake(options={opt: value, "gs-report": "mail"} if opt != "gs-report" else {opt: value})
    assert hooks.slurm_spank_init_post_opt("allocator", ARGS) == -1
    assert sp.job_control == {}                      # nothing half-exported
    errors = [m for lvl, m in sp.logs if lvl == "error"]
    assert errors[0].startswith(f"gsrun: spank: --{opt}={value}: ")
    assert needle in " ".join(errors)


def test_all_bad_values_reported_at_once(fake):
    sp = fake(options={"gs-mps": "150", "gs-bind": "spread"})
    assert hooks.slurm_spank_init_post_opt("local", ARGS) == -1
    errors = [m for lvl, m in sp.logs if lvl == "error" and m.startswith("gsrun:")]
    assert [e.split(":")[2].strip() for e in errors] == ["--gs-mps=150", "--gs-bind=spread"]


def test_site_mig_layout_name_is_resolved(fake, tmp_path, monkeypatch):
    cfg = tmp_path / "gsrun.toml"
    cfg.write_text('[mig.layouts]\nsmall = "7x1g.18gb"\n')
    monkeypatch.setenv("GSRUN_CONFIG", str(cfg))
    sp = fake(options={"gs-mig": "small"})
    assert hooks.slurm_spank_init_post_opt("allocator", ARGS) == 0
    assert sp.job_control == {"GS_MIG": "7x1g.18gb"}


def test_fallback_used_when_module_import_fails(monkeypatch):
    monkeypatch.setitem(sys.modules, "gsrun.request.tune", None)   # import raises ImportError
    monkeypatch.setitem(sys.modules, "gsrun.request.mig_layout", None)
    assert hooks.check_tune("swappiness=10") == "swappiness=10"
    with pytest.raises(hooks.OptionError, match="key=value"):
        hooks.check_tune("swappiness=10;reboot")
    assert hooks.check_mig("2X3g.71gb") == "2x3g.71gb"
    with pytest.raises(hooks.OptionError, match="layout"):
        hooks.check_mig("$(id)")


def test_exported_values_pass_the_prolog_reader(fake):
    from gsrun.facts.jobenv import SPANK_KEYS, is_spank_value
    sp = fake(options={"gs-mps": "7", "gs-tune": "governor=performance,swappiness=0",
                       "gs-mig": "1g.18gb+me+3x1g.18gb", "gs-bind": "none", "gs-report": "mail"})
    assert hooks.slurm_spank_init_post_opt("allocator", ARGS) == 0
    for k, v in sp.job_control.items():
        assert "SPANK_" + k in SPANK_KEYS
        assert is_spank_value(v), (k, v)


def test_job_control_failure_in_allocator_raises_for_c_to_report(fake):
    fake(options={"gs-mps": "50"}, job_control_fails=True)
    with pytest.raises(OSError):
        hooks.slurm_spank_init_post_opt("allocator", ARGS)


def test_job_control_failure_in_srun_step_is_only_logged(fake):
    sp = fake(ctx="local", options={"gs-mps": "50"}, job_control_fails=True)
    assert hooks.slurm_spank_init_post_opt("local", ARGS) == 0
    assert any("job_control_setenv GS_MPS" in m for _, m in sp.logs)


def test_remote_post_opt_does_not_validate_or_export(fake):
    sp = fake(ctx="remote", options={"gs-mps": "150"})
    assert hooks.slurm_spank_init_post_opt("remote", ARGS) == 0
    assert sp.job_control == {} and sp.logs == []


# ------------------------------------------------------------ remote decisions

@pytest.mark.parametrize("plug,opt,want", [
    ("auto", None, "auto"), ("auto", "", "auto"), ("auto", "isolate", "isolate"),
    ("auto", "none", "none"), ("none", "isolate", "none"), ("auto", "weird", "none"),
])
def test_bind_mode(plug, opt, want):
    assert hooks.bind_mode(plug, opt) == want


@pytest.mark.parametrize("step,want", [(0, True), (7, True), (0xFFFFFFFB, False),
                                       (0xFFFFFFFC, False), (0xFFFFFFFA, False), (None, False)])
def test_is_bound_step(step, want):
    assert hooks.is_bound_step(step) is want


def _plan(host_nodes=2):
    from gsrun.bind.plan import Plan, RankPlan
    r0 = RankPlan(0, None, (), 0, (0, 1), (0,), None, {"LOCAL_RANK": "0", "GSRUN_BIND_CPUS": "0-1"},
                  ("ROCR_VISIBLE_DEVICES",), "node 0")
    r1 = RankPlan(1, None, (), None, (2, 3), (), None, {"LOCAL_RANK": "1", "GSRUN_BIND_CPUS": "2-3"},
                  (), "unknown node")
    return Plan(ranks=(r0, r1), allowed_cpus=(0, 1, 2, 3), host_nodes=host_nodes, step_gpus=())


def test_task_actions_from_plan_and_mps():
    mps = {"CUDA_MPS_PIPE_DIRECTORY": "/run/gsrun/mps/42/pipe"}
    a = hooks.task_actions(_plan(), 0, mps, allowed_mems=[0, 1])
    assert a.cpus == (0, 1) and a.mem_nodes == (0,)
    assert a.setenv == {"LOCAL_RANK": "0", "GSRUN_BIND_CPUS": "0-1", **mps}
    assert a.unsetenv == ("ROCR_VISIBLE_DEVICES",)
    b = hooks.task_actions(_plan(), 1, None)
    assert b.cpus == (2, 3) and b.mem_nodes == ()           # node unknown: no memory binding
    assert hooks.task_actions(_plan(host_nodes=1), 0, None).mem_nodes == ()
    assert hooks.task_actions(_plan(), 0, None, allowed_mems=[1]).mem_nodes == ()
    c = hooks.task_actions(None, 3, mps)
    assert c.cpus == () and c.setenv == mps


def plan_blocks(text):
    """A GSA1 plan (what the plugin's plan_parse reads) -> {"0": {"set": {...}, "unset": [...],
    "cpus": [...] | None, "mems": [...] | None}, ..., "*": ...}."""
    lines = text.splitlines()
    assert lines[0] == "GSA1" and lines[-1] == "end", text
    blocks, cur = {}, None
    for line in lines[1:-1]:
        kind, _, rest = line.partition(" ")
        if kind == "rank":
            assert rest not in blocks, text
            cur = blocks[rest] = {"set": {}, "unset": [], "cpus": None, "mems": None}
        elif kind == "set":
            name, _, value = rest.partition("=")
            cur["set"][name] = value
        elif kind == "unset":
            cur["unset"].append(rest)
        elif kind in ("cpus", "mems"):
            cur[kind] = [int(x) for x in rest.split(",")]
        else:
            assert kind == "note", line
    return blocks


def test_format_actions_gives_each_rank_its_block_and_the_others_theirs():
    mps = {"CUDA_MPS_PIPE_DIRECTORY": "/m/7/pipe", "CUDA_MPS_LOG_DIRECTORY": "/m/7/log"}
    acts = [(r, hooks.task_actions(_plan(), r, mps, allowed_mems=[0, 1])) for r in (0, 1)]
    text = hooks.format_actions(acts, ("SLURM_LOCALID 3 >= tasks\nper node",),
                                others=hooks.task_actions(None, None, mps))
    assert text == (
        "GSA1\n"
        "rank 0\nunset ROCR_VISIBLE_DEVICES\nset LOCAL_RANK=0\nset GSRUN_BIND_CPUS=0-1\n"
        "set CUDA_MPS_PIPE_DIRECTORY=/m/7/pipe\nset CUDA_MPS_LOG_DIRECTORY=/m/7/log\ncpus 0,1\nmems 0\n"
        "rank 1\nset LOCAL_RANK=1\nset GSRUN_BIND_CPUS=2-3\n"
        "set CUDA_MPS_PIPE_DIRECTORY=/m/7/pipe\nset CUDA_MPS_LOG_DIRECTORY=/m/7/log\ncpus 2,3\n"
        "rank *\nset CUDA_MPS_PIPE_DIRECTORY=/m/7/pipe\nset CUDA_MPS_LOG_DIRECTORY=/m/7/log\n"
        "note SLURM_LOCALID 3 >= tasks per node\n"
        "end\n")
    assert hooks.format_actions([]) == "GSA1\nend\n"


@pytest.mark.parametrize("act", [hooks.TaskActions(setenv={"A": "x\ny"}), hooks.TaskActions(setenv={"1A": "x"}),
                                 hooks.TaskActions(unsetenv=("A-B",)), hooks.TaskActions(setenv={"A": "\0"})])
def test_format_actions_refuses_what_a_line_cannot_carry(act):
    with pytest.raises(ValueError):
        hooks.format_actions([(0, act)])
    with pytest.raises(ValueError):
        hooks.format_actions([], others=act)


H200_TREE = str(TARBALL)   # our own probe of the H200 VM (tests/data/hosts/h200-vm/README.md)


@pytest.fixture
def h200_root(tmp_path):
    import subprocess
    root = tmp_path / "h200"
    root.mkdir()
    subprocess.run(["tar", "-xzf", H200_TREE, "-C", str(root), "--no-same-owner"], check=True, timeout=60)
    return root


def test_a_step_plan_gives_every_rank_its_part_on_recorded_h200(h200_root):
    """step_actions plans from the job env on the recorded H200 host (16 CPUs,
    one NUMA node, GPU 0) as one plan: each rank its half of the cores, the
    GPU and the MPS env; any other task the MPS env."""
    job_env = {"SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_STEP_GPUS": "0", "CUDA_VISIBLE_DEVICES": "0"}
    actions, notes, others = hooks.step_actions(job_env, str(h200_root), None, None, None, job_id="77",
                                                step_id=0, mps_opt="50")
    mps = {"CUDA_MPS_PIPE_DIRECTORY": "/run/gsrun/mps/77/pipe", "CUDA_MPS_LOG_DIRECTORY": "/run/gsrun/mps/77/log"}
    blocks = plan_blocks(hooks.format_actions(actions, notes, others))
    assert sorted(blocks) == ["*", "0", "1"]
    for rank, cpus in ((0, range(0, 8)), (1, range(8, 16))):
        b = blocks[str(rank)]
        assert b["cpus"] == list(cpus)
        assert b["set"]["LOCAL_RANK"] == str(rank) and b["set"]["CUDA_VISIBLE_DEVICES"] == "0"
        assert {k: b["set"][k] for k in mps} == mps
        assert b["mems"] is None        # one NUMA node: no memory binding
    assert blocks["*"] == {"set": mps, "unset": [], "cpus": None, "mems": None}


def test_a_step_that_cannot_be_bound_is_a_note_and_its_tasks_still_get_the_mps_env(tmp_path):
    actions, notes, others = hooks.step_actions({"SLURM_STEP_TASKS_PER_NODE": "2"}, str(tmp_path), None, None,
                                                None, job_id="77", step_id=0, mps_opt="")
    assert actions == [] and len(notes) == 1
    assert notes[0].startswith("bind: ") and notes[0].endswith("; the tasks of this step run with Slurm's binding")
    text = hooks.format_actions(actions, notes, others)
    assert sorted(plan_blocks(text)) == ["*"]
    assert plan_blocks(text)["*"]["set"]["CUDA_MPS_PIPE_DIRECTORY"] == "/run/gsrun/mps/77/pipe"


def test_a_batch_step_gets_mps_but_no_binding():
    actions, notes, others = hooks.step_actions({}, None, None, None, None, job_id="5", step_id=0xFFFFFFFB,
                                                mps_opt="")
    assert hooks.format_actions(actions, notes, others) == (
        "GSA1\nrank *\nset CUDA_MPS_PIPE_DIRECTORY=/run/gsrun/mps/5/pipe\n"
        "set CUDA_MPS_LOG_DIRECTORY=/run/gsrun/mps/5/log\nend\n")


def test_bind_none_in_plugstack_plans_nothing():
    assert hooks.step_actions({}, None, None, None, None, job_id="5", step_id=0, bind_opt="isolate",
                              plugstack_bind="none") == ([], (), None)


def test_no_hook_runs_in_slurmstepd():
    """slurmstepd never runs Python: the module defines none of the hooks it calls (the node
    daemon plans every step, the plugin applies the plan in C)."""
    for name in ("slurm_spank_init", "slurm_spank_user_init", "slurm_spank_task_init",
                 "slurm_spank_task_init_privileged", "slurm_spank_task_exit", "slurm_spank_job_prolog",
                 "slurm_spank_job_epilog"):
        assert not hasattr(hooks, name), name


def test_a_step_plans_with_the_site_config(tmp_path):
    """A bound step on the recorded H200 VM (a multi-node step's ``N(xR)`` task count) with the
    site config of the plugstack's ``config=`` file: its spool_dir is where the job's MIG
    devices are read from."""
    import json

    cfg = tmp_path / "gsrun.toml"
    cfg.write_text(f'[paths]\nspool_dir = "{tmp_path}/spool"\n[mail]\nfrom_addr = "hpc@example.org"\n')
    job = tmp_path / "spool" / "jobs" / "12"
    job.mkdir(parents=True)
    (job / "user-mig-n1.json").write_text(json.dumps({"devices": ["MIG-0123456789abcdef"]}))
    job_env = {"SLURM_STEP_TASKS_PER_NODE": "2(x3)", "SLURM_STEP_GPUS": "0", "CUDA_VISIBLE_DEVICES": "0",
               "SLURMD_NODENAME": "n1"}
    actions, _notes, _others = hooks.step_actions(job_env, str(DATA / "hosts" / "h200-vm"), None, None, str(cfg),
                                                  job_id="12", step_id=0)
    by_rank = dict(actions)
    assert by_rank[1].cpus == tuple(range(8, 16))
    assert by_rank[1].setenv["CUDA_VISIBLE_DEVICES"] == "MIG-0123456789abcdef"
