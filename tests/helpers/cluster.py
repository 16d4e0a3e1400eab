"""The local Slurm cluster of ``tests/cluster/up`` as the real-Slurm tier sees it:
jobs are submitted as the unprivileged test user, evidence comes from what
slurmd itself ran (no tests here)."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

CLUSTER = os.environ.get("GSRUN_TEST_CLUSTER")
VENV = os.environ.get("GSRUN_VENV", "/opt/gsrun/venv")
USER = os.environ.get("GSRUN_TEST_USER", "gsrun-test")


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
        deadline = time.monotonic() + timeout_s
        state = ""
        while time.monotonic() < deadline:
            cp = self.as_root(["scontrol", "-o", "show", "job", job_id], check=False)
            m = re.search(r"JobState=(\S+)", cp.stdout)
            state = m.group(1) if m else ""
            if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
                return state
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} not done after {timeout_s} s (state {state})")

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


