"""``irq=local`` on the IRQ files real kernels have, beyond the H200 VM
recording (``helpers.tuning_tree``):

- a write refused for one IRQ (ENOSPC: the x86 vector allocator,
  ``arch/x86/kernel/apic/vector.c``, when no CPU of the mask has a free
  vector; EIO: ``kernel/irq/proc.c`` ``write_irq_affinity`` for a managed
  IRQ) skips that IRQ only;
- an IRQ with only ``smp_affinity`` (a hex mask of comma-separated 32-bit
  words, most significant first, as ``Documentation/core-api/irq/
  irq-affinity.rst`` shows it) on a 96-CPU host, where the mask is three
  words wide;
- ``effective_affinity_list`` / ``effective_affinity`` (kernel >= 4.15,
  ``CONFIG_GENERIC_IRQ_EFFECTIVE_AFF_MASK``): x86 delivers each IRQ to one
  CPU of its mask, and that is what the reason says.

The trees are built here from those files' formats; no recording of such a
host is available to this test."""

from __future__ import annotations

import errno

from gsrun.facts.hostfs import HostFS
from gsrun.node import tuning
from helpers.tuning_tree import GPU_BDF, GPU_IRQS, CountingHostFS, add_host_tuning, diff, make_tree, snapshot

Q = lambda m: None  # noqa: E731
SCOPE = tuning.JobScope([{"bdf": GPU_BDF, "kind": "gpu", "name": "0", "numa_node": None}],
                        list(range(4, 12)), {0: list(range(16))}, "test")


def tune(root, state, scope=SCOPE, hostfs=None):
    return tuning.prolog_tune(hostfs or HostFS(root), str(state), "77", "irq=local", None, None, True, log=Q,
                              scope=scope)


def test_enospc_on_one_irq_skips_it_and_the_others_keep_their_affinity(tmp_path):
    root = add_host_tuning(make_tree(tmp_path / "h", swap=False))
    bad = GPU_IRQS[3]
    h = CountingHostFS(root, fail_path=f"proc/irq/{bad}/smp_affinity_list", fail_errno=errno.ENOSPC)
    r = tune(root, tmp_path / "s", hostfs=h)
    item = r["items"][0]
    assert item["action"] == "applied" and r["rolled_back"] == [], r
    assert f"skipped IRQ {bad}: ENOSPC (no free vector on those CPUs)" in item["reason"]
    for n in GPU_IRQS:
        want = "0-15\n" if n == bad else "4-11\n"
        assert (root / f"proc/irq/{n}/smp_affinity_list").read_text() == want, n
    entry = tuning.status(HostFS(root), str(tmp_path / "s"))["changes"][0]
    assert sorted(entry["target"], key=int) == [str(n) for n in GPU_IRQS if n != bad] and entry["in_effect"]


def test_eio_and_enospc_on_two_irqs_both_named(tmp_path):
    root = add_host_tuning(make_tree(tmp_path / "h", swap=False))

    class TwoFail(CountingHostFS):
        def write(self, rel, value):
            for n, e in ((GPU_IRQS[0], errno.EIO), (GPU_IRQS[1], errno.ENOSPC)):
                if rel.endswith(f"proc/irq/{n}/smp_affinity_list"):
                    raise OSError(e, "refused", rel)
            super().write(rel, value)
    r = tune(root, tmp_path / "s", hostfs=TwoFail(root))
    reason = r["items"][0]["reason"]
    assert (f"skipped IRQ {GPU_IRQS[0]}: EIO (kernel-managed or not movable); "
            f"IRQ {GPU_IRQS[1]}: ENOSPC (no free vector on those CPUs)") in reason
    assert r["applied"] == ["irq"]


def mask_only_host(tmp_path, cpus=96):
    """96 CPUs in two NUMA nodes (0-47, 48-95); the GPU's IRQs have only
    ``smp_affinity`` (all CPUs: three 32-bit words)."""
    root = add_host_tuning(make_tree(tmp_path / "h", swap=False), cpus=cpus)
    for n in GPU_IRQS:
        d = root / f"proc/irq/{n}"
        (d / "smp_affinity_list").unlink()
        (d / "smp_affinity").write_text("ffffffff,ffffffff,ffffffff\n")
    return root


def test_smp_affinity_hex_mask_wider_than_64_cpus(tmp_path):
    root = mask_only_host(tmp_path)
    base = snapshot(root)
    scope = tuning.JobScope([{"bdf": GPU_BDF, "kind": "gpu", "name": "0", "numa_node": 1}],
                            list(range(64, 72)), {0: list(range(48)), 1: list(range(48, 96))}, "test")
    r = tune(root, tmp_path / "s", scope=scope)
    assert r["applied"] == ["irq"], r
    for n in GPU_IRQS:      # CPUs 64-71: bits 0-7 of the third word from the right
        assert (root / f"proc/irq/{n}/smp_affinity").read_text() == "000000ff,00000000,00000000\n"
    entry = tuning.status(HostFS(root), str(tmp_path / "s"))["changes"][0]
    assert entry["prior"] == {f"mask:{n}": "0-95" for n in GPU_IRQS} and entry["in_effect"]
    assert entry["target"] == {f"mask:{n}": "64-71" for n in GPU_IRQS}
    assert tuning.restore(HostFS(root), str(tmp_path / "s"), all_jobs=True, log=Q)["ok"]
    assert diff(base, snapshot(root)) == []        # written back as the mask it was


def test_effective_affinity_is_what_the_reason_says(tmp_path):
    root = add_host_tuning(make_tree(tmp_path / "h", swap=False))
    # what x86 shows after the write: one CPU of the new mask per IRQ
    for i, n in enumerate(GPU_IRQS):
        if i % 2:
            (root / f"proc/irq/{n}/effective_affinity").write_text(f"{1 << (4 + i):04x}\n")
        else:
            (root / f"proc/irq/{n}/effective_affinity_list").write_text(f"{4 + i}\n")
    r = tune(root, tmp_path / "s")
    reason = r["items"][0]["reason"]
    assert reason.endswith("effective: " + ", ".join(f"IRQ {n} on {4 + i}" for i, n in enumerate(GPU_IRQS))), reason


def test_cpumask_round_trip():
    from gsrun.base.cpulist import format_cpumask, parse_cpumask
    assert parse_cpumask("00000000,0000ff00") == list(range(8, 16))
    assert format_cpumask(range(64, 72)) == "000000ff,00000000,00000000"
    assert parse_cpumask(format_cpumask([0, 31, 32, 255])) == [0, 31, 32, 255]
    import pytest
    from gsrun.base.errors import InputError
    for bad in ("", "0-3", "fffffffff", "ff,,ff"):
        with pytest.raises(InputError):
            parse_cpumask(bad)
