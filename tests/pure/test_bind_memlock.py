"""gsrun-bind's RLIMIT_MEMLOCK check."""

import resource

import pytest

from gsrun.wrapper.bind import memlock_warning

pytestmark = pytest.mark.pure


def test_unlimited_is_fine_and_a_64k_limit_warns_with_the_slurm_fix():
    assert memlock_warning(resource.RLIM_INFINITY, None) is None
    w = memlock_warning(65536, None)
    assert w.startswith("memlock: RLIMIT_MEMLOCK is 65536 bytes (64 KiB), below unlimited")
    assert "PropagateResourceLimitsExcept=MEMLOCK" in w and "LimitMEMLOCK=infinity" in w


def test_site_floor_in_bytes():
    assert memlock_warning(8 << 30, str(4 << 30)) is None
    assert "below 4294967296 bytes" in memlock_warning(1 << 30, str(4 << 30))
    assert memlock_warning(None, None) is None
    assert "below unlimited" in memlock_warning(1 << 30, "lots")
