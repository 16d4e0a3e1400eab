"""Real-Slurm tier: the ``cluster`` fixture (tests/run brings the cluster up and
sets GSRUN_TEST_CLUSTER; without it these tests are skipped)."""

import pytest

from helpers.cluster import CLUSTER, Cluster


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    c = Cluster(CLUSTER)
    assert c.conf.exists(), f"no cluster at {CLUSTER}: run tests/cluster/up"
    return c
