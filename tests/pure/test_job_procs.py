"""JobProcs: the job's processes on a node without job cgroups, from psutil's process table."""

from types import SimpleNamespace

import pytest

from gsrun.node import sampler

JOB_UID = 1000


class Proc:
    """A psutil.Process double: its uid and environment can change (setuid, exec); reads are counted."""

    def __init__(self, pid: int, started: float, uid: int, env: dict, cpu_s: float = 1.0):
        self.pid, self.started, self.uid, self.env, self.cpu_s = pid, started, uid, env, cpu_s
        self.uid_reads = 0
        self.alive = True

    def create_time(self):
        return self.started

    def is_running(self):
        return self.alive

    def uids(self):
        self.uid_reads += 1
        return SimpleNamespace(real=self.uid)

    def environ(self):
        return dict(self.env)

    def cpu_times(self):
        return SimpleNamespace(user=self.cpu_s, system=0.0)

    def memory_info(self):
        return SimpleNamespace(rss=4096)


@pytest.fixture
def node(monkeypatch):
    clock = SimpleNamespace(now=1000.0)
    procs: list[Proc] = []
    monkeypatch.setattr(sampler, "_SETTLED_UIDS", {})
    monkeypatch.setattr(sampler.psutil, "process_iter", lambda: iter(list(procs)))
    monkeypatch.setattr(sampler.time, "time", lambda: clock.now)
    return clock, procs


def test_a_settled_process_of_another_user_is_read_once_for_every_job(node):
    clock, procs = node
    other = Proc(10, 100.0, 1001, {"SLURM_JOB_ID": "7"})
    task = Proc(11, 990.0, JOB_UID, {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1"}, cpu_s=2.5)
    procs += [other, task]
    job = sampler.JobProcs("7", JOB_UID, "n1")
    assert job.poll() == (2.5, 4096) and job.current == {11}
    job.poll()
    later = sampler.JobProcs("8", JOB_UID, "n1")      # a job begun later on the node
    assert later.poll() == (0, 0)
    assert other.uid_reads == 1 and (10, 100.0) in job.other and (10, 100.0) in later.other


def test_a_root_process_that_becomes_the_jobs_user_late_is_counted(node):
    """A task that stays root past the settle time (container set-up before the setuid and exec)
    is never taken for another user's for good: its uid is read again every RECHECK_S."""
    clock, procs = node
    task = Proc(20, 900.0, 0, {})
    procs.append(task)
    job = sampler.JobProcs("7", JOB_UID, "n1")
    assert job.poll() == (0, 0) and job.other == {(20, 900.0): 1000.0 + sampler.RECHECK_S}
    clock.now += 5
    job.poll()
    assert task.uid_reads == 1                        # root, read within RECHECK_S: not again
    task.uid, task.env = JOB_UID, {"SLURM_JOB_ID": "7"}
    clock.now += sampler.RECHECK_S
    assert job.poll() == (1.0, 4096) and job.current == {20}


def test_a_task_of_the_jobs_user_before_its_exec_is_counted_once_it_has_execd(node):
    """Before its exec a task shows slurmstepd's environment (no SLURM_JOB_ID): a settled one is
    looked at again every RECHECK_S, not taken for another job's; one naming another job is."""
    clock, procs = node
    task = Proc(21, 900.0, JOB_UID, {"SLURM_CONF": "/etc/slurm/slurm.conf"})
    elsewhere = Proc(22, 900.0, JOB_UID, {"SLURM_JOB_ID": "6"})
    procs += [task, elsewhere]
    job = sampler.JobProcs("7", JOB_UID, "n1")
    assert job.poll() == (0, 0) and job.other[(22, 900.0)] == float("inf")
    task.env = {"SLURM_JOB_ID": "7"}
    clock.now += sampler.RECHECK_S
    assert job.poll() == (1.0, 4096) and job.current == {21}


def test_a_process_between_fork_and_exec_is_looked_at_again(node):
    clock, procs = node
    young = Proc(30, 999.0, JOB_UID, {})              # the job's user, its environment not the job's yet
    procs.append(young)
    job = sampler.JobProcs("7", JOB_UID, "n1")
    assert job.poll() == (0, 0) and not job.other
    young.env = {"SLURM_JOB_ID": "7"}
    assert job.poll() == (1.0, 4096)


def test_the_shared_uid_map_keeps_to_the_live_processes(node):
    clock, procs = node
    procs += [Proc(100 + i, 10.0, 1001, {}) for i in range(200)]
    sampler.JobProcs("7", JOB_UID, "n1").poll()
    assert len(sampler._SETTLED_UIDS) == 200
    del procs[:]
    job = sampler.JobProcs("8", JOB_UID, "n1")
    job.poll()
    assert sampler._SETTLED_UIDS == {} and job.other == {}


def test_an_exited_process_keeps_its_cpu_time_in_one_sum(node):
    """A job that runs thousands of short processes: their CPU time stays counted, their keys do not."""
    clock, procs = node
    job = sampler.JobProcs("7", JOB_UID, "n1")
    for i in range(1000):
        procs[:] = [Proc(1000 + i, 990.0, JOB_UID, {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1"}, cpu_s=0.5)]
        assert job.poll()[0] == pytest.approx(0.5 * (i + 1))
    assert len(job.seen) == 1
    del procs[:]
    assert job.poll() == (pytest.approx(500.0), 0) and job.seen == {} and job.current == set()


def test_a_reused_pid_ends_the_old_process_not_its_count(node):
    """psutil >= 6 keeps a cached process object for a pid: once the pid is another process's,
    the old process's CPU time stays counted and the newcomer's is not taken for it."""
    clock, procs = node
    task = Proc(40, 990.0, JOB_UID, {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1"}, cpu_s=3.0)
    procs.append(task)
    job = sampler.JobProcs("7", JOB_UID, "n1")
    assert job.poll() == (3.0, 4096)
    task.alive, task.cpu_s = False, 100.0       # the pid is now an unrelated process's
    assert job.poll() == (3.0, 0) and job.seen == {} and job.exited_cpu_s == 3.0
    procs[:] = [Proc(40, 1001.0, 1001, {}, cpu_s=100.0)]     # psutil's next table: the newcomer, its own key
    assert job.poll() == (3.0, 0) and (40, 1001.0) not in job.seen


def test_another_nodes_task_of_the_job_is_not_counted(node):
    """Several slurmd on one host: a settled task of the job on another node is left out for good,
    a young one is looked at again (as any young process), never counted."""
    clock, procs = node
    procs += [Proc(41, 900.0, JOB_UID, {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n2"}),
              Proc(42, 999.0, JOB_UID, {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n2"})]
    job = sampler.JobProcs("7", JOB_UID, "n1")
    assert job.poll() == (0, 0) and job.other == {(41, 900.0): float("inf")}
    assert job.poll() == (0, 0) and job.current == set()
