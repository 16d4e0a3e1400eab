"""``hugepages=SIZE:N`` on pools other jobs use, on fragmented memory, and
back at the epilog with pages still held -- the kernel's behaviour from
Documentation/admin-guide/mm/hugetlbpage.rst, played by :class:`KernelPool`
over the H200 VM recording (``helpers.tuning_tree``):

- ``nodeN/hugepages/hugepages-<kB>kB/{nr,free,surplus}_hugepages``; a write
  to ``nr_hugepages`` allocates what the (fragmented) memory allows and the
  file reads the size reached; ``compact_memory`` lets a retry get more;
- lowering ``nr_hugepages`` below the pages in use leaves it at the value
  written and turns the in-use excess into ``surplus_hugepages``;
- ``/proc/mounts`` line of a hugetlbfs mount as systemd's dev-hugepages.mount
  makes it: ``hugetlbfs /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0``.
"""

from __future__ import annotations

import os

import pytest

from gsrun.facts.hostfs import HostFS
from gsrun.node import tuning
from helpers.tuning_tree import GPU_BDF, add_host_tuning, make_tree

Q = lambda m: None  # noqa: E731
SCOPE = tuning.JobScope([{"bdf": GPU_BDF, "kind": "gpu", "name": "0", "numa_node": None}],
                        list(range(4, 12)), {0: list(range(16))}, "test")
POOL = "sys/devices/system/node/node0/hugepages/hugepages-2048kB"
GLOBAL = ("proc/sys/vm/nr_hugepages", "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages")


class KernelPool(HostFS):
    """A 2 MiB pool on node 0: ``used`` pages held by others; writes reach at
    most ``cap`` pages (``cap_after_compact`` once ``compact_memory`` was written)."""

    def __init__(self, root, used=0, cap=10**9, cap_after_compact=None):
        super().__init__(root)
        self.used, self.cap, self.cap_after = used, cap, cap_after_compact
        self.writes: list[tuple[str, str]] = []

    def write(self, rel, value):
        rel = rel.lstrip("/")
        self.writes.append((rel, value))
        if rel in ("proc/sys/vm/compact_memory", "sys/devices/system/node/node0/compact"):
            if self.cap_after is not None:
                self.cap = self.cap_after
            return
        if rel == f"{POOL}/nr_hugepages":
            want = int(value)
            nr = want if want < self.used else min(want, max(self.cap, self.used))
            super().write(f"{POOL}/nr_hugepages", str(nr))
            super().write(f"{POOL}/free_hugepages", str(max(0, nr - self.used)))
            super().write(f"{POOL}/surplus_hugepages", str(max(0, self.used - nr)))
            return
        super().write(rel, value)


def host(tmp_path, nr=0, used=0, free_kb=64 << 20):
    root = add_host_tuning(make_tree(tmp_path / "h", swap=False), node_free_kb=free_kb)
    for f, v in (("nr_hugepages", nr), ("free_hugepages", nr - used), ("surplus_hugepages", 0)):
        (root / POOL / f).write_text(f"{v}\n")
    for g in GLOBAL:
        (root / g).parent.mkdir(parents=True, exist_ok=True)
        (root / g).write_text(f"{nr}\n")
    (root / "proc/sys/vm/compact_memory").write_text("")   # write-only on a real kernel
    return root


def tune(h, state, req):
    return tuning.prolog_tune(h, str(state), "77", req, None, None, True, log=Q, scope=SCOPE)


def test_pages_in_use_by_others_are_added_to_the_target(tmp_path):
    root = host(tmp_path, nr=512, used=512)
    h = KernelPool(root, used=512)
    r = tune(h, tmp_path / "s", "hugepages=2M:4096")
    item = r["items"][0]
    assert item["action"] == "applied", item
    assert (root / POOL / "nr_hugepages").read_text() == "4608\n"
    assert (root / POOL / "free_hugepages").read_text() == "4096\n"      # the job's N, all free for it
    assert "node 0 (512 in use by others: pool 4608)" in item["reason"]
    assert [g for g in GLOBAL if (root / g).read_text() != "512\n"] == []    # global files untouched
    assert all(not w[0].startswith(GLOBAL) for w in h.writes)


def test_free_pages_already_enough_leave_the_pool(tmp_path):
    root = host(tmp_path, nr=8192, used=512)
    r = tune(KernelPool(root, used=512), tmp_path / "s", "hugepages=2M:4096")
    assert r["unchanged"] == ["hugepages"] and (root / POOL / "nr_hugepages").read_text() == "8192\n"


def test_fragmented_memory_compaction_then_retries_reach_the_target(tmp_path):
    root = host(tmp_path)
    h = KernelPool(root, cap=3000, cap_after_compact=10**9)
    r = tune(h, tmp_path / "s", "hugepages=2M:4096")
    assert r["items"][0]["action"] == "applied" and "short" not in r["items"][0]["reason"]
    assert (root / POOL / "nr_hugepages").read_text() == "4096\n"
    assert [w for w in h.writes if "compact" in w[0]] == [("proc/sys/vm/compact_memory", "1")]
    assert [w[1] for w in h.writes if w[0].endswith("nr_hugepages")] == ["4096", "4096"]


def test_still_short_after_retries_got_x_of_n_and_the_job_starts(tmp_path):
    root = host(tmp_path, nr=512, used=512)
    h = KernelPool(root, used=512, cap=3000, cap_after_compact=3500)
    r = tune(h, tmp_path / "s", "hugepages=2M:4096")
    item = r["items"][0]
    assert item["action"] == "applied" and r["ok"], item
    assert ("short: node0/2048: got 3500 of 4608 pages (2988 free for the job, asked 4096 more; after "
            "compaction and 3 retries)") in item["reason"]
    entry = tuning.status(HostFS(root), str(tmp_path / "s"))["changes"][0]
    assert entry["target"] == {"node0/2048": "3500"} and entry["in_effect"]
    assert [w[1] for w in h.writes if w[0].endswith("nr_hugepages")] == ["4608"] * 4


def test_epilog_removes_the_jobs_hugetlbfs_files_then_restores(tmp_path):
    root = host(tmp_path)
    (root / "proc/mounts").write_text("proc /proc proc rw 0 0\n"
                                      "hugetlbfs /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0\n")
    hp = root / "dev/hugepages"
    (hp / "rtemap").mkdir(parents=True)
    mine, other = (1001, 1002) if os.getuid() == 0 else (os.getuid(), None)
    for p in ("train.shm", "rtemap/rtemap_0"):
        (hp / p).write_bytes(b"")
        if other:
            os.chown(hp / p, mine, mine)
    (hp / "theirs").write_bytes(b"")
    (hp / "link").symlink_to(hp / "theirs")
    if other:
        os.chown(hp / "theirs", other, other)
        os.lchown(hp / "link", mine, mine)
    h = KernelPool(root)
    assert tune(h, tmp_path / "s", "hugepages=2M:64")["applied"] == ["hugepages"]
    out = tuning.epilog_restore(h, str(tmp_path / "s"), "77", log=Q, uid=mine)
    assert out["ok"] and out["restored"][0]["result"] == "restored"
    if other:
        assert out["hugetlbfs_removed"] == ["/dev/hugepages/rtemap/rtemap_0", "/dev/hugepages/train.shm"]
        assert (hp / "theirs").exists() and (hp / "link").is_symlink()     # another user's; a link never
    assert not (hp / "train.shm").exists() and not (hp / "rtemap/rtemap_0").exists()


def test_pages_still_held_at_restore_name_their_holders(tmp_path):
    root = host(tmp_path)
    (root / "proc/mounts").write_text("hugetlbfs /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0\n")
    (root / "dev/hugepages").mkdir(parents=True)
    (root / "dev/hugepages/held").write_bytes(b"")
    h = KernelPool(root)
    assert tune(h, tmp_path / "s", "hugepages=2M:64")["applied"] == ["hugepages"]
    h.used = 40          # a process of another user still maps 40 pages of the file
    out = tuning.epilog_restore(h, str(tmp_path / "s"), "77", log=Q)      # no uid: nothing removed
    assert not out["ok"] and out["left"] == ["hugepages"]
    res = out["restored"][0]
    assert res["result"] == "failed"
    assert res["reason"] == (f"gsrun: tune: hugepages not all returned: node0/2048: 40 pages still in use (surplus_hugepages), held by /dev/hugepages/held "
                             f"(uid {os.getuid()})")
    assert (root / POOL / "nr_hugepages").read_text() == "0\n" and (root / POOL / "surplus_hugepages").read_text() == "40\n"
    # once released, restore --all finds the pool back and clears the journal
    h.used = 0
    h.write(f"{POOL}/nr_hugepages", "0")
    assert tuning.restore(h, str(tmp_path / "s"), all_jobs=True, log=Q)["ok"]


def test_anonymous_holders_are_said_to_be_processes(tmp_path):
    root = host(tmp_path)
    h = KernelPool(root)
    assert tune(h, tmp_path / "s", "hugepages=2M:64")["applied"] == ["hugepages"]
    h.used = 8
    out = tuning.epilog_restore(h, str(tmp_path / "s"), "77", log=Q)
    assert out["restored"][0]["reason"] == ("gsrun: tune: hugepages not all returned: node0/2048: 8 pages still in use (surplus_hugepages) by processes "
                                            "(no file in a hugetlbfs mount)")
