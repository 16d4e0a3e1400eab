"""Device-list parsing (field case 11, and the Slurm forms of field case 9;
both in docs/field-cases.md)."""

import pytest

from gsrun.facts.devices import parse_device_list, parse_device_token
from gsrun.base.errors import InputError

U1 = "GPU-11111111-2222-3333-4444-555555555555"
U2 = "GPU-66666666-7777-8888-9999-000000000000"


def test_indices():
    toks = parse_device_list("0,1")
    assert [t.kind for t in toks] == ["index", "index"]
    assert [t.index for t in toks] == [0, 1]


def test_full_uuids():
    toks = parse_device_list(f"{U1},{U2}")
    assert [t.kind for t in toks] == ["gpu-uuid", "gpu-uuid"]
    assert toks[0].uuid == U1 and toks[1].parent_uuid == U2
    assert toks[0].index is None
    assert toks[0].matches_uuid(U1.lower()) and not toks[0].matches_uuid(U2)


def test_uuid_prefix():
    (t,) = parse_device_list("GPU-11111111")
    assert t.kind == "gpu-uuid-prefix"
    assert t.matches_uuid(U1) and not t.matches_uuid(U2)
    assert t.parent_uuid is None


def test_mig_uuid_new_form():
    (t,) = parse_device_list("MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee")
    assert t.kind == "mig-uuid" and t.is_mig
    assert t.parent_uuid is None and t.index is None


def test_mig_legacy_form_keeps_parent_gi_ci():
    (t,) = parse_device_list(f"MIG-{U1}/1/2")
    assert t.kind == "mig-legacy"
    assert (t.parent_uuid, t.gi, t.ci) == (U1, 1, 2)
    assert t.matches_uuid(U1)


def test_set_but_empty_means_no_gpus_and_unset_means_unknown():
    assert parse_device_list("") == []
    assert parse_device_list("  ") == []
    assert parse_device_list(None) is None
    assert parse_device_list("NoDevFiles") == []
    assert parse_device_list("-1") == []


@pytest.mark.parametrize("bad", ["MIG-377e", "gpu0", "1.5", "-2", "0;rm -rf /", "GPU-zz", "0x1"])
def test_garbage_is_an_input_error_not_a_crash(bad):
    with pytest.raises(InputError) as e:
        parse_device_list(bad)
    assert "gsrun: devices: not a GPU device name" in str(e.value)


def test_slurm_ranges_only_where_allowed():
    assert [t.index for t in parse_device_list("0-2,5", allow_ranges=True)] == [0, 1, 2, 5]
    with pytest.raises(InputError):
        parse_device_token("0-2")


def test_duplicates_kept_once_in_order():
    assert [t.index for t in parse_device_list("3,1,3")] == [3, 1]
