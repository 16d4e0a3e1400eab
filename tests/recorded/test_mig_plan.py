"""MIG planner (gsrun.node.mig.plan_layout) against the real H200's recorded profile table.

Recorded table: tests/data/nvml/h200-mig.json, converted from
shared/data/hosts/h200-vm/h200-vm-nvml.json (NVIDIA H200, driver 580.159.04,
read-only NVML calls; probe.log lists profile ids 0, 5, 9, 14, 15, 19, 20).
"""

import itertools
import json
from functools import lru_cache
from pathlib import Path

import pytest

from gsrun.node import mig
from gsrun.base.errors import InputError

DATA = Path(__file__).resolve().parent.parent / "data" / "nvml" / "h200-mig.json"
RAW = json.loads(DATA.read_text())["devices"][0]["gpu_instance_profiles"]
TABLE = mig.profile_table(RAW)

# NVIDIA Multi-Instance GPU User Guide, "Supported MIG Profiles", H200 MIG
# profiles (https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html):
# profile -> number of instances available. The H200 shares the A100/H100
# 7-compute / 8-memory-slice geometry shown in the guide's profile figure.
NVIDIA_H200_INSTANCES = {
    "1g.18gb": 7, "1g.18gb+me": 1, "1g.35gb": 4, "2g.35gb": 3,
    "3g.71gb": 2, "4g.71gb": 1, "7g.141gb": 1,
}

# Combinations read off the guide's H200 placement figure (every row a full
# or near-full partition the figure allows). Written by hand from the figure,
# not generated from the recording, so a wrong recording or planner fails here.
NVIDIA_H200_COMBINATIONS = [
    "7g.141gb",
    "4g.71gb+3g.71gb",
    "4g.71gb+2g.35gb+1g.18gb",
    "4g.71gb+2g.35gb+1g.35gb",
    "4g.71gb+3x1g.18gb",
    "4g.71gb+2x1g.35gb",
    "4g.71gb+1g.35gb+2x1g.18gb",
    "4g.71gb+1g.18gb+me+2x1g.18gb",
    "3g.71gb+3g.71gb",
    "3g.71gb+2x2g.35gb",
    "3g.71gb+2g.35gb+2x1g.18gb",
    "3g.71gb+2g.35gb+1g.35gb",
    "3g.71gb+4x1g.18gb",
    "3g.71gb+2x1g.35gb",
    "3g.71gb+1g.35gb+2x1g.18gb",
    "3x2g.35gb+1g.18gb",
    "3x2g.35gb+1g.35gb",
    "2x2g.35gb+3x1g.18gb",
    "2x2g.35gb+1g.35gb+1g.18gb",
    "2g.35gb+5x1g.18gb",
    "2g.35gb+1g.35gb+3x1g.18gb",
    "7x1g.18gb",
    "1g.18gb+me+6x1g.18gb",
    "4x1g.35gb",
    "1g.35gb+6x1g.18gb",
    "2x1g.35gb+4x1g.18gb",
]


def check_plan(plan, layout):
    """Placements are ones NVML lists for the profile, never overlap, and the
    instance multiset equals the layout."""
    used = set()
    for p in plan.instances:
        prof = TABLE.by_name(p.name)
        assert (p.start, p.size) in prof.placements, (layout, p)
        assert p.profile_id == prof.id
        cells = set(range(p.start, p.start + p.size))
        assert not (cells & used), (layout, plan.instances)
        used |= cells
    want = {}
    for n, name in mig.parse_layout(layout):
        want[name] = want.get(name, 0) + n
    got = {}
    for p in plan.instances:
        got[p.name] = got.get(p.name, 0) + 1
    assert got == want
    assert sum(p.slice_count for p in plan.instances) <= 7


def test_recorded_table_matches_nvidia_profile_table():
    assert {p.name: p.instance_count for p in TABLE.profiles} == NVIDIA_H200_INSTANCES
    assert {p.name: p.id for p in TABLE.profiles} == {
        "1g.18gb": 19, "1g.18gb+me": 20, "1g.35gb": 15, "2g.35gb": 14,
        "3g.71gb": 9, "4g.71gb": 5, "7g.141gb": 0}
    assert TABLE.memory_slices == 8 and TABLE.compute_slices == 7
    # the README's examples, as the recording has them
    assert TABLE.by_name("3g.71gb").placements == ((0, 4), (4, 4))
    assert TABLE.by_name("1g.35gb").placements == ((0, 2), (2, 2), (4, 2), (6, 2))
    assert TABLE.by_name("7g.141gb").placements == ((0, 8),)
    assert TABLE.by_name("4g.71gb").placements == ((0, 4),)
    assert TABLE.by_name("1g.18gb").placements == tuple((s, 1) for s in range(7))


@pytest.mark.parametrize("layout", NVIDIA_H200_COMBINATIONS)
def test_nvidia_combinations_accepted(layout):
    plan = mig.plan_layout(TABLE, layout)
    check_plan(plan, layout)


@pytest.mark.parametrize("layout,starts", [
    ("7g.141gb", [("7g.141gb", 0, 8)]),
    ("4g.71gb+3g.71gb", [("4g.71gb", 0, 4), ("3g.71gb", 4, 4)]),
    ("4g.71gb+2x1g.35gb", [("4g.71gb", 0, 4), ("1g.35gb", 4, 2), ("1g.35gb", 6, 2)]),
    # 3g.71gb must move to [4,4] so that both 2g.35gb fit at 0 and 2
    ("3g.71gb+2x2g.35gb", [("2g.35gb", 0, 2), ("2g.35gb", 2, 2), ("3g.71gb", 4, 4)]),
    # 3g.71gb at [0,4] would leave only slices 4-6 for 1g.18gb: the search must backtrack
    ("3g.71gb+4x1g.18gb", [("1g.18gb", 0, 1), ("1g.18gb", 1, 1), ("1g.18gb", 2, 1),
                           ("1g.18gb", 3, 1), ("3g.71gb", 4, 4)]),
])
def test_exact_placements(layout, starts):
    plan = mig.plan_layout(RAW, layout)  # raw NVML form accepted too
    assert [(p.name, p.start, p.size) for p in plan.instances] == starts


@pytest.mark.parametrize("layout,needles", [
    ("4g.71gb+4g.71gb", ["instanceCount of 4g.71gb is 1", "only at slice 0 (size 4)",
                         "second one has no free placement"]),
    ("8x1g.18gb", ["instanceCount of 1g.18gb is 7", "the layout asks for 8", "eighth one"]),
    ("2x1g.18gb+me", ["instanceCount of 1g.18gb+me is 1", "7 possible placements"]),
    ("3x3g.71gb", ["instanceCount of 3g.71gb is 2", "slices 0, 4 (size 4)"]),
    ("5x1g.35gb", ["instanceCount of 1g.35gb is 4"]),
    ("4g.71gb+2x2g.35gb", ["needs 8 compute slices; the GPU has 7"]),
    ("7g.141gb+1g.18gb", ["needs 8 compute slices"]),
    ("3g.71gb+3g.71gb+1g.18gb", ["needs at least 9 memory slices; the GPU has 8"]),
    ("4x1g.35gb+1g.18gb", ["needs at least 9 memory slices"]),
])
def test_impossible_refused_with_reason(layout, needles):
    with pytest.raises(InputError) as ei:
        mig.plan_layout(TABLE, layout)
    e = ei.value
    for n in needles:
        assert n in e.detail, e.detail
    assert f"layout {layout!r} does not fit" in e.what


def test_unknown_profile_lists_the_gpus_profiles():
    with pytest.raises(InputError) as ei:
        mig.plan_layout(TABLE, "3g.40gb")  # an A100 name
    assert "no MIG profile 3g.40gb" in ei.value.detail
    assert ei.value.hint == ("this GPU's profiles: 1g.18gb, 1g.18gb+me, 1g.35gb, 2g.35gb, "
                             "3g.71gb, 4g.71gb, 7g.141gb")


def test_search_failure_names_the_instance_and_what_took_its_slices():
    # A table where the sums fit but placements clash: 2 slices, "a" only at
    # slice 0 (size 2) spanning both, "b" at slice 1 (size 1).
    raw = {"0": {"info": {"id": 1, "sliceCount": 1, "instanceCount": 1, "memorySizeMB": 1, "name": "MIG 1g.1gb"},
                 "possible_placements": {"ok": ["[1, 1]"]}},
           "1": {"info": {"id": 2, "sliceCount": 1, "instanceCount": 1, "memorySizeMB": 2, "name": "MIG 1g.2gb"},
                 "possible_placements": {"ok": ["[0, 2]"]}},
           "2": {"info": {"id": 3, "sliceCount": 2, "instanceCount": 1, "memorySizeMB": 3, "name": "MIG 2g.3gb"},
                 "possible_placements": {"ok": ["[0, 3]"]}}}
    with pytest.raises(InputError) as ei:
        mig.plan_layout(raw, "1g.2gb+1g.1gb")
    d = ei.value.detail
    assert "1g.1gb can be placed only at slice 1 (size 1)" in d
    assert "first one has no free placement" in d
    assert "already taken: 1g.2gb at slice 0-1" in d


def test_not_supported_table():
    from gsrun.facts.nvml import NA
    with pytest.raises(InputError):
        mig.profile_table(NA("Not Supported", 3))


def test_unsupported_profiles_left_out():
    # indices 5, 6, 8, 10-15 answered Not Supported on the H200
    assert sorted(p.index for p in TABLE.profiles) == [0, 1, 2, 3, 4, 7, 9]


# ---- exhaustive cross-check against an independent oracle ----------------

def oracle_fits(counts):
    """NVIDIA's rules stated directly: per-profile count <= instanceCount,
    compute slices <= 7, and some assignment of listed placements with no
    overlap (memoised over (instance, used-mask); no ordering heuristics)."""
    seq = [TABLE.by_name(n) for n, c in counts for _ in range(c)]
    for n, c in counts:
        if c > TABLE.by_name(n).instance_count:
            return False
    if sum(p.slice_count for p in seq) > 7:
        return False

    @lru_cache(maxsize=None)
    def go(k, mask):
        if k == len(seq):
            return True
        for s, z in seq[k].placements:
            m = ((1 << z) - 1) << s
            if not mask & m and go(k + 1, mask | m):
                return True
        return False

    return go(0, 0)


def test_planner_agrees_with_oracle_on_every_layout_up_to_7_instances():
    names = [p.name for p in TABLE.profiles]
    accepted = refused = 0
    for k in range(1, 8):
        for combo in itertools.combinations_with_replacement(names, k):
            counts = [(combo.count(n), n) for n in dict.fromkeys(combo)]
            layout = "+".join(f"{c}x{n}" for c, n in counts)
            want = oracle_fits([(n, c) for c, n in counts])
            try:
                plan = mig.plan_layout(TABLE, layout)
            except InputError:
                assert not want, layout
                refused += 1
                continue
            assert want, layout
            check_plan(plan, layout)
            accepted += 1
    # every combination in the hand-written list is among the accepted ones
    assert accepted >= len(NVIDIA_H200_COMBINATIONS)
    assert refused > 0


def test_format_plan():
    plan = mig.plan_layout(TABLE, "4g.71gb+2x1g.35gb")
    text = mig.format_plan(plan, 0, "NVIDIA H200")
    lines = text.splitlines()
    assert lines[0] == "MIG plan for 4g.71gb+2x1g.35gb on GPU 0 (NVIDIA H200)"
    assert "memory slices 0-3   4g.71gb      profile id 5" in lines[2]
    assert "71424 MiB" in lines[2]
    assert "map [AAAABBCC]  free memory slices: none" in text
    assert "compute slices used: 6/7" in text
    assert "free memory slices: 7" in mig.format_plan(mig.plan_layout(TABLE, "7x1g.18gb"))


def test_resolve_named_layout():
    assert mig.resolve_layout("small", {"small": "7x1g.18gb"}) == "7x1g.18gb"
    assert mig.resolve_layout("3g.71gb", {"small": "7x1g.18gb"}) == "3g.71gb"
