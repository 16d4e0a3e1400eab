"""The binding plan (pure decisions) on every recorded host + field cases.

Field cases are described in docs/field-cases.md; ``test_caseN_...`` names the
field case a test proves, and the recorded hosts ``case4-l4`` and ``case7-mixed``
(tests/data/hosts/) are the inputs of field cases 4 and 7."""

import pytest

from helpers.paths import DATA
from gsrun.bind.plan import (FOREIGN_GPU_VARS, exec_argv, make_plan, ntasks_from_env, plan_from_env,
                           rank_env, render_table)
from gsrun.base.cpulist import parse_cpulist
from gsrun.base.errors import InputError, TopologyError
from gsrun.facts.hostfs import HostFS
from gsrun.facts.topology import read_topology

HOSTS = DATA / "hosts"
ALL_HOSTS = ["h200-vm", "server-2s8g", "amd-nps4", "vm-numa-minus1", "cpuset-job", "case4-l4",
             "case7-mixed", "ci-emulated", "numa-memless", "vm-spread"]
ALLOWED = {"cpuset-job": parse_cpulist("0-15,56-71")}


def host(name):
    fs = HostFS(HOSTS / name)
    return fs, read_topology(fs)


def plan(name, env, allowed=None, iso=False):
    fs, t = host(name)
    return plan_from_env(env, fs, allowed or ALLOWED.get(name), iso, topology=t), t


def all_gpus_env(t, n):
    minors = [g.minor for g in t.gpus] or [0, 1, 2, 3]
    return {"SLURM_STEP_GPUS": ",".join(map(str, sorted(minors))), "SLURM_NTASKS_PER_NODE": str(n)}


@pytest.mark.parametrize("name", ALL_HOSTS)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 9, 16])
def test_invariants(name, n):
    fs, t = host(name)
    allowed = ALLOWED.get(name, list(t.cpus_online))
    p = plan_from_env(all_gpus_env(t, n), fs, allowed, topology=t)
    assert len(p.ranks) == n
    seen = set()
    for r in p.ranks:
        assert r.cpus, "empty CPU set"
        assert set(r.cpus) <= set(allowed), "CPU outside the allowed set"
        assert r.env["OMP_NUM_THREADS"] == str(len(r.cpus))
        assert parse_cpulist(r.env["GSRUN_BIND_CPUS"]) == list(r.cpus)
        assert -1 not in r.mem_nodes and r.numa_node != -1
        if len(allowed) >= n:
            assert not seen & set(r.cpus), "overlap although CPUs suffice"
        seen |= set(r.cpus)
        # whole cores before SMT siblings: with enough cores, a rank never
        # holds only part of a core that another rank also uses
    # whole cores before SMT siblings: a rank split "by whole cores" holds
    # every allowed thread of each core it touches, and no core is shared
    owner = {}
    for r in p.ranks:
        if "whole cores" not in r.reason:
            continue
        for core in t.cores:
            part = set(core) & set(allowed)
            if part & set(r.cpus):
                assert part <= set(r.cpus), f"rank {r.local_rank} holds part of core {core}"
                assert owner.setdefault(core, r.local_rank) == r.local_rank, f"core {core} shared"


def test_whole_cores_before_siblings_server():
    p, t = plan("server-2s8g", {"SLURM_STEP_GPUS": "0", "SLURM_NTASKS_PER_NODE": "1"})
    # 1 rank on node0: all 16 cores with both threads
    assert p.ranks[0].cpus == tuple(parse_cpulist("0-15,32-47"))
    p, t = plan("server-2s8g", {"SLURM_STEP_GPUS": "0,1,2,3", "SLURM_NTASKS_PER_NODE": "4"})
    for r in p.ranks:
        cores = {c for c in t.cores if set(c) & set(r.cpus)}
        assert len(cores) == 4 and all(set(c) <= set(r.cpus) for c in cores)


def test_smt_split_by_thread_when_fewer_cores_than_ranks():
    # cpuset 0-1,32-33 = 2 cores x 2 threads, 3 ranks on node0
    p, t = plan("server-2s8g", {"SLURM_STEP_GPUS": "0,1,2", "SLURM_NTASKS_PER_NODE": "3"},
                allowed=[0, 1, 32, 33])
    got = [r.cpus for r in p.ranks]
    assert sorted(c for cs in got for c in cs) == [0, 1, 32, 33]
    assert got[0] == (0,) and got[1] == (32,) and got[2] == (1, 33)  # core-major thread order
    assert "split by hardware thread" in p.ranks[0].reason


def test_ci_emulated_two_cpus_four_ranks_round_robin():
    env = {"SLURM_JOB_GPUS": "0,1,2,3", "CUDA_VISIBLE_DEVICES": "0,1,2,3",
           "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_NODEID": "1", "SLURM_LOCALID": "2"}
    p, t = plan("ci-emulated", env, allowed=[0, 1])
    assert [r.cpus for r in p.ranks] == [(0,), (1,), (0,), (1,)]
    for r in p.ranks:
        assert r.gpu.index == r.local_rank and r.gpu.uuid is None and r.gpu.pci_bus_id is None
        assert "round-robin" in r.reason and "unknown/emulated" in r.reason
        assert r.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
        assert r.env["LOCAL_WORLD_SIZE"] == "4"
        assert r.mem_nodes == (0,)
    # single node: numactl would be pointless
    assert exec_argv(p.ranks[0], p.host_nodes, ["true"], numactl="/usr/bin/numactl") == ["true"]


def test_ci_emulated_two_ranks_get_one_cpu_each():
    p, _ = plan("ci-emulated", {"SLURM_JOB_GPUS": "0,1", "SLURM_NTASKS_PER_NODE": "2"}, allowed=[0, 1])
    assert [r.cpus for r in p.ranks] == [(0,), (1,)]
    assert all("round-robin" not in r.reason for r in p.ranks)


def test_case3_cpuset_excludes_gpu_node():
    p, t = plan("cpuset-job", {"SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7", "SLURM_NTASKS_PER_NODE": "8"})
    allowed = set(parse_cpulist("0-15,56-71"))
    for r in p.ranks[4:]:
        assert f"GPU {r.local_rank} has no local CPUs in allocation" in r.reason
        assert r.mem_nodes == (0,) and r.numa_node == 0
    union = [c for r in p.ranks for c in r.cpus]
    assert sorted(union) == sorted(allowed)  # disjoint, all used, 4 CPUs each
    assert all(len(r.cpus) == 4 for r in p.ranks)


def test_case3_variant_several_gpus_share_a_node():
    # GPU1-4 on one node: disjoint near-equal slices, not the same CPUs for all
    p, _ = plan("server-2s8g", {"SLURM_JOB_GPUS": "0,1,2", "SLURM_NTASKS_PER_NODE": "3"})
    sizes = [len(r.cpus) for r in p.ranks]
    assert sum(sizes) == 32 and max(sizes) - min(sizes) <= 2
    assert len({c for r in p.ranks for c in r.cpus}) == 32


def test_spill_to_nearest_node_only_when_needed():
    # node0 contributes 2 CPUs, node1 all of its 32: 4 ranks on node0 GPUs
    allowed = [0, 32] + parse_cpulist("16-31,48-63")
    p, _ = plan("server-2s8g", {"SLURM_JOB_GPUS": "0,1,2,3", "SLURM_NTASKS_PER_NODE": "4"}, allowed)
    assert [r.numa_node for r in p.ranks] == [0, 0, 1, 1]
    assert "spilled to nearest node 1" in p.ranks[3].reason
    assert not set(p.ranks[0].cpus) & set(p.ranks[1].cpus)


def test_case1_unknown_node_no_membind_and_no_overlap():
    p, t = plan("vm-numa-minus1", {"SLURM_JOB_GPUS": "0,1,2,3", "SLURM_NTASKS_PER_NODE": "4"})
    r3 = p.ranks[3]
    assert r3.numa_node is None and r3.mem_nodes == ()
    assert "no NUMA locality" in r3.reason
    assert exec_argv(r3, p.host_nodes, ["x"], numactl="/usr/bin/numactl") == ["x"]
    assert p.ranks[0].numa_node == 0 and p.ranks[2].numa_node == 1
    assert exec_argv(p.ranks[2], p.host_nodes, ["x"], numactl="/n") == ["/n", "--membind=1", "--", "x"]
    cpus = [c for r in p.ranks for c in r.cpus]
    assert len(cpus) == len(set(cpus))


def test_membind_skipped_outside_allowed_mems():
    p, _ = plan("server-2s8g", {"SLURM_JOB_GPUS": "4", "SLURM_NTASKS_PER_NODE": "1"})
    assert exec_argv(p.ranks[0], 2, ["x"], allowed_mems=[0], numactl="/n") == ["x"]
    assert exec_argv(p.ranks[0], 2, ["x"], allowed_mems=[0, 1], numactl="/n")[:2] == ["/n", "--membind=1"]


def test_case8_gres_index_is_minor_number():
    p, _ = plan("amd-nps4", {"SLURM_JOB_GPUS": "0", "SLURM_NTASKS_PER_NODE": "1"})
    r = p.ranks[0]
    assert r.gpu.pci_bus_id == "0000:c1:00.0" and r.gpu.index == 0
    assert r.numa_node == 7 and set(r.cpus) == set(parse_cpulist("56-63,120-127"))
    # CUDA ordinal 0 in PCI order would be 0000:01:00.0: the UUID is used instead
    assert r.env["CUDA_VISIBLE_DEVICES"] == r.gpu.uuid


def test_case9_physical_4_5_written_as_local_0_1():
    env = {"SLURM_JOB_GPUS": "4,5", "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_NTASKS_PER_NODE": "2"}
    p, _ = plan("server-2s8g", env)
    assert [r.gpu.index for r in p.ranks] == [4, 5]
    assert all(r.numa_node == 1 for r in p.ranks)
    assert [r.env["CUDA_VISIBLE_DEVICES"] for r in p.ranks] == ["0,1", "0,1"]
    pi, _ = plan("server-2s8g", env, iso=True)
    assert [r.env["CUDA_VISIBLE_DEVICES"] for r in pi.ranks] == ["0", "1"]
    assert not any("4" in r.env["CUDA_VISIBLE_DEVICES"] for r in p.ranks + pi.ranks)


def test_case7_job_gpu_1_with_local_cvd_0():
    p, _ = plan("case7-mixed", {"SLURM_JOB_GPUS": "1", "CUDA_VISIBLE_DEVICES": "0",
                                "SLURM_NTASKS_PER_NODE": "1"})
    r = p.ranks[0]
    assert r.gpu.pci_bus_id == "0000:65:00.0" and r.gpu.uuid.startswith("GPU-bbbbbbbb")
    assert r.numa_node == 1 and r.cpus == tuple(range(8, 16))
    assert r.env["CUDA_VISIBLE_DEVICES"] == "0"


def test_case10_device_order_default_and_user_value_kept_with_warning():
    env = {"SLURM_JOB_GPUS": "1", "CUDA_VISIBLE_DEVICES": "1", "SLURM_NTASKS_PER_NODE": "1"}
    p, _ = plan("case7-mixed", env)
    assert p.ranks[0].env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert p.ranks[0].env["CUDA_VISIBLE_DEVICES"] == "1"  # PCI ordinal 1 is the A5000
    p2, _ = plan("case7-mixed", dict(env, CUDA_DEVICE_ORDER="FASTEST_FIRST"))
    r = p2.ranks[0]
    assert r.env["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"
    assert any("CUDA_DEVICE_ORDER=FASTEST_FIRST kept" in w for w in p2.warnings)
    # an ordinal under FASTEST_FIRST may name the other GPU: the UUID is exact
    assert r.env["CUDA_VISIBLE_DEVICES"] == "GPU-bbbbbbbb-1111-2222-3333-444444444444"


def test_case11_uuid_and_mig_forms_resolve_to_parent():
    u = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
    for cvd in (u, "GPU-bbbbbbbb", f"MIG-{u}/1/2"):
        p, _ = plan("case7-mixed", {"CUDA_VISIBLE_DEVICES": cvd})
        r = p.ranks[0]
        assert r.gpu.pci_bus_id == "0000:65:00.0" and r.numa_node == 1, cvd
        assert r.env["CUDA_VISIBLE_DEVICES"] == cvd


def test_case11_new_mig_uuid_unknown_parent_still_plans():
    p, _ = plan("case7-mixed", {"CUDA_VISIBLE_DEVICES": "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"})
    r = p.ranks[0]
    assert r.gpu.pci_bus_id is None and r.numa_node is None and r.cpus
    assert any("MIG UUID" in w for w in p.warnings)


def test_case11_ambiguous_prefix_is_an_error():
    with pytest.raises(TopologyError) as e:
        plan("server-2s8g", {"CUDA_VISIBLE_DEVICES": "GPU-5e5e000"})
    assert "ambiguous" in str(e.value) and "hint:" in str(e.value)


def test_case11_foreign_vars_unset_on_nvidia_steps():
    p, _ = plan("h200-vm", {"SLURM_JOB_GPUS": "0", "ROCR_VISIBLE_DEVICES": "0", "GPU_DEVICE_ORDINAL": "0"})
    assert set(p.ranks[0].unset) == set(FOREIGN_GPU_VARS)
    assert "ROCR_VISIBLE_DEVICES" not in rank_env(p, 0)


def test_case11_empty_cvd_means_no_gpus_not_all():
    p, _ = plan("server-2s8g", {"CUDA_VISIBLE_DEVICES": "", "SLURM_NTASKS_PER_NODE": "2"})
    assert all(r.gpu is None for r in p.ranks)
    assert all("CUDA_VISIBLE_DEVICES" not in r.env for r in p.ranks)


def test_more_ranks_than_gpus_round_robin_and_local_rank_selects():
    p, _ = plan("server-2s8g", {"SLURM_JOB_GPUS": "0,1", "SLURM_NTASKS_PER_NODE": "4"})
    assert [r.gpu.index for r in p.ranks] == [0, 1, 0, 1]
    for r in p.ranks:
        vis = r.env["CUDA_VISIBLE_DEVICES"].split(",")
        assert vis[r.local_rank % len(vis)] == r.gpu.uuid


def test_more_gpus_than_ranks_isolation_gives_blocks():
    p, _ = plan("server-2s8g", {"SLURM_JOB_GPUS": "0,1,2,3", "SLURM_NTASKS_PER_NODE": "2"}, iso=True)
    assert [[g.index for g in r.gpus] for r in p.ranks] == [[0, 2], [1, 3]]
    assert len(p.ranks[0].env["CUDA_VISIBLE_DEVICES"].split(",")) == 2


def test_nearest_nic_same_pcie_switch():
    p, _ = plan("server-2s8g", {"SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7", "SLURM_NTASKS_PER_NODE": "8"})
    assert [r.nic.name for r in p.ranks] == ["mlx5_0", "mlx5_0", "mlx5_1", "mlx5_1",
                                             "mlx5_2", "mlx5_2", "mlx5_3", "mlx5_3"]
    assert p.ranks[5].env["NCCL_IB_HCA"] == "mlx5_2" and p.ranks[5].env["NCCL_SOCKET_IFNAME"] == "ib2"


@pytest.mark.parametrize("env,want", [
    ({"SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_NODEID": "1"}, 4),
    ({"SLURM_STEP_TASKS_PER_NODE": "4,2", "SLURM_NODEID": "1", "SLURM_TASKS_PER_NODE": "9"}, 2),
    ({"SLURM_NTASKS_PER_NODE": "3"}, 3),
    ({}, None),
])
def test_ntasks_from_env(env, want):
    assert ntasks_from_env(env) == want


@pytest.mark.parametrize("text,want", [
    ("4(x2),1", [4, 4, 1]), ("8", [8]), (" 2 , 3(x1) ", [2, 3]), ("1(x0),5", [5]), ("", []),
    ("4(x)", None), ("(x2)", None), ("4(x2", None), ("4x2", None), ("4(x-1)", None), ("\u0664(x2)", None),
    ("4(x2))", None), ("a", None), ("\u0664", None),
])
def test_parse_tasks_per_node(text, want):
    from gsrun.facts.slurm import parse_tasks_per_node

    if want is None:
        with pytest.raises(InputError):
            parse_tasks_per_node(text)
    else:
        assert parse_tasks_per_node(text) == want


def test_bad_env_is_input_error():
    fs, t = host("ci-emulated")
    with pytest.raises(InputError):
        plan_from_env({"SLURM_LOCALID": "x"}, fs, [0, 1], topology=t)
    with pytest.raises(InputError):
        make_plan(t, [], 1, [99])  # no allowed CPU online


def test_render_table_lists_gpus_and_binding():
    fs, t = host("server-2s8g")
    p = plan_from_env(all_gpus_env(t, 8), fs, list(t.cpus_online), topology=t)
    text = render_table(t, p)
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["GPU0", "GPU1", "GPU2"]
    assert lines[1].split()[:3] == ["GPU0", "X", "PXB"]
    assert "SYS" in lines[1] and "NIC0: mlx5_0 (ib0)" in text
    assert any(ln.split()[:3] == ["7", "7", "28-31,60-63"] for ln in lines)
