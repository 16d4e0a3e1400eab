"""A request no partition can ever hold is refused at submit, from what
``sinfo`` and ``scontrol show partition`` say (recorded outputs in
``tests/data/slurm-partitions/``); ``--wait`` names a pending reason
that will not change by itself, once, with the hint."""

from __future__ import annotations

import io

import pytest

from gsrun.base.errors import InputError
from gsrun.facts.slurm import PENDING_FOR_GOOD, parse_node_gres, parse_partitions, pending_for_good
from gsrun.wrapper.spec import partition_offer, plan_nodes, refuse_unrunnable
from gsrun.wrapper.submit import JobState, follow_to_end
from helpers.paths import DATA

REC = DATA / "slurm-partitions"


@pytest.fixture(scope="module")
def cluster():
    offer, default = parse_node_gres((REC / "two-h200-nodes.sinfo.txt").read_text())
    parts = parse_partitions((REC / "two-h200-nodes.scontrol.txt").read_text())
    return offer, default, parts


def test_the_recorded_outputs_parse(cluster):
    offer, default, parts = cluster
    assert default == "gpu"
    assert offer == {"gpu": {"gpu01": 4, "gpu02": 4}, "gpu-exempt": {"gpu01": 4, "gpu02": 4},
                     "debug": {"login01": 0}}
    assert (parts["gpu"]["MaxNodes"], parts["gpu-exempt"]["MaxNodes"], parts["debug"]["MaxTime"]) == \
        ("UNLIMITED", "1", "00:30:00")
    assert partition_offer("gpu", offer["gpu"], parts["gpu"]) == (8, 2, 4)
    assert partition_offer("gpu-exempt", offer["gpu-exempt"], parts["gpu-exempt"]) == (4, 1, 4)
    assert partition_offer("debug", offer["debug"], parts["debug"]) == (0, 0, 0)


def test_nodes_are_told_apart_by_node_name_not_hostname():
    """The local test cluster's real outputs (Slurm 22.05): both emulated nodes have the
    hostname localhost (``%n``), so only the NodeName (``%N``) counts them as two; with the
    hostname, --gpus 8 on 2 x 4 GPUs was refused as needing more than "1 node"."""
    from gsrun.facts.slurm import NODE_GRES_ARGV

    assert NODE_GRES_ARGV[-1] == "%P|%N|%G"
    offer, default = parse_node_gres((REC / "local-cluster.sinfo.txt").read_text())
    parts = parse_partitions((REC / "local-cluster.scontrol.txt").read_text())
    assert (default, offer["gpu"]) == ("gpu", {"gpu01": 4, "gpu02": 4})
    assert partition_offer("gpu", offer["gpu"], parts["gpu"]) == (8, 2, 4)
    refuse_unrunnable(8, 2, 4, None, offer, default, parts)
    refuse_unrunnable(2, 2, 1, None, offer, default, parts)     # --gpus 2 --nodes 2


def test_sixteen_gpus_on_a_cluster_of_eight_are_refused_with_what_exists(cluster):
    nodes, per = plan_nodes(16, None, None, 4)
    assert (nodes, per) == (4, 4)
    with pytest.raises(InputError) as e:
        refuse_unrunnable(16, nodes, per, None, *cluster)
    assert str(e.value).splitlines() == [
        "gsrun: submit: no partition can run this: 4 nodes x 4 GPUs (--gpus 16); partition gpu: 2 nodes with "
        "4 or more GPUs, at most 8 GPUs (2 x 4) in one job",
        "hint: ask for at most --gpus 8 (2 nodes x 4 GPUs) in partition gpu"]


def test_what_fits_somewhere_is_let_through(cluster):
    refuse_unrunnable(8, 2, 4, None, *cluster)                 # the default partition holds it
    refuse_unrunnable(4, 1, 4, ["gpu-exempt"], *cluster)
    refuse_unrunnable(8, 2, 4, ["gpu-exempt", "gpu"], *cluster)   # one of the two can
    refuse_unrunnable(8, 2, 4, ["elsewhere"], *cluster)        # unknown here: sbatch judges
    refuse_unrunnable(8, 2, 4, None, {}, None, {})              # sinfo said nothing


def test_max_nodes_and_gpu_less_partitions_are_named(cluster):
    with pytest.raises(InputError) as e:
        refuse_unrunnable(8, 2, 4, ["gpu-exempt"], *cluster)
    assert "partition gpu-exempt: 2 nodes with 4 or more GPUs, MaxNodes=1, at most 4 GPUs (1 x 4)" in str(e.value)
    assert e.value.hint == "ask for at most --gpus 4 (1 node x 4 GPUs) in partition gpu-exempt"
    with pytest.raises(InputError) as e:
        refuse_unrunnable(1, 1, 1, ["debug"], *cluster)
    assert e.value.hint == "partition debug has no GPU nodes: pick another (sinfo -o '%P %D %G')"


def test_wait_names_a_reason_for_good_once_with_the_hint(tmp_path):
    log = tmp_path / "slurm-9.out"
    log.write_text("")
    t = [0.0]
    answers = [JobState("PENDING", "0:00", 0, 0, str(log), "", "Priority")] + \
        [JobState("PENDING", "0:00", 0, 0, str(log), "", "PartitionConfig")] * 5 + \
        [JobState("CANCELLED", "0:00", 0, 15, str(log), "", "")]

    def poller(_job):
        return answers.pop(0)

    err = io.StringIO()
    rc = follow_to_end("9", out=io.StringIO(), err=err, poller=poller, clock=lambda: t[0],
                sleep=lambda s: t.__setitem__(0, t[0] + s), jitter=lambda: 1.0).rc
    assert rc == 128 + 15
    said = [ln for ln in err.getvalue().splitlines() if "for good" in ln]
    assert said == [f"gsrun: wait: job 9: pending (PartitionConfig) for good: {PENDING_FOR_GOOD['PartitionConfig']}; "
                    "it will not start as it is"]
    assert err.getvalue().count("hint: scancel 9, then ask for what exists: sinfo -o '%P %D %G %l'") == 1
    assert pending_for_good("Priority") is None and pending_for_good("Resources") is None
