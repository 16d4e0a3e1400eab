"""Tuning against fake host trees (real files under tmp_path)."""

from __future__ import annotations

import errno
import json
import threading

import pytest

from gsrun.node import tuning
from gsrun.request.config import parse_config
from gsrun.base.errors import InputError, NodeError
from gsrun.facts.hostfs import HostFS
from helpers.tuning_tree import (SWAP_LINE, SWAP_LINE2, CountingHostFS, RecordingSwap, diff, make_tree,
                                 snapshot)

SHARED = parse_config("[tuning]\nexclusive_only = false\n")


@pytest.fixture
def host(tmp_path):
    root = make_tree(tmp_path / "host")
    return HostFS(root)


@pytest.fixture
def state(tmp_path):
    return str(tmp_path / "state")


def quiet(msg):
    pass


def item(report, key):
    rows = [r for r in report["items"] if r["key"] == key]
    assert rows, f"no item for {key}: {report['items']}"
    return rows[-1]


# ---------------------------------------------------------------- apply/restore, every setting

CASES = [
    ("governor=performance", "sys/devices/system/cpu/cpu2/cpufreq/scaling_governor", "powersave\n",
     "performance\n"),
    ("swappiness=10", "proc/sys/vm/swappiness", "60\n", "10\n"),
    ("dirty_ratio=40", "proc/sys/vm/dirty_ratio", "20\n", "40\n"),
    ("dirty_background_ratio=5", "proc/sys/vm/dirty_background_ratio", "10\n", "5\n"),
    ("thp=never", "sys/kernel/mm/transparent_hugepage/enabled", "always [madvise] never\n",
     "always madvise [never]\n"),
    ("thp_defrag=defer+madvise", "sys/kernel/mm/transparent_hugepage/defrag",
     "always defer defer+madvise [madvise] never\n", "always defer [defer+madvise] madvise never\n"),
    ("zone_reclaim_mode=1", "proc/sys/vm/zone_reclaim_mode", "0\n", "1\n"),
    ("swap=off", "proc/swaps", None, None),
]


@pytest.mark.parametrize("request_text,rel,before,after", CASES, ids=[c[0] for c in CASES])
def test_apply_then_restore_byte_for_byte(host, state, request_text, rel, before, after):
    base = snapshot(host.root)
    if before is not None:
        assert host.path(rel).read_text() == before
    rep = tuning.prolog_tune(host, state, "4242", request_text, None, None, exclusive=True, log=quiet)
    key = request_text.split("=")[0]
    assert rep["applied"] == [key], rep
    assert rep["ok"]
    changed = diff(base, snapshot(host.root))
    if after is not None:
        assert host.path(rel).read_text() == after
        if key == "governor":  # every CPU with cpufreq, nothing else
            assert changed == [f"sys/devices/system/cpu/cpu{c}/cpufreq/scaling_governor" for c in range(4)]
        else:
            assert changed == [rel]
    else:
        assert host.path("proc/swaps").read_text().splitlines()[1:] == []
    st = tuning.status(host, state)
    assert st["jobs"] == ["4242"]
    assert [(c["key"], c["owner"], c["in_effect"]) for c in st["changes"]] == [(key, "4242", True)]
    out = tuning.epilog_restore(host, state, "4242", log=quiet)
    assert out["last_job"] and out["ok"]
    assert [r["result"] for r in out["restored"]] == ["restored"]
    assert diff(base, snapshot(host.root)) == []
    assert tuning.status(host, state) ["changes"] == []
    # idempotent: a second epilog/restore changes nothing
    again = tuning.epilog_restore(host, state, "4242", log=quiet)
    assert again["restored"] == [] and again["had_journal"] is False
    assert diff(base, snapshot(host.root)) == []


def test_all_settings_together_restore_in_reverse(host, state):
    base = snapshot(host.root)
    req = ("governor=performance,swappiness=10,swap=off,dirty_ratio=40,dirty_background_ratio=5,"
           "thp=never,thp_defrag=never,zone_reclaim_mode=1")
    rep = tuning.prolog_tune(host, state, "7", req, None, None, exclusive=True, log=quiet)
    job_scoped = ("cstate", "irq", "hugepages")     # test_tuning_host.py (they need a JobScope)
    keys = [k for k in tuning.KNOBS if k not in job_scoped]
    assert sorted(rep["applied"]) == sorted(keys), rep
    tmp = host.root.parent / "state/tuning/baseline.json"
    order = [e["key"] for e in json.loads(tmp.read_text())["entries"]]
    assert order == keys
    assert tmp.stat().st_mode & 0o777 == 0o600
    out = tuning.epilog_restore(host, state, "7", log=quiet)
    assert [r["key"] for r in out["restored"]] == list(reversed(keys))
    assert diff(base, snapshot(host.root)) == []
    assert not tmp.exists()


# ---------------------------------------------------------------- dirty _bytes forms

def test_dirty_bytes_form_restored_as_bytes(tmp_path, state):
    root = make_tree(tmp_path / "h", dirty_bytes=1073741824, dirty_background_bytes=268435456)
    host = HostFS(root)
    base = snapshot(root)
    rep = tuning.prolog_tune(host, state, "1", "dirty_ratio=40,dirty_background_ratio=10", None, None,
                             exclusive=True, log=quiet)
    assert rep["applied"] == ["dirty_ratio", "dirty_background_ratio"]
    assert item(rep, "dirty_ratio")["prior"] == {"form": "bytes", "value": "1073741824"}
    vm = root / "proc/sys/vm"
    # setting the ratio zeroed the bytes form, as the kernel does
    assert (vm / "dirty_ratio").read_text() == "40\n" and (vm / "dirty_bytes").read_text() == "0\n"
    assert (vm / "dirty_background_ratio").read_text() == "10\n"
    assert (vm / "dirty_background_bytes").read_text() == "0\n"
    tuning.epilog_restore(host, state, "1", log=quiet)
    assert (vm / "dirty_bytes").read_text() == "1073741824\n"
    assert (vm / "dirty_ratio").read_text() == "0\n"
    assert diff(base, snapshot(root)) == []


def test_dirty_ratio_equal_value_but_bytes_in_use_is_a_change(tmp_path, state):
    # ratio file reads 0 while bytes are in use: asking dirty_ratio=20 must still write
    root = make_tree(tmp_path / "h", dirty_bytes=4096 * 1000)
    host = HostFS(root)
    rep = tuning.prolog_tune(host, state, "1", "dirty_ratio=20", None, None, exclusive=True, log=quiet)
    assert rep["applied"] == ["dirty_ratio"]
    assert host.read("proc/sys/vm/dirty_bytes") == "0"


# ---------------------------------------------------------------- unsupported / refused

def test_missing_cpufreq_is_not_supported_here(tmp_path, state):
    root = make_tree(tmp_path / "vm", cpufreq_cpus=0, swap=False)  # the H200 VM as recorded
    host = HostFS(root)
    base = snapshot(root)
    logs = []
    rep = tuning.prolog_tune(host, state, "5", "governor=performance,swap=off,swappiness=10", None, None,
                             exclusive=True, log=logs.append)
    assert rep["unsupported"] == ["governor", "swap"]
    assert "not supported here" in item(rep, "governor")["reason"]
    assert "no active swap" in item(rep, "swap")["reason"]
    assert rep["applied"] == ["swappiness"] and rep["ok"]
    assert any("governor: not supported here" in m for m in logs)
    tuning.epilog_restore(host, state, "5", log=quiet)
    assert diff(base, snapshot(root)) == []


def test_governor_not_offered_by_kernel_is_refused(host, state):
    base = snapshot(host.root)
    rep = tuning.prolog_tune(host, state, "5", "governor=schedutil", None, None, exclusive=True, log=quiet)
    it = item(rep, "governor")
    assert it["action"] == "refused"
    assert "allowed: performance powersave" in it["reason"]
    assert diff(base, snapshot(host.root)) == []


def test_governor_allowed_is_intersection_over_cpus(host, state):
    host.path("sys/devices/system/cpu/cpu3/cpufreq/scaling_available_governors").write_text("powersave\n")
    rep = tuning.prolog_tune(host, state, "5", "governor=performance", None, None, exclusive=True, log=quiet)
    assert item(rep, "governor")["action"] == "refused"


def test_thp_word_not_in_file_is_refused(host, state):
    host.path("sys/kernel/mm/transparent_hugepage/enabled").write_text("[always] never\n")
    rep = tuning.prolog_tune(host, state, "5", "thp=madvise", None, None, exclusive=True, log=quiet)
    assert item(rep, "thp")["action"] == "refused"
    assert "allowed: always never" in item(rep, "thp")["reason"]


def test_key_outside_allow_list_refused_job_runs_with_defaults(host, state):
    cfg = parse_config('[tuning]\nallowed_keys = ["swappiness"]\n'
                       '[partition.gpu.tuning]\ndefaults = "thp=never,swappiness=30"\n')
    logs = []
    rep = tuning.prolog_tune(host, state, "9", "thp=always,swappiness=10", cfg, "gpu", exclusive=True,
                             log=logs.append)
    thp = [r for r in rep["items"] if r["key"] == "thp"]
    assert [(r["action"], r["value"], r["source"]) for r in thp] == [
        ("refused", "always", "request"), ("applied", "never", "default")]
    assert "tuning.allowed_keys for partition gpu" in thp[0]["reason"]
    assert any("refused thp=always" in m for m in logs)
    assert item(rep, "swappiness")["value"] == "10" and item(rep, "swappiness")["source"] == "request"
    assert host.read("sys/kernel/mm/transparent_hugepage/enabled") == "always madvise [never]"
    assert host.read("proc/sys/vm/swappiness") == "10"


def test_bad_request_syntax_refused_defaults_still_apply(host, state):
    cfg = parse_config('[tuning]\ndefaults = "swappiness=30"\n')
    rep = tuning.prolog_tune(host, state, "9", "swappiness=999", cfg, None, exclusive=True, log=quiet)
    assert item(rep, "request")["action"] == "refused"
    assert "swappiness=999" in item(rep, "request")["reason"]
    assert rep["applied"] == ["swappiness"] and host.read("proc/sys/vm/swappiness") == "30"


def test_non_exclusive_job_refused_when_exclusive_only(host, state):
    base = snapshot(host.root)
    rep = tuning.prolog_tune(host, state, "9", "swappiness=10,thp=never", None, None, exclusive=False,
                             log=quiet)
    assert rep["refused"] == ["swappiness", "thp"]
    assert "exclusive" in item(rep, "thp")["reason"]
    assert diff(base, snapshot(host.root)) == []
    assert tuning.status(host, state)["jobs"] == ["9"]  # still counted on the node


def test_tuning_disabled(host, state):
    cfg = parse_config('[tuning]\nenabled = false\ndefaults = "swappiness=5"\n')
    base = snapshot(host.root)
    rep = tuning.prolog_tune(host, state, "9", "thp=never", cfg, None, exclusive=True, log=quiet)
    assert sorted(rep["refused"]) == ["swappiness", "thp"]
    assert diff(base, snapshot(host.root)) == []


def test_value_already_set_is_journaled_not_written(tmp_path, state):
    host = CountingHostFS(make_tree(tmp_path / "h"))
    rep = tuning.prolog_tune(host, state, "1", "swappiness=60", None, None, exclusive=True, log=quiet)
    assert rep["unchanged"] == ["swappiness"] and host.writes == []
    assert [c["key"] for c in tuning.status(host, state)["changes"]] == ["swappiness"]


# ---------------------------------------------------------------- swap

def test_swap_off_runs_effect_and_restores_devices_in_order(tmp_path, state):
    root = make_tree(tmp_path / "h", swapped_kb=524288)
    host = HostFS(root)
    base = snapshot(root)
    fake = RecordingSwap()
    rep = tuning.prolog_tune(host, state, "1", "swap=off", None, None, exclusive=True, log=quiet,
                             swap_effect=fake)
    assert rep["applied"] == ["swap"]
    assert fake.calls == [("off", ["/swapfile", "/dev/nvme0n1p3"])]
    prior = item(rep, "swap")["prior"]
    assert [(d["name"], d["priority"]) for d in prior] == [("/swapfile", -2), ("/dev/nvme0n1p3", 5)]
    tuning.epilog_restore(host, state, "1", log=quiet, swap_effect=fake)
    assert fake.calls[1] == ("on", ["/swapfile", "/dev/nvme0n1p3"])
    assert root.joinpath("proc/swaps").read_text().splitlines()[1:] == [SWAP_LINE, SWAP_LINE2]
    assert diff(base, snapshot(root)) == []


def test_swap_off_refused_when_memory_does_not_cover_swapped_pages(tmp_path, state):
    root = make_tree(tmp_path / "h", swapped_kb=4_000_000, mem_available_kb=3_000_000)
    host = HostFS(root)
    fake = RecordingSwap()
    rep = tuning.prolog_tune(host, state, "1", "swap=off", None, None, exclusive=True, log=quiet,
                             swap_effect=fake)
    sw = item(rep, "swap")
    assert sw["action"] == "refused"
    assert "4000000 kB" in sw["reason"] and "3000000 kB" in sw["reason"] and "swappiness only" in sw["reason"]
    assert fake.calls == []
    sp = item(rep, "swappiness")
    assert (sp["action"], sp["value"], sp["source"]) == ("applied", tuning.SWAP_FALLBACK_SWAPPINESS, "fallback")
    # an explicit swappiness wins over the fallback
    tuning.epilog_restore(host, state, "1", log=quiet)
    rep = tuning.prolog_tune(host, state, "2", "swap=off,swappiness=20", None, None, exclusive=True,
                             log=quiet, swap_effect=fake)
    assert item(rep, "swappiness")["value"] == "20"


def test_swap_effect_failure_rolls_back(tmp_path, state):
    root = make_tree(tmp_path / "h")
    host = HostFS(root)
    base = snapshot(root)

    class Broken:
        def off(self, hostfs, devices):
            raise NodeError("tune", "swapoff failed", "exit 255: swapoff: /swapfile: Cannot allocate memory")

        def on(self, hostfs, devices):
            raise AssertionError("nothing was turned off")

    rep = tuning.prolog_tune(host, state, "1", "swappiness=10,swap=off", None, None, exclusive=True,
                             log=quiet, swap_effect=Broken())
    assert rep["failed"] == ["swap"] and rep["rolled_back"] == ["swappiness"] and not rep["ok"]
    assert "Cannot allocate memory" in item(rep, "swap")["reason"]
    assert diff(base, snapshot(root)) == []


def test_real_swap_effect_runs_commands_with_timeout(monkeypatch):
    calls = []

    def fake_run(argv, timeout_s, **kw):
        assert isinstance(argv, list)   # never a shell string
        calls.append((argv, timeout_s, False))
        return 0, "", ""

    import gsrun.node.tuning.vm
    monkeypatch.setattr(gsrun.node.tuning.vm, "run_bounded", fake_run)
    monkeypatch.setattr(tuning.SwapEffect, "_bin", staticmethod(lambda n: f"/sbin/{n}"))
    eff = tuning.SwapEffect(timeout_s=7)
    eff.off(None, [{"name": "/swap file"}])
    eff.on(None, [{"name": "/swap file", "priority": -2}, {"name": "/dev/sdb2", "priority": 5}])
    assert calls == [(["/sbin/swapoff", "--", "/swap file"], 7, False),
                     (["/sbin/swapon", "--", "/swap file"], 7, False),
                     (["/sbin/swapon", "-p", "5", "--", "/dev/sdb2"], 7, False)]
    with pytest.raises(NodeError):
        eff.off(None, [{"name": "relative/path"}])


def test_default_swap_effect_never_real_under_fake_root(host):
    assert isinstance(tuning.default_swap_effect(host), tuning.FakeSwapEffect)


def test_read_swaps_unescapes_names(tmp_path):
    root = make_tree(tmp_path / "h", swap=False)
    p = root / "proc/swaps"
    p.write_text(p.read_text() + "/swap\\040file\tfile\t100\t0\t-2\n")
    assert tuning.read_swaps(HostFS(root))[0]["name"] == "/swap file"


# ---------------------------------------------------------------- failures while writing

def test_read_only_file_keeps_journal_and_rolls_back(tmp_path, state):
    root = make_tree(tmp_path / "h")
    base = snapshot(root)
    host = CountingHostFS(root, fail_path="transparent_hugepage/enabled", fail_errno=errno.EROFS)
    logs = []
    rep = tuning.prolog_tune(host, state, "3", "governor=performance,swappiness=10,thp=never,thp_defrag=never",
                             None, None, exclusive=True, log=logs.append)
    assert rep["failed"] == ["thp"] and "EROFS" in item(rep, "thp")["reason"]
    assert rep["rolled_back"] == ["governor", "swappiness"]
    assert item(rep, "thp_defrag")["action"] == "skipped" and rep["skipped"] == ["thp_defrag"]
    assert diff(base, snapshot(root)) == []
    job = json.loads((tmp_path / "state/tuning/jobs/3.json").read_text())
    assert job["state"] == "failed"
    assert not (tmp_path / "state/tuning/baseline.json").exists()   # nothing left to restore
    assert any("rolling back" in m for m in logs)
    out = tuning.epilog_restore(HostFS(root), state, "3", log=quiet)
    assert out["ok"] and diff(base, snapshot(root)) == []


def test_permission_error_on_rollback_keeps_entry_for_later(tmp_path, state):
    root = make_tree(tmp_path / "h")
    base = snapshot(root)
    good = HostFS(root)
    # swappiness applied, then thp fails; during rollback swappiness cannot be written either
    host = CountingHostFS(root, fail_path="transparent_hugepage/enabled", fail_errno=errno.EACCES)
    orig = host.write

    def write(rel, value):
        if rel.endswith("swappiness") and value == "60":
            raise PermissionError(errno.EACCES, "Permission denied", rel)
        orig(rel, value)
    host.write = write
    rep = tuning.prolog_tune(host, state, "3", "swappiness=10,thp=never", None, None, exclusive=True, log=quiet)
    assert rep["failed"] == ["thp"] and rep["rolled_back"] == []
    data = json.loads((tmp_path / "state/tuning/baseline.json").read_text())
    assert [(e["key"], e["prior"]) for e in data["entries"]] == [("swappiness", "60")]
    assert tuning.epilog_restore(good, state, "3", log=quiet)["ok"]
    assert diff(base, snapshot(root)) == []


def test_verify_failure_is_reported_and_rolled_back(tmp_path, state):
    root = make_tree(tmp_path / "h")
    base = snapshot(root)
    host = CountingHostFS(root, drop_writes="vm/zone_reclaim_mode")
    rep = tuning.prolog_tune(host, state, "3", "swappiness=10,zone_reclaim_mode=1", None, None,
                             exclusive=True, log=quiet)
    assert rep["failed"] == ["zone_reclaim_mode"]
    assert "reads 0 after writing 1" in item(rep, "zone_reclaim_mode")["reason"]
    assert diff(base, snapshot(root)) == []


@pytest.mark.parametrize("finish", ["epilog", "restore_all"])
def test_prolog_crash_between_writes_then_restore(tmp_path, finish):
    req = "governor=performance,swappiness=10,swap=off,dirty_ratio=40,thp=never,thp_defrag=never"
    # count the writes of a full run first
    probe_root = make_tree(tmp_path / "probe")
    probe = CountingHostFS(probe_root)
    tuning.prolog_tune(probe, str(tmp_path / "ps"), "1", req, None, None, exclusive=True, log=quiet)
    total = len(probe.writes)
    assert total >= 9   # 4 governors + swappiness + dirty + 2 thp + swaps
    from helpers.tuning_tree import Crash
    for n in range(total + 1):
        root = make_tree(tmp_path / f"h{n}")
        st = str(tmp_path / f"s{n}")
        base = snapshot(root)
        host = CountingHostFS(root, crash_after=n)
        if n < total:
            with pytest.raises(Crash):
                tuning.prolog_tune(host, st, "77", req, None, None, exclusive=True, log=quiet)
        else:
            tuning.prolog_tune(host, st, "77", req, None, None, exclusive=True, log=quiet)
        assert tuning.status(HostFS(root), st)["jobs"] == ["77"]
        if 0 < n:   # the crash really left the node changed
            assert diff(base, snapshot(root)) != [], n
        if finish == "epilog":
            out = tuning.epilog_restore(HostFS(root), st, "77", log=quiet)
        else:
            out = tuning.restore(HostFS(root), st, all_jobs=True, log=quiet)
        assert out["ok"] and out["last_job"], (n, out)
        assert diff(base, snapshot(root)) == [], f"crash before write {n}"
        assert tuning.status(HostFS(root), st) == {"jobs": [], "changes": [], "boot_id": None,
                                                   "state_dir": str(tmp_path / f"s{n}" / "tuning")}


# ---------------------------------------------------------------- shared nodes

def test_two_overlapping_jobs_last_one_restores(host, state):
    base = snapshot(host.root)
    a = tuning.prolog_tune(host, state, "4242", "governor=performance,thp=never,swappiness=10", SHARED, None,
                           exclusive=False, log=quiet)
    assert a["applied"] == ["governor", "swappiness", "thp"]
    tuned = snapshot(host.root)
    b = tuning.prolog_tune(host, state, "4243", "swappiness=10,thp=always,dirty_ratio=30", SHARED, None,
                           exclusive=False, log=quiet)
    assert b["reused"] == ["swappiness"] and b["applied"] == ["dirty_ratio"]
    thp = item(b, "thp")
    assert thp["action"] == "refused" and thp["holder"] == "4242"
    assert "set by running job 4242 (first job wins)" in thp["reason"]
    st = tuning.status(host, state)
    assert st["jobs"] == ["4242", "4243"]
    holders = {c["key"]: c["holders"] for c in st["changes"]}
    assert holders == {"governor": ["4242"], "swappiness": ["4242", "4243"], "thp": ["4242"],
                       "dirty_ratio": ["4243"]}
    # first job out: nothing node-wide is restored
    out = tuning.epilog_restore(host, state, "4242", log=quiet)
    assert not out["last_job"] and out["remaining_jobs"] == ["4243"] and out["restored"] == []
    now = snapshot(host.root)
    assert diff(tuned, now) == ["proc/sys/vm/dirty_ratio"]   # only B's own change on top of A's
    # last job out restores the baseline recorded by the first job
    out = tuning.epilog_restore(host, state, "4243", log=quiet)
    assert out["last_job"] and out["ok"]
    assert sorted(r["key"] for r in out["restored"]) == ["dirty_ratio", "governor", "swappiness", "thp"]
    assert diff(base, snapshot(host.root)) == []


def test_field_case_18_other_job_still_running(host, state):
    """Field case 18 (docs/field-cases.md): an epilog leaves node-wide settings
    alone while another job on the node still runs."""
    # 4242 tuned the node; 4243 (same user, other GPUs) asked for nothing but runs
    base = snapshot(host.root)
    tuning.prolog_tune(host, state, "4242", "governor=performance,thp=never,swappiness=10", SHARED, None,
                       exclusive=False, log=quiet)
    tuning.prolog_tune(host, state, "4243", None, SHARED, None, exclusive=False, log=quiet)
    tuned = snapshot(host.root)
    out = tuning.epilog_restore(host, state, "4242", log=quiet)
    assert out["remaining_jobs"] == ["4243"] and not out["last_job"]
    assert diff(tuned, snapshot(host.root)) == []
    assert host.read("sys/devices/system/cpu/cpu0/cpufreq/scaling_governor") == "performance"
    out = tuning.epilog_restore(host, state, "4243", log=quiet)
    assert out["last_job"]
    assert diff(base, snapshot(host.root)) == []


def test_orphaned_setting_taken_over_keeps_true_baseline(host, state):
    base = snapshot(host.root)
    tuning.prolog_tune(host, state, "1", "swappiness=10", SHARED, None, exclusive=False, log=quiet)
    tuning.prolog_tune(host, state, "2", None, SHARED, None, exclusive=False, log=quiet)
    # job 1's journal vanished (crash, admin): its value no longer blocks others
    (host.root.parent / "state/tuning/jobs/1.json").unlink()
    rep = tuning.prolog_tune(host, state, "3", "swappiness=30", SHARED, None, exclusive=False, log=quiet)
    assert rep["applied"] == ["swappiness"] and item(rep, "swappiness")["prior"] == "60"
    tuning.epilog_restore(host, state, "2", log=quiet)
    assert host.read("proc/sys/vm/swappiness") == "30"
    tuning.epilog_restore(host, state, "3", log=quiet)
    assert diff(base, snapshot(host.root)) == []


@pytest.mark.parametrize("n_jobs", [2, 6])
def test_concurrent_epilogs_exactly_one_restores(host, state, n_jobs):
    base = snapshot(host.root)
    for j in range(n_jobs):
        tuning.prolog_tune(host, state, str(100 + j), "swappiness=10,thp=never", SHARED, None,
                           exclusive=False, log=quiet)
    barrier = threading.Barrier(n_jobs)
    results, errors = {}, []

    def epilog(j):
        try:
            barrier.wait()
            results[j] = tuning.epilog_restore(HostFS(host.root), state, str(100 + j), log=quiet)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=epilog, args=(j,)) for j in range(n_jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    lasts = [j for j, r in results.items() if r["last_job"]]
    assert len(lasts) == 1
    assert sum(len(r["restored"]) for r in results.values()) == 2
    assert diff(base, snapshot(host.root)) == []


def test_concurrent_epilogs_in_processes(tmp_path):
    import multiprocessing as mp
    root = make_tree(tmp_path / "h")
    state = str(tmp_path / "s")
    host = HostFS(root)
    base = snapshot(root)
    for j in ("11", "12", "13"):
        tuning.prolog_tune(host, state, j, "swappiness=10,dirty_ratio=40", SHARED, None, exclusive=False,
                           log=quiet)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    start = ctx.Event()
    procs = [ctx.Process(target=_proc_epilog, args=(str(root), state, j, start, q)) for j in ("11", "12", "13")]
    for p in procs:
        p.start()
    start.set()
    got = [q.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(30)
    assert sorted(x[1] for x in got) == [False, False, True]
    assert sum(x[2] for x in got) == 2
    assert diff(base, snapshot(root)) == []


def _proc_epilog(root, state, job, start, q):
    start.wait(10)
    r = tuning.epilog_restore(HostFS(root), state, job, log=quiet)
    q.put((job, r["last_job"], len([x for x in r["restored"] if x["result"] == "restored"])))


def test_restore_all_drops_stale_jobs(host, state):
    base = snapshot(host.root)
    tuning.prolog_tune(host, state, "1", "swappiness=10", SHARED, None, exclusive=False, log=quiet)
    tuning.prolog_tune(host, state, "2", "thp=never", SHARED, None, exclusive=False, log=quiet)
    out = tuning.restore(host, state, all_jobs=True, log=quiet)
    assert out["last_job"] and out["remaining_jobs"] == [] and out["ok"]
    assert diff(base, snapshot(host.root)) == []
    assert tuning.status(host, state)["jobs"] == []
    with pytest.raises(InputError):
        tuning.restore(host, state, log=quiet)
    with pytest.raises(InputError):
        tuning.restore(host, state, job_id="1", all_jobs=True, log=quiet)


def test_restore_job_behaves_as_its_epilog(host, state):
    base = snapshot(host.root)
    tuning.prolog_tune(host, state, "1", "swappiness=10", None, None, exclusive=True, log=quiet)
    out = tuning.restore(host, state, job_id="1", log=quiet)
    assert out["last_job"] and diff(base, snapshot(host.root)) == []


def test_journal_from_earlier_boot_is_dropped_not_written(host, state):
    bid = host.root / "proc/sys/kernel/random/boot_id"
    bid.parent.mkdir(parents=True, exist_ok=True)
    bid.write_text("aaaa\n")
    tuning.prolog_tune(host, state, "1", "swappiness=10", None, None, exclusive=True, log=quiet)
    # "reboot": new boot id, and the kernel came up with its own value
    bid.write_text("bbbb\n")
    host.path("proc/sys/vm/swappiness").write_text("30\n")
    logs = []
    out = tuning.restore(host, state, all_jobs=True, log=logs.append)
    assert out["restored"] == [] and host.read("proc/sys/vm/swappiness") == "30"
    assert any("from boot aaaa" in m for m in logs)


# ---------------------------------------------------------------- dry run, status, errors

def test_dry_run_changes_nothing_and_formats(host, tmp_path):
    state = str(tmp_path / "never-created")
    base = snapshot(host.root)
    rep = tuning.prolog_tune(host, state, "1", "governor=performance,thp=bogus", None, None, exclusive=True,
                             dry_run=True, log=quiet)
    assert rep["dry_run"] and rep["planned"] == []  # bad syntax refuses the whole request
    rep = tuning.prolog_tune(host, state, "1", "governor=performance,thp=never,swappiness=60", None, None,
                             exclusive=True, dry_run=True, log=quiet)
    assert rep["planned"] == ["governor", "thp"] and rep["unchanged"] == ["swappiness"]
    text = tuning.format_plan(rep)
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["setting", "action", "value"]
    assert lines[1].split()[:4] == ["governor", "apply", "performance", "request"]
    assert "powersave (4 cpus)" in lines[1]
    assert lines[2].split()[:3] == ["swappiness", "unchanged", "60"]
    assert lines[3].split()[:4] == ["thp", "apply", "never", "request"]
    assert diff(base, snapshot(host.root)) == []
    assert not (tmp_path / "never-created").exists()
    json.dumps(rep)
    assert tuning.format_plan([]) == "tuning: nothing to do\n"


def test_status_is_json_and_formats(host, state):
    tuning.prolog_tune(host, state, "4242", "thp=never", None, None, exclusive=True, log=quiet)
    host.path("sys/kernel/mm/transparent_hugepage/enabled").write_text("[always] madvise never\n")
    st = tuning.status(host, state)
    json.dumps(st)
    (c,) = st["changes"]
    assert (c["key"], c["value"], c["prior"], c["owner"], c["current"], c["in_effect"]) == (
        "thp", "never", "madvise", "4242", "always", False)
    text = tuning.format_status(st)
    assert "thp" in text and "by job 4242" in text and "now reads always" in text


def test_state_dir_unusable_raises_node_error(host, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(NodeError) as ei:
        tuning.prolog_tune(host, str(blocker / "state"), "1", "swappiness=10", None, None, exclusive=True,
                           log=quiet)
    assert "state dir" in str(ei.value)
    (tmp_path / "target").mkdir()
    (tmp_path / "planted").symlink_to(tmp_path / "target")
    with pytest.raises(NodeError):
        tuning.prolog_tune(host, str(tmp_path / "planted"), "1", "swappiness=10", None, None,
                           exclusive=True, log=quiet)
    assert host.read("proc/sys/vm/swappiness") == "60"


def test_corrupt_journal_raises(host, state, tmp_path):
    tuning.prolog_tune(host, state, "1", "swappiness=10", None, None, exclusive=True, log=quiet)
    (tmp_path / "state/tuning/baseline.json").write_text("{not json")
    with pytest.raises(NodeError) as ei:
        tuning.prolog_tune(host, state, "2", "thp=never", None, None, exclusive=True, log=quiet)
    assert "journal unreadable" in str(ei.value)


@pytest.mark.parametrize("job_id", ["../x", "", "a/b", ".hidden", "1\n2"])
def test_bad_job_id(host, state, job_id):
    with pytest.raises(InputError):
        tuning.prolog_tune(host, state, job_id, None, None, None, exclusive=True, log=quiet)


def test_lock_timeout(host, state, monkeypatch):
    import fcntl
    import os
    tuning.prolog_tune(host, state, "1", None, None, None, exclusive=True, log=quiet)
    fd = os.open(host.root.parent / "state/tuning/lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        monkeypatch.setattr(tuning, "LOCK_TIMEOUT_S", 0.05)
        st = tuning._State(state)
        with pytest.raises(NodeError) as ei:
            with st.lock(0.05):
                pass
        assert "lock timeout" in str(ei.value)
    finally:
        os.close(fd)


def test_job_that_asks_nothing_only_registers(host, state, monkeypatch):
    """Most jobs ask nothing: the prolog writes their registration once, in its final
    state, and never touches the baseline; their epilog removes it and writes nothing
    else -- also beside a tuned job, whose entries stay byte for byte."""
    import os
    from pathlib import Path

    writes, fsyncs = [], []
    real_write, real_fsync = tuning._write_json, os.fsync
    monkeypatch.setattr(tuning, "_write_json", lambda p, o, h=None: (writes.append(os.path.basename(p)),
                                                                     real_write(p, o, h)))
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd)))
    rep = tuning.prolog_tune(host, state, "7", None, None, None, exclusive=True, log=quiet)
    assert rep["ok"] and rep["applied"] == [] and writes == ["7.json"]
    job = json.loads((Path(state) / "tuning" / "jobs" / "7.json").read_text())
    assert job["state"] == "applied" and job["holds"] == []
    assert not (Path(state) / "tuning" / "baseline.json").exists()
    assert len(fsyncs) == 2                      # the journal file and its directory
    writes.clear(), fsyncs.clear()
    out = tuning.epilog_restore(host, state, "7", log=quiet)
    assert out["last_job"] and out["ok"] and out["restored"] == [] and writes == []
    assert len(fsyncs) == 0                      # the job journal's removal is not fsync'd; no baseline
    # beside a tuned job: the plain job's prolog and epilog leave the baseline as it was
    tuning.prolog_tune(host, state, "8", "swappiness=10", SHARED, None, exclusive=False, log=quiet)
    baseline = (Path(state) / "tuning" / "baseline.json").read_bytes()
    writes.clear()
    tuning.prolog_tune(host, state, "9", None, SHARED, None, exclusive=False, log=quiet)
    out = tuning.epilog_restore(host, state, "9", log=quiet)
    assert out["remaining_jobs"] == ["8"] and writes == ["9.json"]
    assert (Path(state) / "tuning" / "baseline.json").read_bytes() == baseline
    assert tuning.epilog_restore(host, state, "8", log=quiet)["restored"][0]["key"] == "swappiness"


def test_job_journal_of_an_earlier_boot_does_not_hold_the_node(host, state):
    """A job whose epilog never ran before a reboot (disk-backed state dir, nothing tuned at
    the time, so no baseline to drop with it) must not count as a job on the node after the
    reboot: the next tuned job's epilog restores its settings."""
    from pathlib import Path

    boot = Path(host.root) / "proc/sys/kernel/random/boot_id"
    boot.parent.mkdir(parents=True, exist_ok=True)
    boot.write_text("00000000-2222-3333-4444-555555555555\n")
    base = snapshot(host.root)
    tuning.prolog_tune(host, state, "5", None, None, None, exclusive=True, log=quiet)   # never leaves
    boot.write_text("11111111-2222-3333-4444-555555555555\n")                         # the reboot
    said = []
    rep = tuning.prolog_tune(host, state, "6", "swappiness=10", None, None, exclusive=True, log=said.append)
    assert rep["applied"] == ["swappiness"]
    assert any("job 5's journal is from boot" in m for m in said), said
    out = tuning.epilog_restore(host, state, "6", log=quiet)
    assert out["last_job"] and out["remaining_jobs"] == [] and [r["key"] for r in out["restored"]] == ["swappiness"]
    assert diff(base, snapshot(host.root)) == ["proc/sys/kernel/random/boot_id"]
