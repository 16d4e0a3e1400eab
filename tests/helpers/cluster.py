"""The local Slurm cluster of ``tests/cluster/up`` as the real-Slurm tier sees it:
jobs are submitted as the unprivileged test user, evidence comes from what
slurmd itself ran (no tests here)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import NamedTuple

from gsrun.facts.sacct import parse_sacct
from gsrun.facts.slurm import parse_job_record, state_word

CLUSTER = os.environ.get("GSRUN_TEST_CLUSTER")
VENV = os.environ.get("GSRUN_VENV", "/opt/gsrun/venv")
USER = os.environ.get("GSRUN_TEST_USER", "gsrun-test")
# states a job or step does not leave
END_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                        "BOOT_FAIL", "DEADLINE"})
STEP_FORMAT = ("JobID", "State", "ExitCode")


class JobEnd(NamedTuple):
    """How Slurm says a job (or step) ended: ``state`` the word (``CANCELLED``
    of ``CANCELLED by 0``), ``exit_code`` as Slurm prints it (``status:signal``),
    ``derived`` the DerivedExitCode (None where the source has none), ``output``
    the job's StdOut path (None where unknown), ``source`` where it was read."""
    state: str
    exit_code: str
    derived: str | None
    output: str | None
    source: str


class Cluster:
    def __init__(self, root: str):
        self.dir = Path(root)
        self.conf = self.dir / "etc" / "slurm.conf"
        self.work = self.dir / "work"
        self.spool = self.dir / "gsrun-spool"
        self.state = self.dir / "gsrun-state"
        self.hostroot = self.dir / "hostroot"
        self.gsrun_config = self.dir / "etc" / "gsrun.toml"

    def env(self, **extra) -> dict:
        env = {"HOME": str(self.work), "PATH": f"{VENV}/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
               "SLURM_CONF": str(self.conf), "GSRUN_CONFIG": str(self.gsrun_config)}
        env.update(extra)
        return env

    def as_user(self, argv, timeout=600, check=False, input_text=None, **extra) -> subprocess.CompletedProcess:
        """Run ``argv`` as the test user in the cluster's work directory."""
        cmd = ["runuser", "-u", USER, "--", "env", "-i", *[f"{k}={v}" for k, v in self.env(**extra).items()],
               *argv]
        cp = subprocess.run(cmd, cwd=self.work, capture_output=True, text=True, timeout=timeout,
                            input=input_text)
        if check and cp.returncode != 0:
            raise AssertionError(f"{argv} -> {cp.returncode}\nstdout:\n{cp.stdout}\nstderr:\n{cp.stderr}")
        return cp

    def as_root(self, argv, timeout=120, check=True) -> subprocess.CompletedProcess:
        env = dict(os.environ, **self.env())
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
        if check and cp.returncode != 0:
            raise AssertionError(f"{argv} -> {cp.returncode}\n{cp.stdout}\n{cp.stderr}")
        return cp

    def user_script(self, name: str, text: str) -> str:
        """``text`` as the test user's executable ``name`` in the work directory -> its path."""
        p = self.work / name
        p.write_text(text)
        p.chmod(0o755)
        shutil.chown(p, USER)
        return str(p)

    def job_id_from(self, text: str) -> str:
        m = re.search(r"submitted job (\d+)", text) or re.search(r"Submitted batch job (\d+)", text)
        assert m, f"no job id in:\n{text}"
        return m.group(1)

    def wait_file(self, path: Path, timeout_s: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if path.exists():
                return True
            time.sleep(0.25)
        return False

    def wait_job_done(self, job_id: str, timeout_s: float = 300.0) -> str:
        """The job's end state once it has one (see :meth:`job_end`)."""
        return self.job_end(job_id, timeout_s).state

    def _sacct(self, job: str, fmt=STEP_FORMAT) -> list:
        """sacct's rows for ``job`` (``ID`` or ``ID.STEP``), parsed by the product's
        sacct parser; None when the cluster has no accounting to ask."""
        cp = self.as_root(["sacct", "-n", "-P", "-o", ",".join(fmt), "-j", job], check=False)
        if cp.returncode != 0:
            return None
        return parse_sacct(cp.stdout, fmt)

    def job_state(self, job_id: str) -> str:
        """The job's state word now (``""`` when slurmctld has no record of it)."""
        cp = self.as_root(["scontrol", "-o", "show", "job", job_id], check=False)
        rec = parse_job_record(cp.stdout, job_id) if cp.returncode == 0 else None
        return state_word((rec or {}).get("JobState"))

    def job_end(self, job_id: str, timeout_s: float = 300.0) -> JobEnd:
        """Wait until the job has ended; its end as slurmctld's record says
        (``scontrol -o show job``, read by the product's
        :func:`gsrun.facts.slurm.parse_job_record`), or as accounting says
        (``sacct -X``) once the record has aged out of slurmctld."""
        deadline = time.monotonic() + timeout_s
        seen = ""
        while True:
            cp = self.as_root(["scontrol", "-o", "show", "job", job_id], check=False)
            rec = parse_job_record(cp.stdout, job_id) if cp.returncode == 0 else None
            if rec is not None:
                seen = state_word(rec.get("JobState"))
                if seen in END_STATES:
                    return JobEnd(seen, rec.get("ExitCode", ""), rec.get("DerivedExitCode"), rec.get("StdOut"),
                                  "scontrol")
            elif "Invalid job id" in cp.stdout + cp.stderr:
                rows = [r for r in self._sacct(job_id) or [] if r.job_id == job_id and r.step == ""]
                if rows and rows[0].state in END_STATES:
                    return JobEnd(rows[0].state, rows[0].exit_code or "", None, None, "sacct")
            if time.monotonic() >= deadline:
                raise AssertionError(f"job {job_id} not ended after {timeout_s} s (state {seen or '?'}; "
                                     f"scontrol: {(cp.stdout + cp.stderr).strip()[-300:]})")
            time.sleep(0.5)

    def assert_job_end(self, job_id: str, state: str = "COMPLETED", exit_code: str = "0:0",
                       timeout_s: float = 300.0, output: Path | str | None = None) -> JobEnd:
        """Wait for the job's end and check its state and exit code exactly;
        the failure shows both, the derived exit code and the tail of the job's
        output file (``output``, else the record's StdOut)."""
        end = self.job_end(job_id, timeout_s)
        if (end.state, end.exit_code) != (state, exit_code):
            raise AssertionError(f"job {job_id} ended {end.state} ExitCode={end.exit_code} "
                                 f"DerivedExitCode={end.derived} (from {end.source}), expected {state} "
                                 f"ExitCode={exit_code}\n{self._output_tail(job_id, output or end.output)}")
        return end

    def step_end(self, job_id: str, step: str = "0", timeout_s: float = 60.0) -> JobEnd | None:
        """A step's end as accounting says (``sacct -j ID.STEP``); None when the
        cluster has no accounting (then the srun's own return code is the evidence)."""
        deadline = time.monotonic() + timeout_s
        seen = ""
        while True:
            rows = self._sacct(f"{job_id}.{step}")
            if rows is None:
                return None
            rows = [r for r in rows if r.job_id == job_id and r.step == step]
            if rows:
                seen = rows[0].state or ""
                if seen in END_STATES:
                    return JobEnd(seen, rows[0].exit_code or "", None, None, "sacct")
            if time.monotonic() >= deadline:
                raise AssertionError(f"step {job_id}.{step} not ended in accounting after {timeout_s} s "
                                     f"(state {seen or 'no record'})")
            time.sleep(0.5)

    def assert_srun_ok(self, cp: subprocess.CompletedProcess, job_id: str, step: str = "0") -> None:
        """An ``srun`` run directly (its own allocation): exit status 0, its
        job COMPLETED 0:0, and its step COMPLETED 0:0 where accounting keeps steps."""
        assert cp.returncode == 0, f"srun (job {job_id}) -> {cp.returncode}\n{cp.stdout[-2000:]}\n{cp.stderr[-2000:]}"
        self.assert_job_end(job_id)
        end = self.step_end(job_id, step)
        if end is not None and (end.state, end.exit_code) != ("COMPLETED", "0:0"):
            raise AssertionError(f"step {job_id}.{step} ended {end.state} ExitCode={end.exit_code} (from sacct)\n"
                                 f"srun stderr:\n{cp.stderr[-2000:]}")

    def _output_tail(self, job_id: str, path, lines: int = 20) -> str:
        if not path or path == "/dev/null":
            return "(no output file)"
        p = Path(str(path).replace("%j", job_id).replace("%A", job_id))
        if not p.is_absolute():
            p = self.work / p
        try:
            tail = p.read_text(errors="replace").splitlines()[-lines:]
        except OSError as e:
            return f"(output {p}: {e.strerror})"
        return f"last {len(tail)} lines of {p}:\n" + "\n".join(tail)

    def restart_monitors(self, timeout_s: float = 60.0) -> None:
        """Make both nodes' daemons start a fresh node monitor (SIGHUP: the daemon
        re-executes), which opens NVML again: what a test that changes a node's
        fake ``nvml.json`` needs (the monitor opens NVML once, at its start)."""
        from gsrun.daemon import server

        for n in ("gpu01", "gpu02"):
            sock = str(self.state / n / "daemon.sock")
            old = server.ping(sock)["monitor_pid"]
            os.kill(int((self.dir / "run" / f"daemon-{n}.pid").read_text()), signal.SIGHUP)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                try:
                    new = server.ping(sock)["monitor_pid"]
                    if new not in (None, old) and os.path.exists(self.state / n / "monitor.sock"):
                        break
                except Exception:  # noqa: BLE001 - re-executing: no answer for a moment
                    pass
                time.sleep(0.1)
            else:
                raise AssertionError(f"the daemon of {n} did not start a new monitor within {timeout_s} s")

    @contextlib.contextmanager
    def fake_nvml(self, record: dict):
        """``record`` as both nodes' ``nvml.json`` for the ``with`` block, the node
        monitors restarted on entry and exit (they read NVML at their start)."""
        nvs = [self.hostroot / n / "nvml.json" for n in ("gpu01", "gpu02")]
        assert not any(nv.exists() for nv in nvs), "a fake nvml.json is already in the host tree"
        for nv in nvs:
            nv.write_text(json.dumps(record))
            nv.chmod(0o644)
        try:
            self.restart_monitors()
            yield nvs
        finally:
            for nv in nvs:
                nv.unlink(missing_ok=True)
            self.restart_monitors()

    def hostroot_changes(self) -> list[str]:
        """Files of the fake host tree whose bytes differ from the baseline taken at bring-up
        (``nvml.json``, the fake NVML of ``up --fake-nvml`` or of a test, is not tuning: left out)."""
        base = {}
        for line in (self.dir / "hostroot.sha256").read_text().splitlines():
            digest, name = line.split(None, 1)
            if not name.endswith("/nvml.json"):
                base[name] = digest
        cp = subprocess.run("find . -type f ! -name nvml.json | sort | xargs sha256sum", shell=True, cwd=self.hostroot,
                            capture_output=True, text=True, check=True)
        now = {}
        for line in cp.stdout.splitlines():
            digest, name = line.split(None, 1)
            now[name] = digest
        return sorted(n for n in set(base) | set(now) if base.get(n) != now.get(n))


