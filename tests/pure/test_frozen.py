"""gsrun.base.frozen: what @dataclass(frozen=True) gave the types of the
binding path (construction, equality, hash, repr, immutability, copy)."""

import copy
import pickle

import pytest

from gsrun.bind.plan import GpuRef
from gsrun.facts.nvml import NA
from gsrun.facts.topology import Gpu, NumaNode


def test_positional_keyword_and_defaults():
    n = NumaNode(1, (4, 5), distances={0: 21, 1: 10})
    assert (n.id, n.cpus, n.mem_total_bytes, n.distances) == (1, (4, 5), None, {0: 21, 1: 10})
    assert NumaNode(0, ()).distances == {} and NumaNode(0, ()).distances is not NumaNode(0, ()).distances
    assert repr(NA("Not Supported", 3)) == "NA(reason='Not Supported', code=3)"


def test_construction_errors_name_the_field():
    with pytest.raises(TypeError, match="'cpus'"):
        NumaNode(0)
    with pytest.raises(TypeError, match="bogus"):
        NumaNode(0, (), bogus=1)
    with pytest.raises(TypeError, match="id"):
        NumaNode(0, (), id=1)


def test_equality_and_hash_skip_uncompared_fields():
    assert NumaNode(0, (1,), 5, {1: 20}) == NumaNode(0, (1,), 5, {1: 99})
    assert NumaNode(0, (1,), 5) != NumaNode(0, (1,), 6)
    assert hash(NumaNode(0, (1,), distances={1: 20})) == hash(NumaNode(0, (1,)))
    g = Gpu("0000:01:00.0", 0, 0, "GPU-x", "H200", 0, "sysfs numa_node")
    assert GpuRef(0, "GPU-x", "0000:01:00.0", "0", g) == GpuRef(0, "GPU-x", "0000:01:00.0", "0", None)
    assert GpuRef(0, "GPU-x", None, "0") != GpuRef(1, "GPU-x", None, "0")
    assert NA("x") != ("x", None) and not NA("x")


def test_fields_cannot_be_assigned_but_copy_and_pickle_work():
    n = NumaNode(0, (1, 2), 1024, {0: 10})
    with pytest.raises(AttributeError):
        n.id = 3
    with pytest.raises(AttributeError):
        del n.cpus
    for twin in (copy.copy(n), copy.deepcopy(n), pickle.loads(pickle.dumps(n))):
        assert twin == n and twin.distances == {0: 10}
