"""``gsrun-node doctor``: what this node supports of cstate, irq, hugepages and
memlock, on the H200 VM recording plus the files ``tests/helpers/tuning_tree``
adds (a bare-metal cpuidle tree, the GPU's MSI IRQs, per-node hugepages,
``/dev/cpu_dma_latency``), a fake slurmd in ``proc/`` and slurm.conf variants."""

from __future__ import annotations

import os

import pytest

from gsrun.facts.hostfs import HostFS
from gsrun.admin import doctor
from helpers.tuning_tree import GPU_BDF, GPU_IRQS, add_host_tuning, make_tree

pytestmark = pytest.mark.recorded

LIMITS = """Limit                     Soft Limit           Hard Limit           Units
Max cpu time              unlimited            unlimited            seconds
Max locked memory         {soft}            {hard}            bytes
Max address space         unlimited            unlimited            bytes
"""


def ctx(root, tmp_path, slurm_conf_text=None):
    conf = tmp_path / "slurm" / "slurm.conf"
    if slurm_conf_text is not None:
        conf.parent.mkdir(exist_ok=True)
        conf.write_text(slurm_conf_text)
    return doctor.Context(HostFS(root), config_path=str(tmp_path / "none.toml"), slurm_conf=str(conf),
                          environ={"PATH": ""})


def host(tmp_path, name="h", **kw):
    return add_host_tuning(make_tree(tmp_path / name, swap=False), **kw)


def test_bare_metal_tree_supports_all_three(tmp_path):
    root = host(tmp_path)
    (root / "sys/devices/system/cpu/cpuidle").mkdir(parents=True, exist_ok=True)
    (root / "sys/devices/system/cpu/cpuidle/current_driver").write_text("intel_idle\n")
    hp = root / "sys/devices/system/node/node0/hugepages/hugepages-2048kB"
    (hp / "nr_hugepages").write_text("512\n")
    (hp / "free_hugepages").write_text("500\n")
    c = ctx(root, tmp_path)
    r = doctor.check_cstate(c)
    assert r.status == "ok"
    assert r.detail == ("16 CPUs with idle states (driver intel_idle): POLL 0 us, C1 1 us, C1E 2 us, C6 170 us; "
                        "/dev/cpu_dma_latency present")
    assert r.data["states"][3] == {"state": "state3", "name": "C6", "latency_us": 170}
    r = doctor.check_irq(c)
    n = len(GPU_IRQS)
    assert r.status == "ok", r.detail
    assert r.detail == f"{n + 3} IRQs; {GPU_BDF} {n} MSI IRQs, {n} writable"
    assert r.data["gpus"] == [{"bdf": GPU_BDF, "msi_irqs": list(GPU_IRQS), "writable": list(GPU_IRQS)}]
    r = doctor.check_hugepages(c)
    assert r.status == "ok"
    assert r.detail == "node0: 2M 512 (500 free), 1G 0"
    assert {"node": 0, "size_kb": 2048, "nr": 512, "free": 500} in r.data["pools"]


def test_vm_with_only_cpu_dma_latency(tmp_path):
    root = host(tmp_path, cpuidle=False, irqs=False, hugepages=False)
    r = doctor.check_cstate(ctx(root, tmp_path))
    assert r.status == "ok"
    assert r.detail.startswith("no switchable idle states (cpuidle driver unknown; none in most VMs); "
                               "/dev/cpu_dma_latency present")
    assert "holds /dev/cpu_dma_latency only" in r.hint
    assert doctor.check_irq(ctx(root, tmp_path)).status == "n/a"


def test_neither_cpuidle_nor_dma_latency(tmp_path):
    root = host(tmp_path, cpuidle=False, dma_latency=False)
    r = doctor.check_cstate(ctx(root, tmp_path))
    assert (r.status, r.detail) == ("n/a", "no cpuidle states (driver unknown) and no /dev/cpu_dma_latency")


def test_irqbalance_running_warns_with_the_way_out(tmp_path):
    root = host(tmp_path, irqbalance=True)
    r = doctor.check_irq(ctx(root, tmp_path))
    assert r.status == "warn"
    assert r.detail.endswith("; irqbalance runs (pid 4321) without gsrun's policy script")
    assert r.hint.startswith("irq=local is refused: irqbalance runs without a policy script")
    assert "--policyscript=/usr/local/libexec/gsrun-irqbalance-policy" in r.hint and "ADMIN.md" in r.hint
    assert r.data["irqbalance_uses_gsrun_policy"] is False


def test_irqbalance_with_gsrun_policy_script_is_ok(tmp_path):
    script = "/usr/local/libexec/gsrun-irqbalance-policy"
    root = host(tmp_path, irqbalance=True, irqbalance_args=("-l", script), policy_script=script)
    r = doctor.check_irq(ctx(root, tmp_path))
    assert r.status == "ok", r
    assert r.detail.endswith(f"; irqbalance (pid 4321) uses gsrun's policy script {script}")
    assert r.data["irqbalance_policy_script"] == [script] and r.data["irqbalance_uses_gsrun_policy"] is True


def test_unwritable_affinity_files_are_counted(tmp_path, monkeypatch):
    root = host(tmp_path)
    locked = {str(root / f"proc/irq/{n}/smp_affinity_list") for n in GPU_IRQS[:3]}
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) in locked else real_access(p, mode))
    r = doctor.check_irq(ctx(root, tmp_path))
    assert r.status == "warn"
    assert f"{GPU_BDF} {len(GPU_IRQS)} MSI IRQs, {len(GPU_IRQS) - 3} writable; 3 not writable" in r.detail
    assert r.data["gpus"][0]["writable"] == list(GPU_IRQS[3:])


def test_gpu_without_msi_irqs_warns(tmp_path):
    root = host(tmp_path)
    for n in GPU_IRQS:
        (root / f"sys/bus/pci/devices/{GPU_BDF}/msi_irqs/{n}").unlink()
    r = doctor.check_irq(ctx(root, tmp_path))
    assert r.status == "warn" and f"{GPU_BDF} 0 MSI IRQs, 0 writable" in r.detail


def slurmd(root, soft, hard, pid=777):
    d = root / f"proc/{pid}"
    d.mkdir(parents=True)
    (d / "comm").write_text("slurmd\n")
    (d / "limits").write_text(LIMITS.format(soft=soft, hard=hard))


@pytest.mark.parametrize("conf,soft,status,detail_end,hint_has", [
    # Slurm's default PropagateResourceLimits=ALL: the login shell's limit wins, whatever slurmd has
    ("ClusterName=c\n", "unlimited", "warn",
     "PropagateResourceLimits=ALL (default): jobs get the submitting shell's MEMLOCK limit",
     "PropagateResourceLimitsExcept=MEMLOCK"),
    ("PropagateResourceLimitsExcept=MEMLOCK\n", "unlimited", "ok",
     "PropagateResourceLimits=ALL (default), PropagateResourceLimitsExcept=MEMLOCK", None),
    ("PropagateResourceLimits=NONE\n", "unlimited", "ok", "PropagateResourceLimits=NONE", None),
    ("PropagateResourceLimits=CORE,MEMLOCK\n", "unlimited", "warn",
     "PropagateResourceLimits=CORE,MEMLOCK: jobs get the submitting shell's MEMLOCK limit", "MEMLOCK"),
    ("PropagateResourceLimitsExcept=MEMLOCK\n", "8388608", "warn",
     "PropagateResourceLimits=ALL (default), PropagateResourceLimitsExcept=MEMLOCK", "LimitMEMLOCK=infinity"),
])
def test_memlock_slurmd_and_slurm_conf(tmp_path, conf, soft, status, detail_end, hint_has):
    root = host(tmp_path)
    slurmd(root, soft, "unlimited" if soft == "unlimited" else soft)
    r = doctor.check_memlock(ctx(root, tmp_path, conf))
    assert r.status == status, r.detail
    assert r.detail.startswith(f"slurmd pid 777: RLIMIT_MEMLOCK soft {soft}, hard ")
    assert r.detail.endswith(detail_end + "; " + NO_RDMA)
    assert r.data["slurmd_memlock"][0] == soft and r.data["rdma_devices"] == []
    if hint_has:
        assert hint_has in r.hint
    else:
        assert r.hint == ""


def test_memlock_without_slurmd(tmp_path):
    root = host(tmp_path)
    r = doctor.check_memlock(ctx(root, tmp_path, "PropagateResourceLimitsExcept=MEMLOCK\n"))
    assert r.status == "ok"
    assert r.detail.startswith("slurmd: n/a (not running here); PropagateResourceLimits=ALL (default)")
    r = doctor.check_memlock(ctx(root, tmp_path / "x"))
    assert r.status == "n/a" and r.detail.endswith("slurm.conf unreadable; " + NO_RDMA)


NO_RDMA = "no RDMA devices (/sys/class/infiniband, /dev/infiniband/uverbs*)"


def test_memlock_soft_below_unlimited_hard_is_fine_the_task_raises_it(tmp_path):
    root = host(tmp_path)
    slurmd(root, "65536", "unlimited")
    r = doctor.check_memlock(ctx(root, tmp_path, "PropagateResourceLimitsExcept=MEMLOCK\n"))
    assert r.status == "ok" and r.hint == ""
    assert "soft 65536, hard unlimited (gsrun-bind raises each task's soft limit to the hard one)" in r.detail


def test_memlock_warning_names_the_rdma_devices(tmp_path):
    """An HDR InfiniBand node: two mlx5 ports in sysfs, their uverbs nodes in /dev."""
    root = host(tmp_path)
    slurmd(root, "8388608", "8388608")
    for n in ("mlx5_0", "mlx5_1"):
        (root / "sys/class/infiniband" / n).mkdir(parents=True)
    r = doctor.check_memlock(ctx(root, tmp_path, "PropagateResourceLimitsExcept=MEMLOCK\n"))
    assert r.status == "warn" and r.detail.endswith("; RDMA devices: mlx5_0, mlx5_1")
    assert "LimitMEMLOCK=infinity" in r.hint and "RDMA registrations" in r.hint


def test_parse_memlock_and_propagation_rules():
    assert doctor.parse_memlock(LIMITS.format(soft="65536", hard="unlimited")) == ("65536", "unlimited")
    assert doctor.parse_memlock("Max cpu time  unlimited  unlimited  seconds\n") is None
    assert doctor.parse_memlock(None) is None
    prop = doctor.memlock_propagated
    assert prop({}) is True
    assert prop({"propagateresourcelimits": "ALL"}) is True
    assert prop({"propagateresourcelimits": "NONE"}) is False
    assert prop({"propagateresourcelimits": "nofile,memlock"}) is True
    assert prop({"propagateresourcelimitsexcept": "CORE,MEMLOCK"}) is False
    assert prop({"propagateresourcelimitsexcept": "CORE"}) is True
