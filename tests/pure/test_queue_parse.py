"""squeue/sacct/sbatch answers as ``gsrun --wait`` reads them (gsrun.facts.slurm),
in the forms Slurm 22.05 and 24.11+ print (src/squeue/print.c)."""

from __future__ import annotations

import pytest

from gsrun.base.errors import InputError, SlurmError
from gsrun.facts.slurm import (accounting_argv, parse_accounting, parse_parsable, parse_queue, parse_queue_exit,
                               queue_argv)


def test_queue_argv_one_rpc_local_or_cluster():
    assert queue_argv() == ["squeue", "--local", "--me", "-h", "-t", "all", "-O",
                            "JobID:|,State:|,Reason:|,TimeUsed:|,NodeList:|,exit_code:|,StdOut:|"]
    assert queue_argv("gpu")[1:3] == ["-M", "gpu"] and "--local" not in queue_argv("gpu")


def test_parse_queue_both_versions_and_cluster_header():
    text = ("CLUSTER: gpu\n"
            "45|RUNNING|None|0:04|gpu01|0|/w/six-%j.out|\n"       # 22.05: raw status, patterns kept
            "46|PENDING|Resources|0:00||3:0|/w/a|b.out|\n")        # 24.11: N:S; a | in the path
    q = parse_queue(text)
    assert sorted(q) == ["45", "46"]
    assert q["45"]["StdOut"] == "/w/six-%j.out" and q["45"]["NodeList"] == "gpu01"
    assert q["46"]["StdOut"] == "/w/a|b.out" and q["46"]["Reason"] == "Resources"


@pytest.mark.parametrize("text,want", [("0", (0, 0)), ("768", (3, 0)), ("9", (0, 9)), ("15", (0, 15)),
                                       ("3:0", (3, 0)), ("0:9", (0, 9)), ("", (0, 0)), ("x", (0, 0))])
def test_queue_exit_code(text, want):
    assert parse_queue_exit(text) == want


def test_accounting_empty_is_not_yet_and_last_run_wins():
    assert accounting_argv("7", "gpu")[:3] == ["sacct", "-M", "gpu"]
    assert parse_accounting("", "7") is None
    rec = parse_accounting("7|REQUEUED|0:0|00:01:00|n1\n7|COMPLETED|0:0|00:02:00|n2\n", "7")
    assert rec == {"JobID": "7", "State": "COMPLETED", "ExitCode": "0:0", "Elapsed": "00:02:00", "NodeList": "n2"}


def test_parsable_with_cluster():
    assert parse_parsable("42\n") == ("42", None)
    assert parse_parsable("42;gpu\n") == ("42", "gpu")
    with pytest.raises(InputError):
        parse_parsable("Submitted batch job 42")
    with pytest.raises(SlurmError):
        parse_parsable("42;-x")
