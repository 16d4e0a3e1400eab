"""Which jobs' textfiles and live files the prolog removes (gsrun.node.sweep.gone_jobs)."""

from gsrun.node.sweep import StateJob, gone_jobs


def test_gone_without_state_dir_or_with_a_dead_sampler():
    state = {"100": StateJob("100", True), "101": StateJob("101", False), "102": StateJob("102", None)}
    # 100: sampler alive; 101: recorded sampler gone; 102: prolog in progress; 103: no state dir (epilog ran)
    assert gone_jobs(["100", "101", "102", "103"], state, "200") == ["101", "103"]


def test_the_sweeping_job_is_never_gone():
    assert gone_jobs(["200", "7"], {}, "200") == ["7"]
