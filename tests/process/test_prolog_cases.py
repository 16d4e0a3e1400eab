"""The real prolog (child process, fake host root, fake tools on PATH) on
field cases 15, 18 and 20, exclusivity taken only from slurmctld's record,
and planted symlinks in the state/spool directories.

Field cases are described in docs/field-cases.md; ``test_caseN_...`` names
the field case a test proves."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat

import pytest

from helpers.node_site import kill_fakes, leftover_fakes, TUNE, host_only, make_site, nvml_devices, run_node, \
    samplers_of, snapshot, timed
from helpers.tuning_tree import diff

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the hooks run as root")
RECORD = "JobId={job} JobName={name} UserId=nobody(65534) OverSubscribe={ovs} Comment={comment}"


@pytest.fixture
def site(request):
    s = make_site(**getattr(request, "param", {}))
    yield s
    kill_fakes(s)       # and the site's node daemon
    shutil.rmtree(s.base, ignore_errors=True)


def governor(site) -> str:
    return (site.host / "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor").read_text().strip()


# ---------------------------------------------------------------- field case 15

MISMATCH = {"init": {"error": "Driver/library version mismatch", "code": 18}}


@root_only
@pytest.mark.parametrize("site", [{"nvml": MISMATCH}], indirect=True)
def test_case15_nvml_mismatch_prolog_exits_nonzero_with_reason(site):
    env = site.env(FAKE_NVSMI="mismatch")
    cp = run_node(["prolog"], env)
    assert cp.returncode == 1
    assert "gsrun: prolog: NVML/driver mismatch: reboot required" in cp.stderr
    rec = json.loads((site.spool / "jobs/4242/prolog-gpu-node01.json").read_text())
    assert rec["steps"]["nvml"].startswith("NVML init failed: LIB_RM_VERSION_MISMATCH")
    assert not samplers_of("4242", site.state)


@root_only
@pytest.mark.parametrize("code,name", [(9, "DRIVER_NOT_LOADED"), (12, "LIBRARY_NOT_FOUND"), (999, "UNKNOWN")])
def test_other_nvml_init_failures_do_not_drain(site, code, name):
    (site.host / "nvml.json").write_text(json.dumps({"init": {"error": name, "code": code}}))
    cp = run_node(["prolog"], site.env())
    assert cp.returncode == 0, cp.stderr
    rec = json.loads((site.spool / "jobs/4242/prolog-gpu-node01.json").read_text())
    assert rec["nvml_ok"] is False and name in rec["steps"]["nvml"]


# ---------------------------------------------------------- field case 20 + slurmctld unreachable

@root_only
@pytest.mark.parametrize("slurm", ["hang", "down"])
def test_case20_wedged_tools_prolog_uses_defaults_within_budget(site, slurm):
    """nvidia-smi/dcgmi sleep 3600, sacct 120 s, scontrol hangs or fails:
    the prolog asks scontrol once (bounded), then runs with defaults."""
    base = host_only(snapshot(site.host))
    env = site.env(spank={"SPANK_GS_TUNE": TUNE, "SPANK_GS_EXCLUSIVE": "1"}, FAKE_NVSMI="hang", FAKE_SLURM=slurm)
    cp, took = timed(["prolog"], env)
    assert cp.returncode == 0, cp.stderr
    assert took < 15, took                                    # scontrol bounded at 2 s here (command_s)
    rec = json.loads((site.spool / "jobs/4242/prolog-gpu-node01.json").read_text())
    assert rec["exclusive"] is False                          # never "exclusive" by default
    assert "not exclusive" in cp.stderr
    tuning = rec["steps"]["tuning"]
    assert "governor" in tuning["refused"] and governor(site) == "powersave"
    assert [c.split()[0] for c in site.calls_made()] == ["scontrol"]
    assert leftover_fakes(site) == []          # the hung scontrol and its sleep were killed at the timeout
    base_after = host_only(snapshot(site.host))
    assert [d for d in diff(base, base_after) if "governor" in d or "thp" in d] == []


@root_only
def test_case20_prolog_budget_is_hard(site):
    """A step that outlives the budget is cut off by SIGALRM; the job goes on."""
    site.config.write_text(site.config.read_text().replace("prolog_budget_s = 60", "prolog_budget_s = 1")
                           .replace("command_s = 2.0", "command_s = 30"))
    env = site.env(gpus="0")           # no credential fields: the prolog asks scontrol (hangs); budget 1 s < 5 s cap
    cp, took = timed(["prolog"], env)
    assert cp.returncode == 0
    assert took < 8, took
    assert "budget of 1 s exceeded" in cp.stderr


# ---------------------------------------------------------------- exclusivity only from slurmctld

@root_only
@pytest.mark.parametrize("name,ovs,comment,want", [
    ("train", "NO", "(null)", True),
    ("train", "OK", "(null)", False),
    ("x OverSubscribe=NO", "OK", "(null)", False),              # forged in the job name
    ("x OverSubscribe=NO", "NO", "(null)", False),              # ambiguous: fail safe
    ("train", "OK", "gsrun:exclusive=1;tune=governor=performance", False),   # comment is a request
    ("train", "USER", "(null)", False),
])
def test_exclusive_comes_from_the_job_record_only(site, name, ovs, comment, want):
    env = site.env(spank={"SPANK_GS_TUNE": "governor=performance", "SPANK_GS_EXCLUSIVE": "1"},
                   FAKE_SLURM="record", FAKE_SCONTROL_RECORD=RECORD.format(job="4242", name=name, ovs=ovs,
                                                                           comment=comment))
    cp = run_node(["prolog"], env)
    assert cp.returncode == 0, cp.stderr
    rec = json.loads((site.spool / "jobs/4242/prolog-gpu-node01.json").read_text())
    assert rec["exclusive"] is want
    assert governor(site) == ("performance" if want else "powersave")
    run_node(["epilog"], env)
    assert governor(site) == "powersave"


@root_only
def test_record_of_another_job_is_not_used(site):
    env = site.env(spank={"SPANK_GS_TUNE": "governor=performance"}, FAKE_SLURM="record",
                   FAKE_SCONTROL_RECORD=RECORD.format(job="4243", name="t", ovs="NO", comment="(null)"))
    cp = run_node(["prolog"], env)
    rec = json.loads((site.spool / "jobs/4242/prolog-gpu-node01.json").read_text())
    assert rec["exclusive"] is False and governor(site) == "powersave", cp.stderr
    run_node(["epilog"], env)


# ---------------------------------------------------------------- planted paths

def secret(site):
    """A stand-in for /etc (shadow inside) outside our directories."""
    d = site.base / "etc"
    d.mkdir(exist_ok=True)
    (d / "shadow").write_text("root:$6$secret:19000:0:99999:7:::\n")
    os.chmod(d / "shadow", 0o640)
    return d


def tree_bytes(d):
    return {p.name: (p.read_bytes(), stat.S_IMODE(p.stat().st_mode), p.stat().st_uid) for p in sorted(d.iterdir())}


@root_only
@pytest.mark.parametrize("where", ["spool", "state"])
@pytest.mark.parametrize("kind", ["dir-symlink", "file", "user-dir"])
def test_planted_job_dir_is_moved_aside_nothing_written_through(site, where, kind):
    etc = secret(site)
    before = tree_bytes(etc)
    parent = (site.spool if where == "spool" else site.state) / "jobs"
    parent.mkdir(parents=True)
    planted = parent / "4242"
    if kind == "dir-symlink":
        planted.symlink_to(etc)
    elif kind == "file":
        planted.write_text("x")
    else:
        planted.mkdir()
        os.chown(planted, 65534, 65534)
        (planted / "prolog-gpu-node01.json").symlink_to(etc / "shadow")
        (planted / "monitor.json").symlink_to(etc / "shadow")     # what the node monitor writes there
        (planted / "sampler.json").symlink_to(etc / "shadow")
    cp = run_node(["prolog"], site.env())
    assert cp.returncode == 0, cp.stderr
    assert tree_bytes(etc) == before                          # nothing written through
    assert "moved aside" in cp.stderr and str(planted) in cp.stderr
    st = os.lstat(planted)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == 0        # a fresh root directory
    aside = [p for p in parent.iterdir() if p.name.startswith(".planted-4242-")]
    assert len(aside) == 1
    assert samplers_of("4242", site.state)                    # the node monitor still samples the job
    run_node(["epilog"], site.env())
    assert tree_bytes(etc) == before


@root_only
@pytest.mark.parametrize("which", ["spool/jobs", "state/jobs"])
def test_planted_shared_parent_is_refused_and_job_still_runs(site, which):
    etc = secret(site)
    before = tree_bytes(etc)
    top = site.base / which.split("/")[0]
    top.mkdir()
    (top / "jobs").symlink_to(etc)
    cp = run_node(["prolog"], site.env(spank={"SPANK_GS_TUNE": "swappiness=10"}))
    assert cp.returncode == 0
    assert "refusing planted path" in cp.stderr
    assert tree_bytes(etc) == before
    assert not samplers_of("4242", site.state)
    e = run_node(["epilog"], site.env())
    assert e.returncode == 0
    assert tree_bytes(etc) == before


@root_only
def test_planted_file_symlink_in_spool_job_dir_is_replaced_not_followed(site):
    etc = secret(site)
    before = tree_bytes(etc)
    d = site.spool / "jobs" / "4242"
    d.mkdir(parents=True)
    for name in ("prolog-gpu-node01.json", "node-gpu-node01.json", "user-node-gpu-node01.json"):
        (d / name).symlink_to(etc / "shadow")
    assert run_node(["prolog"], site.env()).returncode == 0
    assert run_node(["epilog"], site.env()).returncode == 0
    assert tree_bytes(etc) == before
    for name in ("prolog-gpu-node01.json", "node-gpu-node01.json", "user-node-gpu-node01.json"):
        st = os.lstat(d / name)
        assert stat.S_ISREG(st.st_mode), name
        json.loads((d / name).read_text())


# ---------------------------------------------------------------- field case 18, prolog side

@root_only
@pytest.mark.parametrize("site", [{"nvml": nvml_devices(4)}], indirect=True)
def test_case18_hostname_differs_from_nodename(site):
    env = site.env(gpus="0,1", HOSTNAME="gpu-node01.cluster.example")
    assert run_node(["prolog"], env).returncode == 0
    assert (site.spool / "jobs/4242/prolog-gpu-node01.json").is_file()
    assert not list((site.spool / "jobs/4242").glob("*cluster.example*"))
    run_node(["epilog"], env)


# ---------------------------------------------------------------- no RPC for jobs that asked for nothing

SLURM_COMMANDS = ("scontrol", "squeue", "sacct", "sinfo", "sbatch", "srun", "sacctmgr")
#: the job credential's fields slurmd 22.05 puts beside the recorded env
#: (shared/data/slurm-22.05/prolog_slurmd.env; SLURM_JOB_COMMENT only when the job has one)
CREDENTIAL = {"SLURM_JOB_RESTART_COUNT": "0", "SLURM_JOB_NTASKS": "4", "SLURM_JOB_STDIN": "/dev/null"}


def slurm_calls(site) -> list[str]:
    """What the fake Slurm tools logged ($FAKE_CALL_LOG): every RPC the prolog made."""
    return [c for c in site.calls_made() if c.split()[0] in SLURM_COMMANDS]


def prolog_record(site) -> dict:
    return json.loads((site.spool / "jobs/4242/prolog-gpu-node01.json").read_text())


@root_only
def test_plain_job_makes_no_slurm_call(site):
    """A job with no SPANK_GS_* and no comment, on Slurm 22.05's prolog
    environment: no scontrol (here it would hang for command_s)."""
    cp = run_node(["prolog"], site.env(**CREDENTIAL))
    assert cp.returncode == 0, cp.stderr
    assert slurm_calls(site) == []
    rec = prolog_record(site)
    assert rec["slurm_calls"] == []
    assert rec["request"]["source"] == "none" and rec["request"]["comment_from"] == "prolog environment"
    assert rec["exclusive"] is False and "not exclusive" not in cp.stderr
    assert samplers_of("4242", site.state)                    # the rest of the prolog ran
    run_node(["epilog"], site.env(**CREDENTIAL))


@root_only
def test_prolog_clears_what_an_earlier_run_with_this_job_id_left(site):
    """A requeued job, or an id a restarted slurmctld issued again: the spool
    directory holds the earlier run's summaries. Left, EpilogSlurmctld would
    merge them and gseff would show the old report while this run goes on."""
    d = site.spool / "jobs" / "4242"
    d.mkdir(parents=True)
    old = ["node-gpu-node01.json", "user-node-gpu-node01.json", "user-live-gpu-node01.json", "summary.json",
           "user-summary.json", "accounting.json", "idle-cancel.json"]
    for name in old + ["node-gpu-node02.json"]:          # another node's summary is that node's to clear
        (d / name).write_text("{}")
    (d / "task-gpu-node01").mkdir()
    (d / "task-gpu-node01/bind.json").write_text("{}")     # the earlier run's task notes
    (site.base / "elsewhere.json").write_text("{}")
    (d / "summary.json").unlink()
    (d / "summary.json").symlink_to(site.base / "elsewhere.json")   # a link is removed, not followed
    cp = run_node(["prolog"], site.env(**CREDENTIAL))
    assert cp.returncode == 0, cp.stderr
    # the node monitor samples the job from its begin on: a live file there is this run's, and
    # so is the temp file of a live write caught between its write and its rename
    live = d / "user-live-gpu-node01.json"
    assert not live.exists() or json.loads(live.read_text()).get("job_id") == "4242"
    in_flight = re.compile(r"\.user-live-gpu-node01\.json\.[0-9]+\.[0-9a-f]{8}")
    assert sorted(x.name for x in d.iterdir() if x != live and not in_flight.fullmatch(x.name)) == \
        ["node-gpu-node02.json", "prolog-gpu-node01.json", "task-gpu-node01"]
    task = d / "task-gpu-node01"     # made for the job's user, empty: gsrun-bind's notes go there
    assert list(task.iterdir()) == [] and task.stat().st_uid == int(site.env(**CREDENTIAL)["SLURM_JOB_UID"])
    assert (site.base / "elsewhere.json").exists()
    assert "removed an earlier run's node-gpu-node01.json" in cp.stderr and "task-gpu-node01/bind.json" in cp.stderr
    cp = run_node(["epilog"], site.env(**CREDENTIAL))
    assert cp.returncode == 0, cp.stderr
    assert [x.name for x in d.iterdir() if x.name.startswith(".")] == []    # the job ended: no write in flight


@root_only
def test_older_slurm_env_asks_slurmctld_once(site):
    """Without the credential's fields the prolog cannot tell "no comment"
    from "not exported": one bounded scontrol, as before this change."""
    env = site.env(FAKE_SLURM="record", FAKE_SCONTROL_RECORD=RECORD.format(
        job="4242", name="t", ovs="OK", comment="gsrun:mps=50"))
    cp = run_node(["prolog"], env)
    assert cp.returncode == 0, cp.stderr
    assert slurm_calls(site) == ["scontrol --local -o show job 4242"]
    rec = prolog_record(site)
    assert rec["slurm_calls"] == ["scontrol show job"]
    assert rec["request"]["mps"] == "50" and rec["request"]["comment_from"] == "job record"
    run_node(["epilog"], env)


@root_only
def test_comment_request_comes_from_the_prolog_env(site):
    """gsrun's comment (the wrapper without the plugin) read from
    SLURM_JOB_COMMENT: an MPS request needs no exclusivity, so no RPC."""
    env = site.env(SLURM_JOB_COMMENT="my notes gsrun:mps=50", **CREDENTIAL)
    cp = run_node(["prolog"], env)
    assert cp.returncode == 0, cp.stderr
    assert slurm_calls(site) == []
    req = prolog_record(site)["request"]
    assert (req["source"], req["comment_from"], req["mps"], req["tune"]) == \
        ("job comment", "prolog environment", "50", None)
    run_node(["epilog"], env)


@root_only
@pytest.mark.parametrize("ovs,want", [("NO", True), ("OK", False)])
def test_tuning_request_in_env_comment_asks_only_for_exclusivity(site, ovs, want):
    env = site.env(SLURM_JOB_COMMENT="gsrun:tune=governor=performance", FAKE_SLURM="record",
                   FAKE_SCONTROL_RECORD=RECORD.format(job="4242", name="t", ovs=ovs, comment="(null)"), **CREDENTIAL)
    cp = run_node(["prolog"], env)
    assert cp.returncode == 0, cp.stderr
    assert slurm_calls(site) == ["scontrol --local -o show job 4242"]          # one, for OverSubscribe
    rec = prolog_record(site)
    assert rec["request"]["tune"] == "governor=performance"
    assert rec["request"]["comment_from"] == "prolog environment"       # not the record's "(null)"
    assert rec["exclusive"] is want and governor(site) == ("performance" if want else "powersave")
    run_node(["epilog"], env)
    assert governor(site) == "powersave"


@root_only
@pytest.mark.parametrize("site", [{"config_extra": '[tuning]\ndefaults = "swappiness=10"\n'}], indirect=True)
def test_site_tuning_defaults_still_ask_for_exclusivity(site):
    env = site.env(FAKE_SLURM="down", **CREDENTIAL)
    cp = run_node(["prolog"], env)
    assert cp.returncode == 0, cp.stderr
    assert slurm_calls(site) == ["scontrol --local -o show job 4242"]
    assert prolog_record(site)["exclusive"] is False and "not exclusive" in cp.stderr
    run_node(["epilog"], env)


@root_only
def test_spank_request_without_tuning_makes_no_slurm_call(site):
    env = site.env(spank={"SPANK_GS_MPS": "50", "SPANK_GS_REPORT": "none"})
    cp = run_node(["prolog"], env)
    assert cp.returncode == 0, cp.stderr
    assert slurm_calls(site) == [] and prolog_record(site)["request"]["source"] == "spank"
    run_node(["epilog"], env)
