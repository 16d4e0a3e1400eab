"""The bound step's parsers that replaced a regex (so that slurmstepd does not
import ``re``) accept and reject exactly what the regex did."""

import re

import pytest

from gsrun.base.ids import is_node_name
from gsrun.facts.devices import parse_device_token
from gsrun.facts.hostfs import HostFS, meminfo_kb
from gsrun.facts.topology import is_bdf, read_allowed_mems
from gsrun.base.errors import InputError


@pytest.mark.parametrize("text", ["0000:3b:00.0", "0000:3B:00.0", "0000:3b:00.8", "00000:3b:00.0", "0000:3b:00.7",
                                  "pci0000:17", "0000:17:00.0x", "0000-3b:00.0", "", "ffff:ff:1f.7"])
def test_is_bdf_is_the_old_pattern(text):
    assert is_bdf(text) == bool(re.match(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$", text))


@pytest.mark.parametrize("text", ["Node 0 MemTotal:       65536 kB", "Node 3 MemTotal:       0 kB", "MemTotal:12 kB",
                                  "MemTotal:  12kB", "MemTotal: 1 2 kB", "x\nNode 1 MemTotal:\t 77 kB\nNode 1 MemFree: 1 kB",
                                  "MemTotal: kB", "MemTotal: 5 MB", ""])
@pytest.mark.parametrize("key", ["MemTotal", "MemFree"])
def test_meminfo_is_the_old_pattern(text, key):
    m = re.search(key + r":\s+([0-9]+)\s*kB", text)
    assert meminfo_kb(text).get(key) == (int(m.group(1)) if m else None)


@pytest.mark.parametrize("value", ["gpu01", "gpu-node01.ib", "-a", "a" * 64, "a" * 65, "", "a b", "a\n", "é1",
                                   "a_b", ".x", 3, None])
def test_node_name_is_the_pattern(value):
    want = isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", value) is not None
    assert is_node_name(value) == want


@pytest.mark.parametrize("status, want", [("Name:\tx\nMems_allowed_list:\t0-1\n", [0, 1]),
                                          ("Mems_allowed_list:\t0,2-3\nVoluntary: 1\n", [0, 2, 3]),
                                          ("Mems_allowed:\t1\n", None), ("", None)])
def test_allowed_mems(tmp_path, status, want):
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/status").write_text(status)
    assert read_allowed_mems(HostFS(tmp_path)) == want


def test_device_tokens_without_re_for_indices_and_ranges():
    assert [t.index for t in parse_device_token("3")] == [3]
    assert [t.index for t in parse_device_token("2-4", allow_ranges=True)] == [2, 3, 4]
    for bad in ("1234567", "2-4", "4-2", "+1", "١"):
        kw = {"allow_ranges": True} if bad == "4-2" else {}
        with pytest.raises(InputError):
            parse_device_token(bad, **kw)
    (u,) = parse_device_token("GPU-5e5e0000-0000-4000-8000-00005e5e0000")
    assert u.kind == "gpu-uuid"
    (m,) = parse_device_token("MIG-GPU-5e5e0000-0000-4000-8000-00005e5e0000/1/0")
    assert (m.kind, m.gi, m.ci) == ("mig-legacy", 1, 0)
