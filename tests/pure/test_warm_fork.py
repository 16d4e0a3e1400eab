"""The hook child's waiting copy (gsrun.base.proc.WarmFork): taken once, only for a
program it can become, and only for the command line of that program."""

from __future__ import annotations

import sys

import pytest

from gsrun.base import proc
from gsrun.epilog.main import sampler_recorded


@pytest.fixture
def warm():
    w = proc.WarmFork(12345, None, {"gsrun.epilog.sampler"})
    proc.set_warm(w)
    yield w
    proc.set_warm(None)


def test_taken_once_and_only_for_a_program_it_can_become(warm):
    assert proc.take_warm("gsrun.epilog.ctld") is None
    assert proc.take_warm("gsrun.epilog.sampler") is warm and warm.module == "gsrun.epilog.sampler"
    assert proc.take_warm("gsrun.epilog.sampler") is None


def test_spawn_detached_uses_it_only_for_root_python_of_that_module(warm):
    assert proc._warm_for(["/bin/sh", "-c", "x"]) is None
    assert proc._warm_for([sys.executable, "-P", "-s", "-m", "gsrun.epilog.ctld", "finish", "1"]) is None
    assert proc._warm_for(["/usr/bin/python3-other", "-P", "-s", "-m", "gsrun.epilog.sampler"]) is None \
        or sys.executable == "/usr/bin/python3-other"
    assert proc._warm_for(proc.root_python("-m", "gsrun.epilog.sampler", "--job-id", "1")) is warm


def test_outside_the_agent_there_is_none():
    proc.set_warm(None)
    assert proc.take_warm("gsrun.epilog.sampler") is None
    assert proc._warm_for(proc.root_python("-m", "gsrun.epilog.sampler")) is None


REC = {"pid": 4321, "create_time": 1796127343.26, "argv": []}


@pytest.mark.parametrize("prolog,pid_info,expected", [
    ({"steps": {"sampler": dict(REC)}}, dict(REC), True),
    ({"steps": {"sampler": dict(REC, pid=4322)}}, dict(REC), False),             # a second sampler since
    ({"steps": {"sampler": dict(REC, create_time=1.0)}}, dict(REC), False),      # the PID reused
    ({"steps": {"sampler": {"error": "OSError"}}}, dict(REC), False),            # the step failed
    ({"steps": {}}, dict(REC), False),                                           # killed before the step
    ({}, dict(REC), False),                                                      # no record (killed)
    ({"steps": {"sampler": dict(REC)}}, None, False),                            # no pid file
    ({"steps": {"sampler": dict(REC, pid="4321")}}, dict(REC, pid="4321"), False),
    ({"steps": {"sampler": dict(REC, create_time=None)}}, dict(REC, create_time=None), False),  # no start time
])
def test_the_epilog_trusts_only_a_finished_prolog_record(prolog, pid_info, expected):
    assert sampler_recorded(prolog, pid_info) is expected
