"""gsrun-bind and RLIMIT_MEMLOCK (setrlimit(2): a process may raise its soft
limit up to its hard one, never the hard one): the soft limit is raised
before anything is judged; only a hard limit too low for pinned memory is a
warning, and it names the node's RDMA devices. The limits below are the
ones ``ulimit -l`` shows on Debian's default (8 MiB soft and hard since
glibc/systemd 253: 8388608), RHEL's 64 KiB, and a systemd unit's
``LimitMEMLOCK=infinity``."""

import resource

import pytest

from gsrun.facts.memlock import raise_memlock_soft, rdma_devices, rdma_text
from gsrun.wrapper.bind import memlock_warning

pytestmark = pytest.mark.pure
INF = resource.RLIM_INFINITY


def test_unlimited_is_fine_and_a_64k_hard_limit_warns_with_the_slurm_fix():
    assert memlock_warning(INF, None) is None
    w = memlock_warning(65536, None, ["mlx5_0", "mlx5_1"])
    assert w.startswith("memlock: hard RLIMIT_MEMLOCK 65536 bytes (64 KiB), below unlimited")
    assert "; RDMA devices: mlx5_0, mlx5_1;" in w
    assert "PropagateResourceLimitsExcept=MEMLOCK" in w and "LimitMEMLOCK=infinity" in w
    assert "no RDMA devices" in memlock_warning(8388608, None, [])


def test_site_floor_in_bytes():
    assert memlock_warning(8 << 30, str(4 << 30)) is None
    assert "below 4294967296 bytes" in memlock_warning(1 << 30, str(4 << 30))
    assert memlock_warning(None, None) is None
    assert "below unlimited" in memlock_warning(1 << 30, "lots")


@pytest.mark.parametrize("before, after, calls", [
    ((65536, INF), (INF, INF), [(INF, INF)]),            # soft below an unlimited hard: raised, no warning
    ((65536, 8388608), (8388608, 8388608), [(8388608, 8388608)]),
    ((INF, INF), (INF, INF), []),                         # nothing to do
    ((8388608, 8388608), (8388608, 8388608), [])])
def test_soft_raised_to_hard_before_anything_warns(before, after, calls):
    got = []
    assert raise_memlock_soft(lambda r: before, lambda r, v: got.append(v)) == after
    assert got == calls
    assert (memlock_warning(after[1], None) is None) == (after[1] == INF)


def test_a_refused_raise_keeps_the_limits():
    def refuse(r, v):
        raise ValueError("not allowed")
    assert raise_memlock_soft(lambda r: (65536, INF), refuse) == (65536, INF)


def test_rdma_devices_from_sysfs_else_dev(tmp_path):
    from gsrun.facts.hostfs import HostFS
    (tmp_path / "sys/class/infiniband/mlx5_1").mkdir(parents=True)
    (tmp_path / "sys/class/infiniband/mlx5_0").mkdir(parents=True)
    assert rdma_devices(HostFS(tmp_path)) == ["mlx5_0", "mlx5_1"]
    other = tmp_path / "o"
    (other / "dev/infiniband").mkdir(parents=True)
    for n in ("uverbs0", "rdma_cm", "uverbs1"):
        (other / "dev/infiniband" / n).write_text("")
    assert rdma_devices(HostFS(other)) == ["uverbs0", "uverbs1"]
    assert rdma_text([]) == "no RDMA devices (/sys/class/infiniband, /dev/infiniband/uverbs*)"
