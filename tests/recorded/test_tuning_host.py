"""cstate, irq and hugepages against fake host trees: get/set,
verify, restore byte for byte, refusals with their reasons, and the sampler's
hold of /dev/cpu_dma_latency."""

from __future__ import annotations

import errno
import os
import subprocess

import pytest

from gsrun.facts.hostfs import HostFS
from gsrun.node import cpu_latency, tuning
from gsrun.request.config import parse_config
from gsrun.request.tune import parse_hugepages, parse_tune_request
from gsrun.base.errors import InputError
from helpers.tuning_tree import (GPU_BDF, GPU_IRQS, CountingHostFS, add_host_tuning, diff, make_tree, snapshot)

SCOPE = tuning.JobScope([{"bdf": GPU_BDF, "kind": "gpu", "name": "0", "numa_node": None}],
                        list(range(4, 12)), {0: list(range(16))}, "test")
Q = lambda m: None  # noqa: E731


@pytest.fixture
def root(tmp_path):
    return add_host_tuning(make_tree(tmp_path / "host", swap=False))


def tune(root, state, req, exclusive=True, scope=SCOPE, hostfs=None, cfg=None):
    return tuning.prolog_tune(hostfs or HostFS(root), str(state), "77", req, cfg, None, exclusive, log=Q, scope=scope)


def test_parser_accepts_the_new_keys_and_rejects_bad_values():
    assert parse_tune_request("cstate=c1,irq=local,hugepages=1G:16") == {
        "cstate": "c1", "irq": "local", "hugepages": "1G:16"}
    assert parse_hugepages("2M:1024") == (2048, 1024)
    for bad in ("cstate=c6", "irq=all", "hugepages=4M:1", "hugepages=1G:4097", "hugepages=2M:0", "hugepages=2M"):
        with pytest.raises(InputError, match="bad tuning request"):
            parse_tune_request(bad)


@pytest.mark.parametrize("level,disabled", [("off", ("C1", "C1E", "C6")), ("c1", ("C1E", "C6")),
                                            ("shallow", ("C6",))])
def test_cstate_disables_the_deeper_states_and_restores(root, tmp_path, level, disabled):
    base = snapshot(root)
    r = tune(root, tmp_path / "s", f"cstate={level}")
    assert r["applied"] == ["cstate"], r
    assert r["holds"] == {"cpu_dma_latency_us": tuning.cstate_hold_us(level)}
    for c in (0, 15):
        for k, name in enumerate(("POLL", "C1", "C1E", "C6")):
            got = (root / f"sys/devices/system/cpu/cpu{c}/cpuidle/state{k}/disable").read_text().strip()
            assert got == ("1" if name in disabled else "0"), (c, name)
    st = tuning.status(HostFS(root), str(tmp_path / "s"))
    assert [(c["key"], c["in_effect"]) for c in st["changes"]] == [("cstate", True)]
    out = tuning.epilog_restore(HostFS(root), str(tmp_path / "s"), "77", log=Q)
    assert out["ok"] and diff(base, snapshot(root)) == []


def test_cstate_without_cpuidle_is_the_dma_latency_hold_only(tmp_path):
    root = add_host_tuning(make_tree(tmp_path / "vm", swap=False), cpuidle=False)
    r = tune(root, tmp_path / "s", "cstate=shallow")
    item = r["items"][0]
    assert item["action"] == "unsupported" and "cpuidle" in item["reason"]
    assert "held at 10 us by the job's sampler" in item["reason"]
    assert r["holds"] == {"cpu_dma_latency_us": 10}
    os.unlink(root / "dev/cpu_dma_latency")
    assert tune(root, tmp_path / "s2", "cstate=shallow")["holds"] == {}


def test_cstate_refused_for_a_shared_node_holds_nothing(root, tmp_path):
    r = tune(root, tmp_path / "s", "cstate=off", exclusive=False)
    assert r["refused"] == ["cstate"] and r["holds"] == {}
    assert "exclusively" in r["items"][0]["reason"]


def test_irq_local_pins_the_gpu_irqs_to_job_cpus_of_its_node(root, tmp_path):
    base = snapshot(root)
    r = tune(root, tmp_path / "s", "irq=local")
    assert r["applied"] == ["irq"], r
    for n in GPU_IRQS:
        assert (root / f"proc/irq/{n}/smp_affinity_list").read_text() == "4-11\n"
    assert (root / "proc/irq/24/smp_affinity_list").read_text() == "0-15\n"     # not the job's device
    entry = tuning.status(HostFS(root), str(tmp_path / "s"))["changes"][0]
    assert entry["prior"] == {str(n): "0-15" for n in GPU_IRQS} and entry["in_effect"]
    assert tuning.restore(HostFS(root), str(tmp_path / "s"), all_jobs=True, log=Q)["ok"]
    assert diff(base, snapshot(root)) == []


def test_irq_multi_node_host_uses_the_device_node_and_skips_unknown(root, tmp_path):
    nic = {"bdf": "0000:41:00.0", "kind": "nic", "name": "mlx5_0", "numa_node": 1}
    (root / "sys/bus/pci/devices/0000:41:00.0/msi_irqs").mkdir(parents=True)
    (root / "sys/bus/pci/devices/0000:41:00.0/msi_irqs/24").write_text("msix\n")
    scope = tuning.JobScope([{**SCOPE.devices[0], "numa_node": None}, nic], list(range(16)),
                            {0: list(range(8)), 1: list(range(8, 16))})
    r = tune(root, tmp_path / "s", "irq=local", scope=scope)
    item = r["items"][0]
    assert item["action"] == "applied"
    assert f"{GPU_BDF}: NUMA node unknown" in item["reason"]
    assert (root / "proc/irq/24/smp_affinity_list").read_text() == "8-15\n"
    assert (root / f"proc/irq/{GPU_IRQS[0]}/smp_affinity_list").read_text() == "0-15\n"


def test_irq_kernel_managed_irq_is_skipped_with_the_reason(root, tmp_path):
    h = CountingHostFS(root, fail_path=f"proc/irq/{GPU_IRQS[0]}/smp_affinity_list", fail_errno=errno.EIO)
    r = tune(root, tmp_path / "s", "irq=local", hostfs=h)
    item = r["items"][0]
    assert item["action"] == "applied", item
    assert f"IRQ {GPU_IRQS[0]}: EIO (kernel-managed or not movable)" in item["reason"]
    entry = tuning.status(HostFS(root), str(tmp_path / "s"))["changes"][0]
    assert str(GPU_IRQS[0]) not in entry["target"] and entry["in_effect"]


def test_irq_refused_while_irqbalance_runs(tmp_path):
    root = add_host_tuning(make_tree(tmp_path / "h", swap=False), irqbalance=True)
    base = snapshot(root)
    r = tune(root, tmp_path / "s", "irq=local")
    assert r["refused"] == ["irq"]
    assert r["items"][0]["reason"] == (
        "irqbalance runs without a policy script and would move the IRQs back within 10 s; fix: start it with "
        "--policyscript=/usr/local/libexec/gsrun-irqbalance-policy (gsrun-node install puts the script there; "
        "docs/ADMIN.md, irqbalance), or stop it on exclusive GPU nodes")
    assert diff(base, snapshot(root)) == []


def test_irq_without_gpu_is_unsupported(root, tmp_path):
    r = tune(root, tmp_path / "s", "irq=local", scope=tuning.JobScope([], [0], {0: [0]}))
    assert r["unsupported"] == ["irq"] and "no GPU of the job" in r["items"][0]["reason"]


def test_hugepages_reserved_on_the_gpu_node_and_restored(root, tmp_path):
    base = snapshot(root)
    r = tune(root, tmp_path / "s", "hugepages=2M:1024")
    assert r["applied"] == ["hugepages"], r
    nr = root / "sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages"
    assert nr.read_text() == "1024\n"
    assert tuning.epilog_restore(HostFS(root), str(tmp_path / "s"), "77", log=Q)["ok"]
    assert diff(base, snapshot(root)) == []


def test_hugepages_larger_than_node_free_memory_is_refused_with_figures(tmp_path):
    root = add_host_tuning(make_tree(tmp_path / "h", swap=False), node_free_kb=1_000_000)
    r = tune(root, tmp_path / "s", "hugepages=2M:1024")
    assert r["refused"] == ["hugepages"]
    assert r["items"][0]["reason"] == ("2M:1024 on NUMA node 0 needs 2097152 kB more (1024 pages of 2048 kB), "
                                       "MemFree there is 1000000 kB")


def test_hugepages_shortfall_is_stated_and_nothing_rolls_back(root, tmp_path):
    base = snapshot(root)
    h = CountingHostFS(root, drop_writes="hugepages-1048576kB/nr_hugepages")
    r = tune(root, tmp_path / "s", "cstate=c1,hugepages=1G:2", hostfs=h)
    hp = next(i for i in r["items"] if i["key"] == "hugepages")
    assert hp["action"] == "applied" and r["rolled_back"] == [], hp
    assert "short: node0/1048576: got 0 of 2 pages" in hp["reason"] and "3 retries" in hp["reason"], hp
    # one compaction, then the bounded retries: 1 + 3 writes of the pool
    assert sum(w.endswith("hugepages-1048576kB/nr_hugepages") for w in h.writes) == 1 + tuning.ALLOC_RETRIES
    assert tuning.epilog_restore(HostFS(root), str(tmp_path / "s"), "77", log=Q)["ok"]
    assert diff(base, snapshot(root)) == []


def test_hugepages_never_lowers_a_bigger_pool(root, tmp_path):
    nr = root / "sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages"
    nr.write_text("4096\n")
    r = tune(root, tmp_path / "s", "hugepages=2M:1024")
    assert r["unchanged"] == ["hugepages"] and nr.read_text() == "4096\n"


def test_allowed_keys_and_defaults_cover_the_new_keys(root, tmp_path):
    cfg = parse_config('[tuning]\ndefaults = "hugepages=2M:8"\nallowed_keys = ["governor"]\n')
    r = tune(root, tmp_path / "s", "irq=local", cfg=cfg)
    by = {i["key"]: i for i in r["items"]}
    assert by["irq"]["action"] == "refused" and "allowed_keys" in by["irq"]["reason"]
    assert by["hugepages"]["action"] == "applied" and by["hugepages"]["source"] == "default"


def test_sampler_holds_dma_latency_under_host_root_without_writing(root, tmp_path):
    fd, note = cpu_latency.hold(HostFS(root), 0)
    try:
        assert fd is not None and os.readlink(f"/proc/self/fd/{fd}") == str(root / "dev/cpu_dma_latency")
        assert (root / "dev/cpu_dma_latency").read_bytes() == b""
        assert note.startswith("cpu_dma_latency held at 0 us")
    finally:
        os.close(fd)
    assert cpu_latency.hold(HostFS(root), -1)[0] is None
    os.unlink(root / "dev/cpu_dma_latency")
    fd, note = cpu_latency.hold(HostFS(root), 0)
    assert fd is None and "absent" in note


def test_the_node_monitor_holds_the_fd_from_job_begin_to_job_end(root, tmp_path):
    from gsrun.base.paths import Paths
    from gsrun.node.monitor import Monitor
    from gsrun.request.config import load_config_or_defaults

    class _Err:
        error = staticmethod(print)

    paths = Paths(str(tmp_path / "st"), str(tmp_path / "sp"), str(tmp_path / "mps"))
    mon = Monitor(HostFS(root), paths, load_config_or_defaults(_Err))
    want = str(root / "dev/cpu_dma_latency")

    def held() -> int:
        return sum(1 for f in os.listdir("/proc/self/fd") if _link(f"/proc/self/fd/{f}") == want)

    before = held()
    out = mon.begin({"job_id": "77", "uid": os.getuid(), "node": "n1", "gpus": [], "dma_latency_us": 1})
    assert out["ok"] and out["notes"][0].startswith("cpu_dma_latency held at 1 us")
    assert held() == before + 1
    assert mon.end("77")["stopped"] == "stopped"
    assert held() == before
    mon.close()
    assert (root / "dev/cpu_dma_latency").read_bytes() == b""


def _link(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


# ---------------------------------------------------------------- irqbalance with gsrun's policy script

POLICY = "/usr/local/libexec/gsrun-irqbalance-policy"
BAN = "run/gsrun/irqbalance-ban"


def irqbalance_tree(tmp_path, args=(f"--policyscript={POLICY}",), env="", script=POLICY):
    root = add_host_tuning(make_tree(tmp_path / "h", swap=False), irqbalance=True,
                           irqbalance_args=("--foreground", *args), irqbalance_env=env, policy_script=script)
    (root / "run/gsrun").mkdir(parents=True, exist_ok=True)      # the node's state dir (tmpfs, always there)
    return root


@pytest.mark.parametrize("argv,want", [
    (["irqbalance", "--policyscript=/p/s"], "/p/s"), (["irqbalance", "--policyscript", "/p/s"], "/p/s"),
    (["irqbalance", "-f", "-l", "/p/s"], "/p/s"), (["irqbalance", "-l/p/s"], "/p/s"),
    (["irqbalance", "--foreground"], None), (["irqbalance", "-l"], None), ([], None)])
def test_policy_script_from_irqbalance_cmdline(tmp_path, argv, want):
    (tmp_path / "proc/7").mkdir(parents=True)
    (tmp_path / "proc/7/cmdline").write_text("\0".join(argv) + ("\0" if argv else ""))
    assert tuning.irqbalance_policy_script(HostFS(tmp_path), 7) == want


def test_irq_with_our_policy_script_bans_pins_and_restores_byte_exact(tmp_path):
    root = irqbalance_tree(tmp_path)
    base = snapshot(root)
    r = tune(root, tmp_path / "s", "irq=local")
    it = r["items"][0]
    assert r["applied"] == ["irq"], r
    assert it["reason"] == ("8 IRQs banned from irqbalance (ban files for its policy script); "
                            "irqbalance rescan not signalled (host root)")
    assert sorted(int(n) for n in os.listdir(root / BAN)) == list(GPU_IRQS)
    assert oct((root / BAN).stat().st_mode & 0o777) == "0o755"
    for n in GPU_IRQS:
        assert (root / f"proc/irq/{n}/smp_affinity_list").read_text() == "4-11\n"
    # the policy script, run as irqbalance runs it, now bans a non-GPU IRQ named there too
    (root / BAN / "24").write_text("")
    out = subprocess.run(["/bin/sh", "-c", f"{root}{POLICY} {root}/sys/bus/pci/devices/none 24"],
                         env={"PATH": "/usr/bin:/bin", "GSRUN_IRQ_BAN_DIR": str(root / BAN)},
                         capture_output=True, text=True, timeout=30)
    assert out.stdout == "ban=true\n"
    os.unlink(root / BAN / "24")
    entry = tuning.status(HostFS(root), str(tmp_path / "s"))["changes"][0]
    assert entry["prior"][f"ban:/{BAN}/{GPU_IRQS[0]}"] == "absent" and entry["in_effect"]
    assert tuning.epilog_restore(HostFS(root), str(tmp_path / "s"), "77", log=Q)["ok"]
    assert diff(base, snapshot(root)) == []


def test_irq_refused_with_another_policy_script_or_ban_dir_or_a_missing_script(tmp_path):
    cases = [
        (dict(args=("-l", "/etc/irqbalance/other.sh")), "irqbalance runs with policy script /etc/irqbalance/other.sh "
                                                        "and would move the IRQs back within 10 s; fix: start it"),
        (dict(script=None), f"irqbalance runs with --policyscript={POLICY}, which is missing; "
                            "fix: gsrun-node install"),
        (dict(env="PATH=/bin\0GSRUN_IRQ_BAN_DIR=/var/ban\0"),
         "irqbalance runs with GSRUN_IRQ_BAN_DIR=/var/ban, not tuning.irqbalance_ban_dir /run/gsrun/irqbalance-ban"),
    ]
    for i, (kw, want) in enumerate(cases):
        root = irqbalance_tree(tmp_path / str(i), **kw)
        base = snapshot(root)
        r = tune(root, tmp_path / f"s{i}", "irq=local")
        assert r["refused"] == ["irq"] and r["items"][0]["reason"].startswith(want), r["items"][0]["reason"]
        assert diff(base, snapshot(root)) == []


def test_irq_ban_dir_from_the_config_and_restore_finds_it_in_the_journal(tmp_path):
    root = irqbalance_tree(tmp_path, env="GSRUN_IRQ_BAN_DIR=/run/site-ban\0")
    base = snapshot(root)
    cfg = parse_config('[tuning]\nirqbalance_ban_dir = "/run/site-ban"\n')
    r = tune(root, tmp_path / "s", "irq=local", cfg=cfg)
    assert r["applied"] == ["irq"], r
    assert sorted(int(n) for n in os.listdir(root / "run/site-ban")) == list(GPU_IRQS)
    # restore without the config (gsrun-node restore on a node whose config changed since)
    assert tuning.restore(HostFS(root), str(tmp_path / "s"), all_jobs=True, log=Q)["ok"]
    assert diff(base, snapshot(root)) == []
    with pytest.raises(InputError):
        tuning.KNOBS["irq"].configure(None, "/run/../etc")


def test_irq_crash_at_every_write_with_irqbalance_then_restore(tmp_path, monkeypatch):
    from helpers.tuning_tree import Crash

    real_ban = tuning._write_ban

    def counting_ban(h, rel, note):         # ban files count as writes of the fault injection too
        if h.crash_after is not None and len(h.writes) >= h.crash_after:
            raise Crash(f"killed before write {len(h.writes)}")
        h.writes.append(rel)
        real_ban(h, rel, note)

    monkeypatch.setattr(tuning, "_write_ban", counting_ban)
    probe = CountingHostFS(irqbalance_tree(tmp_path / "probe"))
    tune(probe.root, tmp_path / "ps", "irq=local,hugepages=2M:16", hostfs=probe)
    total = len(probe.writes)
    assert total == 2 * len(GPU_IRQS) + 1        # 8 ban files, 8 masks, 1 hugepages count
    for n in range(total + 1):
        root = irqbalance_tree(tmp_path / f"h{n}")
        st = tmp_path / f"s{n}"
        base = snapshot(root)
        host = CountingHostFS(root, crash_after=n)
        if n < total:
            with pytest.raises(Crash):
                tune(root, st, "irq=local,hugepages=2M:16", hostfs=host)
        else:
            tune(root, st, "irq=local,hugepages=2M:16", hostfs=host)
        if n:
            assert diff(base, snapshot(root)) != [], n
        out = tuning.restore(HostFS(root), str(st), all_jobs=True, log=Q)
        assert out["ok"], (n, out)
        assert diff(base, snapshot(root)) == [], f"crash before write {n}"
        assert tuning.status(HostFS(root), str(st))["changes"] == []
