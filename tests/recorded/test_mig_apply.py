"""MIG apply/restore (gsrun.node.mig) against the fake NVML MIG backend seeded
with the real H200 profile table (tests/data/nvml/h200-mig.json)."""

import json
from pathlib import Path

import pytest

from gsrun.node import mig
from gsrun.base.errors import InputError, NodeError
from gsrun.facts.hostfs import HostFS
from gsrun.node.mig_nvml import IN_USE, MigNvmlError
from helpers.fake_mig import FakeMig

DATA = Path(__file__).resolve().parent.parent / "data" / "nvml" / "h200-mig.json"


class Drain:
    def __init__(self):
        self.reasons = []

    def __call__(self, reason):
        self.reasons.append(reason)


def fake(gpus=1):
    return FakeMig.from_recording(DATA, gpus=gpus)


def with_prior_layout(f, gpu=0):
    """A GPU that already had MIG on with 2x3g.71gb (an admin's layout)."""
    f.set_mig_mode(gpu, 1)
    for start in (0, 4):
        gi = f.create_gpu_instance(gpu, 9, start, 4)
        f.create_compute_instance(gpu, gi)
    f.ops.clear()
    return f


def quiet(_msg):
    pass


def test_success_and_epilog_restore(tmp_path):
    f = fake()
    before = f.snapshot(0)
    assert before == {"mode": [0, 0], "gis": []}
    d = Drain()
    r = mig.prolog_apply(f, tmp_path, "1234", [0], "3g.71gb+2x2g.35gb", drain=d, log=quiet)
    assert len(r["devices"]) == 3 and all(u.startswith("MIG-") for u in r["devices"])
    assert len(set(r["devices"])) == 3
    snap = f.snapshot(0)
    assert snap["mode"] == [1, 1]
    assert [(g[0], g[1], g[2]) for g in snap["gis"]] == [(9, 4, 4), (14, 0, 2), (14, 2, 2)]
    assert all(len(g[3]) == 1 for g in snap["gis"])  # one compute instance per GPU instance
    # devices in plan order (by slice): 2g.35gb@0, 2g.35gb@2, 3g.71gb@4
    devs = {(x["gi_id"], x["ci_id"]): x["uuid"] for x in f.mig_devices(0)}
    gis = {(g["start"]): g["id"] for g in f.gpu_instances(0)}
    assert r["devices"] == [devs[(gis[0], 0)], devs[(gis[2], 0)], devs[(gis[4], 0)]]
    j = json.loads((tmp_path / "1234" / "mig.json").read_text())
    assert j["status"] == "applied" and j["gpus"]["0"]["prior"] == {"mode": [0, 0], "gis": []}
    assert j["gpus"]["0"]["mode_set"] is True and len(j["gpus"]["0"]["created"]) == 3
    assert oct((tmp_path / "1234" / "mig.json").stat().st_mode & 0o777) == "0o600"

    out = mig.epilog_restore(f, tmp_path, "1234", drain=d, log=quiet)
    assert out == {"restored": True, "gpus": [0]}
    assert f.snapshot(0) == before
    assert not (tmp_path / "1234").exists()
    assert d.reasons == []
    # idempotent: a second epilog finds nothing to do
    assert mig.epilog_restore(f, tmp_path, "1234", drain=d, log=quiet) == {
        "restored": False, "reason": "no MIG journal"}


def test_prior_layout_restored_exactly(tmp_path):
    f = with_prior_layout(fake())
    before = f.snapshot(0)
    assert before["mode"] == [1, 1] and len(before["gis"]) == 2
    r = mig.prolog_apply(f, tmp_path, "7", [0], "7x1g.18gb", log=quiet)
    assert len(r["devices"]) == 7
    assert [g[0] for g in f.snapshot(0)["gis"]] == [19] * 7
    # MIG was already on: no mode change
    assert not any(op[0] == "set_mig_mode" for op in f.ops)
    assert mig.epilog_restore(f, tmp_path, "7", log=quiet)["restored"] is True
    assert f.snapshot(0) == before


def test_two_gpus_devices_in_gpu_order(tmp_path):
    f = fake(gpus=2)
    r = mig.prolog_apply(f, tmp_path, "55", [1, 0], "4g.71gb+3g.71gb", log=quiet)
    assert len(r["devices"]) == 4
    assert r["devices"][:2] == r["gpus"][1] and r["devices"][2:] == r["gpus"][0]
    assert mig.epilog_restore(f, tmp_path, "55", log=quiet)["restored"]
    assert f.snapshot(0) == f.snapshot(1) == {"mode": [0, 0], "gis": []}


def count_steps(make, gpus, layout, tmp_path):
    f = make()
    mig.prolog_apply(f, tmp_path / "count", "1", gpus, layout, log=quiet)
    return len(f.ops)


@pytest.mark.parametrize("scenario", ["mig-off", "prior-layout", "two-gpus"])
def test_failure_at_each_step_rolls_back_to_prior(tmp_path, scenario):
    make = {"mig-off": lambda: fake(),
            "prior-layout": lambda: with_prior_layout(fake()),
            "two-gpus": lambda: with_prior_layout(fake(gpus=2), gpu=1)}[scenario]
    gpus = [0, 1] if scenario == "two-gpus" else [0]
    layout = "3g.71gb+2g.35gb+2x1g.18gb"
    n = count_steps(make, gpus, layout, tmp_path)
    assert n >= 9  # mode + 4 GIs + 4 CIs at least
    for k in range(1, n + 1):
        f = make()
        before = [f.snapshot(g) for g in gpus]
        d = Drain()
        f.fail_at_step(k)
        with pytest.raises(NodeError) as ei:
            mig.prolog_apply(f, tmp_path / f"s{k}", "99", gpus, layout, drain=d, log=quiet)
        assert "injected failure" in ei.value.detail and "rolled back" in ei.value.detail, k
        assert [f.snapshot(g) for g in gpus] == before, f"step {k}: {f.ops[k - 1]}"
        assert d.reasons == []
        assert not (tmp_path / f"s{k}" / "99" / "mig.json").exists()


def test_gpu_with_processes_refused_before_any_change(tmp_path):
    f = fake()
    f.processes[0] = [{"pid": 4242, "used_bytes": 1 << 30}]
    with pytest.raises(NodeError) as ei:
        mig.prolog_apply(f, tmp_path, "8", [0], "7g.141gb", log=quiet)
    assert ei.value.what == "GPU in use" and "GPU 0: pids 4242" in ei.value.detail
    assert f.ops == [] and not (tmp_path / "8").exists()


def test_mig_mode_blocked_reports_why_and_rolls_back(tmp_path):
    f = fake()
    f.mode_blocker[0] = IN_USE
    d = Drain()
    with pytest.raises(NodeError) as ei:
        mig.prolog_apply(f, tmp_path, "9", [0], "7g.141gb", drain=d, log=quiet,
                         holders=lambda gpu: ["nvidia-persistenced (pid 812)", "dcgm-exporter (pid 1500)"])
    e = ei.value
    assert e.what == "MIG mode not enabled"
    assert "MIG enable is pending (current 0, pending 1): In use by another client" in e.detail
    assert "holding it: nvidia-persistenced (pid 812), dcgm-exporter (pid 1500)" in e.detail
    assert f.snapshot(0) == {"mode": [0, 0], "gis": []}  # the pending enable was withdrawn
    assert d.reasons == []


def test_blocker_without_holders_lists_usual_suspects(tmp_path):
    f = fake()
    f.mode_blocker[0] = 16
    with pytest.raises(NodeError) as ei:
        mig.prolog_apply(f, tmp_path, "9", [0], "7g.141gb", log=quiet)
    assert "GPU requires restart" in ei.value.detail
    for who in ("nvidia-persistenced", "nvidia_drm", "DCGM", "slurmd"):
        assert who in ei.value.detail


def test_rollback_failure_drains_and_keeps_journal(tmp_path):
    f = with_prior_layout(fake())
    before = f.snapshot(0)
    d = Drain()
    # creating the job's 3rd instance fails, and so does every later create:
    # the prior 2x3g.71gb cannot be recreated
    n_creates = [0]
    real_create = f.create_gpu_instance

    def create(gpu, pid, start, size):
        n_creates[0] += 1
        if n_creates[0] >= 3:
            raise MigNvmlError("create_gpu_instance", gpu, "Insufficient Resources", 23)
        return real_create(gpu, pid, start, size)

    f.create_gpu_instance = create
    with pytest.raises(NodeError) as ei:
        mig.prolog_apply(f, tmp_path, "10", [0], "4x1g.35gb", drain=d, log=quiet)
    assert ei.value.what == "MIG layout failed and node drained"
    assert len(d.reasons) == 1 and d.reasons[0].startswith("gsrun mig job 10: rollback failed: GPU 0:")
    assert "\n" not in d.reasons[0] and len(d.reasons[0]) <= 200
    j = json.loads((tmp_path / "10" / "mig.json").read_text())
    assert j["status"] == "rollback_failed"
    # later, the driver works again: gsrun-node restore brings the prior layout back
    f.create_gpu_instance = real_create
    res = mig.restore_crashed(f, tmp_path, log=quiet, drain=d)
    assert res == {"10": {"restored": True, "gpus": [0]}}
    assert f.snapshot(0) == before
    assert not (tmp_path / "10" / "mig.json").exists()


class Crash(BaseException):
    """The prolog process dies (SIGKILL, node reboot) mid-way."""


@pytest.mark.parametrize("crash_at", ["create_compute_instance", "destroy_gpu_instance", "after"])
def test_restore_after_crash_between_prolog_and_epilog(tmp_path, crash_at):
    f = with_prior_layout(fake())
    before = f.snapshot(0)
    if crash_at != "after":
        orig = getattr(f, crash_at)
        calls = [0]

        def dying(*a, **kw):
            calls[0] += 1
            if calls[0] == 2:
                raise Crash()
            return orig(*a, **kw)

        setattr(f, crash_at, dying)
        with pytest.raises(Crash):
            mig.prolog_apply(f, tmp_path, "77", [0], "3g.71gb+2x2g.35gb", log=quiet)
        setattr(f, crash_at, orig)
        assert json.loads((tmp_path / "77" / "mig.json").read_text())["status"] == "applying"
    else:
        mig.prolog_apply(f, tmp_path, "77", [0], "3g.71gb+2x2g.35gb", log=quiet)
    assert f.snapshot(0) != before
    # a running job is left alone
    assert mig.restore_crashed(f, tmp_path, log=quiet, keep_jobs={"77"}) == {}
    assert f.snapshot(0) != before
    res = mig.restore_crashed(f, tmp_path, log=quiet)
    assert res == {"77": {"restored": True, "gpus": [0]}}
    assert f.snapshot(0) == before


def test_epilog_restore_blocked_mode_drains(tmp_path):
    f = fake()
    mig.prolog_apply(f, tmp_path, "21", [0], "7g.141gb", log=quiet)
    f.mode_blocker[0] = IN_USE  # disabling MIG stays pending
    d = Drain()
    out = mig.epilog_restore(f, tmp_path, "21", drain=d, log=quiet)
    assert out["restored"] is False and out["drained"] is True
    assert d.reasons == [out["reason"]]
    assert "GPU 0" in out["reason"] and "MIG mode is [1, 0]" in out["reason"]
    assert json.loads((tmp_path / "21" / "mig.json").read_text())["status"] == "restore_failed"


def test_corrupt_journal_drains(tmp_path):
    (tmp_path / "31").mkdir()
    (tmp_path / "31" / "mig.json").write_text("{not json")
    d = Drain()
    out = mig.epilog_restore(fake(), tmp_path, "31", drain=d, log=quiet)
    assert out["drained"] and "unreadable" in d.reasons[0]


def test_refusals(tmp_path):
    f = fake()
    with pytest.raises(NodeError, match="exclusively"):
        mig.prolog_apply(f, tmp_path, "1", [0], "7g.141gb", exclusive=False, log=quiet)
    with pytest.raises(InputError, match="bad job id"):
        mig.prolog_apply(f, tmp_path, "../etc", [0], "7g.141gb", log=quiet)
    with pytest.raises(InputError, match="does not fit"):
        mig.prolog_apply(f, tmp_path, "1", [0], "8x1g.18gb", log=quiet)
    with pytest.raises(InputError, match="no GPUs"):
        mig.prolog_apply(f, tmp_path, "1", [], "7g.141gb", log=quiet)
    assert f.ops == []
    (tmp_path / "2").mkdir()
    (tmp_path / "2" / "mig.json").write_text("{}")
    with pytest.raises(NodeError, match="journal exists"):
        mig.prolog_apply(f, tmp_path, "2", [0], "7g.141gb", log=quiet)


def test_named_layout(tmp_path):
    f = fake()
    r = mig.prolog_apply(f, tmp_path, "3", [0], "small", named={"small": "7x1g.18gb"}, log=quiet)
    assert len(r["devices"]) == 7


def test_fake_enforces_nvml_rules():
    f = fake()
    with pytest.raises(MigNvmlError, match="MIG mode is disabled"):
        f.create_gpu_instance(0, 9, 0, 4)
    f.set_mig_mode(0, 1)
    with pytest.raises(MigNvmlError, match="not allowed"):
        f.create_gpu_instance(0, 9, 2, 4)
    gi = f.create_gpu_instance(0, 9, 0, 4)
    with pytest.raises(MigNvmlError, match="Insufficient"):
        f.create_gpu_instance(0, 5, 0, 4)  # overlaps
    f.create_compute_instance(0, gi)
    with pytest.raises(MigNvmlError, match="compute instances exist"):
        f.destroy_gpu_instance(0, gi)
    with pytest.raises(MigNvmlError, match="GPU instances exist"):
        f.set_mig_mode(0, 0)


def test_cli_plan_fake_host_root(tmp_path):
    root = tmp_path / "host"
    root.mkdir()
    (root / "nvml.json").write_text(DATA.read_text())
    out = mig.cli_plan(0, "4g.71gb+3g.71gb", HostFS(root))
    assert out.splitlines()[0] == "MIG plan for 4g.71gb+3g.71gb on GPU 0 (NVIDIA H200)"
    assert "map [AAAABBBB]" in out
    assert "MIG mode now: disabled (pending disabled)" in out
    assert "nothing was changed" in out
    with pytest.raises(InputError, match="instanceCount of 4g.71gb is 1"):
        mig.cli_plan(0, "4g.71gb+4g.71gb", HostFS(root))


def test_cli_plan_with_backend_is_read_only():
    f = fake()
    out = mig.cli_plan(0, "2x3g.71gb", mig_backend=f)
    assert "map [AAAABBBB]" in out and f.ops == []
