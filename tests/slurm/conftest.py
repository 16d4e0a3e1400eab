"""Real-Slurm tier: the ``cluster`` fixture (tests/run brings the cluster up and
sets GSRUN_TEST_CLUSTER; without it these tests are skipped)."""

import pytest

from helpers.cluster import CLUSTER, Cluster


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    c = Cluster(CLUSTER)
    assert c.conf.exists(), f"no cluster at {CLUSTER}: run tests/cluster/up"
    return c


@pytest.fixture
def smtp_server():
    """The test SMTP server on 127.0.0.1:18025 (the cluster's gsrun.toml sends there): the
    messages received, as aiosmtpd envelopes."""
    aiosmtpd = pytest.importorskip("aiosmtpd.controller")
    received = []

    class Handler:
        async def handle_DATA(self, server, session, envelope):
            received.append(envelope)
            return "250 OK"

    ctl = aiosmtpd.Controller(Handler(), hostname="127.0.0.1", port=18025)
    ctl.start()
    try:
        yield received
    finally:
        ctl.stop()
