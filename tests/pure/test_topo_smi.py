"""nvidia-smi topo -m fallback parser (field cases 2 and 3, docs/field-cases.md;
``CASEn`` inputs and ``test_caseN_...`` names refer to them)."""

import pytest

from gsrun.base.errors import InputError
from gsrun.facts.topo_smi import parse_topo_matrix

CASE2_A = "\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \t0-7\t\tN/A\t\tN/A\n"
CASE2_B = ("\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
           "GPU0\t X \tPHB\t0-63\t0\t\tN/A\n"
           "GPU1\tPHB\t X \t0-63\t0\t\tN/A\n")
CASE3 = ("\tGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
         "GPU0\t X \tNV12\tNODE\tNODE\tNODE\tNODE\tNODE\tNODE\tNODE\t0-15,56-71\t0\t\tN/A\n"
         "GPU4\tNODE\tNODE\tNODE\tNODE\t X \tNV12\tNODE\tNODE\tNODE\t\t1\t\tN/A\n"
         "\nLegend:\n\n  X    = Self\n  NV#  = Connection traversing a bonded set of # NVLinks\n\n"
         "NIC Legend:\n\n  NIC0: mlx5_0\n")
# the real H200 (probe.log): underlined header, Legend block
H200 = ("\t\x1b[4mGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
        "GPU0\t X \t0-15\t0\t\tN/A\n\nLegend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe\n")


def test_case2_a_na_numa_is_none_not_a_crash():
    (row,) = parse_topo_matrix(CASE2_A).gpus
    assert row.index == 0
    assert row.cpus == list(range(8))
    assert row.numa_node is None and row.gpu_numa_id is None


def test_case2_b_padding_does_not_shift_columns():
    rows = parse_topo_matrix(CASE2_B).gpus
    assert [r.index for r in rows] == [0, 1]
    for r in rows:
        assert r.cpus == list(range(64))
        assert r.numa_node == 0
        assert r.gpu_numa_id is None
    assert rows[0].links == {"GPU0": "X", "GPU1": "PHB"}


def test_case3_blank_cpu_affinity_is_data_and_nic_legend_read():
    t = parse_topo_matrix(CASE3)
    by = {r.index: r for r in t.gpus}
    assert by[0].cpus == list(range(16)) + list(range(56, 72)) and by[0].numa_node == 0
    assert by[4].cpus is None and by[4].numa_node == 1
    assert by[4].links["GPU5"] == "NV12" and by[4].links["NIC0"] == "NODE"
    assert t.nics == {"NIC0": "mlx5_0"}


def test_real_h200_underlined_header():
    (row,) = parse_topo_matrix(H200).gpus
    assert row.cpus == list(range(16)) and row.numa_node == 0 and row.gpu_numa_id is None


def test_not_topo_output():
    with pytest.raises(InputError) as e:
        parse_topo_matrix("Failed to initialize NVML: Driver/library version mismatch\n")
    assert "not nvidia-smi topo -m output" in str(e.value)
