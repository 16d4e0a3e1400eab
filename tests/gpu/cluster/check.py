#!/usr/bin/env python3
"""Shared-node checks on the cluster of tests/gpu/cluster/up (run as root by
tests/gpu/cluster/check): the exclusive all-GPU job, two shared jobs of two
users (>= 2 GPUs, else skipped), a cancelled and a segfaulting job. Prints a
verdict line per check and writes ``verdict.json`` plus the evidence (task
environments, hook environments, ``scontrol show job -d``, slurmd log
excerpts, gseff, NCCL lines, timings) under ``--out`` in the layout of
tests/data/slurmd-h200/.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

USERS = ("gsrun-gc1", "gsrun-gc2")
TUNE = "swappiness=10,dirty_ratio=40,thp=never"
TUNABLES = ("proc/sys/vm/swappiness", "proc/sys/vm/dirty_ratio", "sys/kernel/mm/transparent_hugepage/enabled")
DONE_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


class Run:
    def __init__(self, cdir: Path, out: Path, seconds: float):
        self.dir, self.out, self.seconds = cdir, out, seconds
        self.ngpu = int((cdir / "ngpu").read_text())
        self.fake = int((cdir / "fake").read_text()) > 0
        self.node = (cdir / "node").read_text().strip()
        self.mode = (cdir / "mode").read_text().strip()
        self.host_root = cdir / "hostroot" if self.fake else Path("/")
        self.verdicts: list[dict] = []
        self.jobs = cdir / "work" / "jobs"        # probe + train.py, readable by the users
        self.jobs.mkdir(parents=True, exist_ok=True)
        repo = Path(__file__).resolve().parents[3]
        shutil.copy(repo / "tests/gpu/cluster/job_probe.py", self.jobs / "job_probe.py")
        shutil.copy(repo / "examples/train.py", self.jobs / "train.py")
        os.chmod(self.jobs, 0o755)
        for f in self.jobs.iterdir():
            os.chmod(f, 0o644)
        self.res = cdir / "work" / "res"           # where tasks write (0777: two users)
        self.res.mkdir(exist_ok=True)
        os.chmod(self.res, 0o1777)

    # --- helpers -----------------------------------------------------------
    def verdict(self, check: str, ok: bool | None, detail: str = "", **figures) -> None:
        word = "SKIP" if ok is None else ("PASS" if ok else "FAIL")
        print(f"{word} {check}: {detail}", flush=True)
        self.verdicts.append({"check": check, "verdict": word, "detail": detail, **figures})

    def env(self, user: str) -> dict:
        return {"PATH": f"{self.dir}/bin:{self.dir}/venv/bin:/usr/local/bin:/usr/bin:/bin",
                "HOME": f"{self.dir}/home/{user}", "LANG": "C.UTF-8", "USER": user,
                "SLURM_CONF": f"{self.dir}/etc/slurm.conf"}

    def as_user(self, user: str, argv: list[str], bg: bool = False, timeout: float = 120):
        cmd = ["runuser", "-u", user, "--", "env", "-i", *[f"{k}={v}" for k, v in self.env(user).items()], *argv]
        kw = dict(cwd=f"{self.dir}/work/{user}", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if bg:
            return subprocess.Popen(cmd, **kw)
        return subprocess.run(cmd, timeout=timeout, **kw)

    def root(self, argv: list[str], timeout: float = 60) -> str:
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                            env={**os.environ, **self.env("root")})
        return cp.stdout + cp.stderr

    def tunables(self) -> dict:
        out = {}
        for t in TUNABLES:
            try:
                out[t] = (self.host_root / t).read_bytes().decode()
            except OSError as e:
                out[t] = f"unreadable: {e.strerror}"
        return out

    def gsrun(self, user: str, name: str, gpus: int, mode: str, seconds: float, extra: list[str]):
        out = self.res / name
        shutil.rmtree(out, ignore_errors=True)    # no marker of an earlier run counts
        argv = ["gsrun", "--gpus", str(gpus), *extra, "--wait", "-J", name, "-o", f"{self.res}/{name}-%j.out",
                str(self.jobs / "job_probe.py"), "--out", str(out), "--mode", mode, "--seconds", str(seconds)]
        return self.as_user(user, argv, bg=True), out

    def job_id(self, user: str, name: str, timeout_s: float = 30) -> str | None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            o = self.root(["squeue", "-h", "-u", user, "-n", name, "-o", "%i"]).split()
            if o and o[0].isdigit():
                return o[0]
            time.sleep(0.3)
        return None

    def wait_started(self, out: Path, ranks: int, timeout_s: float = 90) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all((out / f"started-{r}").exists() for r in range(ranks)):
                return True
            time.sleep(0.3)
        return False

    def log_lines(self, jid: str) -> list[str]:
        try:
            text = (self.dir / "log" / "gsrun.log").read_text(errors="replace")
        except OSError:
            return []
        return [ln for ln in text.splitlines() if f"gsrun[{jid}]" in ln]

    def wait_epilog(self, jid: str, timeout_s: float = 45) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            lines = self.log_lines(jid)
            # the node epilog logs "done in"; EpilogSlurmctld's last phase is mail
            if any(": epilog: done" in ln for ln in lines) and any("epilog-ctld: mail: end" in ln for ln in lines):
                return True
            time.sleep(0.5)
        return any(": epilog: done" in ln for ln in self.log_lines(jid))


    def mps_procs(self) -> list[dict]:
        procs = []
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            try:
                comm = (p / "comm").read_text().strip()
                if not comm.startswith("nvidia-cuda-mps"):
                    continue
                env = dict(kv.split("=", 1) for kv in (p / "environ").read_bytes().decode(errors="replace")
                           .split("\0") if "=" in kv)
                uid = int((p / "status").read_text().split("Uid:")[1].split()[0])
            except (OSError, IndexError, ValueError):
                continue
            procs.append({"pid": int(p.name), "comm": comm, "uid": uid,
                          "pipe": env.get("CUDA_MPS_PIPE_DIRECTORY"), "cuda_visible": env.get("CUDA_VISIBLE_DEVICES")})
        return procs

    def job_state(self, jid: str) -> str:
        m = re.search(r"JobState=(\S+)", self.root(["scontrol", "-o", "show", "job", jid]))
        return m.group(1) if m else "unknown"

    def save(self, rel: str, text: str) -> None:
        p = self.out / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)

    def evidence(self, name: str, jid: str, out: Path) -> dict:
        """Copy what Slurm and gsrun did for one job into out/<name>/."""
        d = self.out / name
        d.mkdir(parents=True, exist_ok=True)
        for f in sorted(out.glob("*.json")):
            shutil.copy(f, d / f.name)
        for f in self.res.glob(f"{name}-{jid}.out"):
            shutil.copy(f, d / "job.out")
        for h in ("prolog", "epilog", "epilog-ctld"):
            src = self.dir / "results" / "env" / f"{h}-{jid}.env"
            if src.exists():
                shutil.copy(src, d / f"{h}.env")
        self.save(f"{name}/gsrun.log", "\n".join(self.log_lines(jid)) + "\n")
        slurmd = (self.dir / "log" / "slurmd.log").read_text(errors="replace").splitlines()
        self.save(f"{name}/slurmd.log", "\n".join(ln for ln in slurmd if f"{jid}" in ln or "gres" in ln.lower()) + "\n")
        return {"prolog_s": _wall(self.log_lines(jid), "prolog"), "epilog_s": _wall(self.log_lines(jid), "epilog")}

    def summary(self, user: str, jid: str, name: str) -> dict | None:
        # EpilogSlurmctld merges in a detached process: wait for the job summary (and for
        # its final state when EpilogSlurmctld saw the job COMPLETING), bounded
        f = self.dir / "gsrun-spool" / "jobs" / jid / "summary.json"
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if json.loads(f.read_text())["job"].get("state_source") != "exit_code":
                    break
            except (OSError, ValueError, KeyError, TypeError):
                pass
            time.sleep(0.5)
        txt = self.as_user(user, ["gseff", jid])
        self.save(f"{name}/gseff.txt", txt.stdout + txt.stderr)
        js = self.as_user(user, ["gseff", "--json", jid])
        self.save(f"{name}/gseff.json", js.stdout + js.stderr)
        try:
            return json.loads(js.stdout)
        except ValueError:
            return None

    # --- checks ------------------------------------------------------------
    def exclusive(self) -> None:
        n, user = self.ngpu, USERS[0]
        before = self.tunables()
        p, out = self.gsrun(user, "excl", n, "train", self.seconds, ["--exclusive", "--tune", TUNE, "--mps"])
        jid = self.job_id(user, "excl")
        started = jid is not None and self.wait_started(out, n)
        during = self.tunables()
        pipe = f"{self.dir}/mps/{jid}/pipe"
        mps = []
        for _ in range(10):         # the daemon is up before the task starts; look a few times
            mps = self.mps_procs()
            if any(q["pipe"] == pipe for q in mps):
                break
            time.sleep(0.5)
        show = self.root(["scontrol", "show", "job", "-d", jid]) if jid else ""
        self.save("excl/scontrol-show-job-d.txt", show)
        try:
            so, se = p.communicate(timeout=self.seconds + 240)
        except subprocess.TimeoutExpired:
            p.kill()
            so, se = p.communicate()
        self.save("excl/gsrun-wait.txt", f"rc {p.returncode}\n--- stdout\n{so}\n--- stderr\n{se}")
        if not jid or not started:
            self.verdict("excl.run", False, f"job {jid} did not start its tasks (gsrun rc {p.returncode}): {se[-500:]}")
            return
        epi = self.wait_epilog(jid)
        after = self.tunables()
        fig = self.evidence("excl", jid, out)
        tasks = [json.loads((out / f"task-{r}.json").read_text()) for r in range(n) if (out / f"task-{r}.json").exists()]
        dones = [json.loads((out / f"done-{r}.json").read_text()) for r in range(n) if (out / f"done-{r}.json").exists()]
        self.verdict("excl.run", p.returncode == 0 and len(tasks) == n and all(d.get("train_rc") == 0 for d in dones),
                     f"job {jid} rc {p.returncode}, {len(tasks)}/{n} tasks, state {self.job_state(jid)}")
        # SLURM_JOB_GPUS / CUDA_VISIBLE_DEVICES as slurmd set them
        penv = _read_env(self.out / "excl" / "prolog.env")
        want_idx = ",".join(str(i) for i in range(n))
        m = re.search(r"GRES=gpu[^ ]*\(IDX:([0-9,-]+)\)", show)
        self.verdict("excl.slurm_gpus", penv.get("SLURM_JOB_GPUS") == want_idx and bool(m) and
                     all(t["env"].get("SLURM_JOB_GPUS") == want_idx for t in tasks),
                     f"prolog SLURM_JOB_GPUS={penv.get('SLURM_JOB_GPUS')}, tasks "
                     f"{[t['env'].get('SLURM_JOB_GPUS') for t in tasks]}, "
                     f"CUDA_VISIBLE_DEVICES {[t['env'].get('CUDA_VISIBLE_DEVICES') for t in tasks]}, "
                     f"scontrol IDX {m.group(1) if m else None}")
        # per-job MPS daemon as the user, serving the job's GPUs
        uid = int(self.root(["id", "-u", user]).strip())
        mine = [q for q in mps if q["pipe"] == pipe]
        self.verdict("excl.mps_daemon", bool(mine) and all(q["uid"] == uid for q in mine) and
                     all(t["env"].get("CUDA_MPS_PIPE_DIRECTORY") == pipe for t in tasks),
                     f"{len(mine)} MPS process(es) on {pipe}: uids {[q['uid'] for q in mine]} (user {uid}), "
                     f"CUDA_VISIBLE_DEVICES of the daemon {[q['cuda_visible'] for q in mine]}; "
                     f"all MPS processes seen {[(q['pid'], q['uid'], q['pipe']) for q in mps]}",
                     mps=mine)
        # each rank bound as gsrun-bind planned it
        bind = [(t["rank"], t["env"].get("GSRUN_BIND_CPUS"), t["affinity"], t["env"].get("GSRUN_GPU")) for t in tasks]
        ok = all(b[1] is not None and _cpus(b[1]) == b[2] for b in bind)
        self.verdict("excl.binding", ok, "; ".join(f"rank {r}: plan {c} got {_fmt(a)} gpu {g}" for r, c, a, g in bind))
        # NCCL transport
        jo = (self.out / "excl" / "job.out").read_text(errors="replace") if (self.out / "excl" / "job.out").exists() else ""
        nccl = [ln for ln in jo.splitlines() if "NCCL INFO" in ln and re.search(r"via|Channel|transport|NVLS|P2P|SHM", ln)]
        self.save("excl/nccl-info.txt", "\n".join(nccl) + "\n")
        transport = sorted(set(re.findall(r"via (P2P/\S+|SHM\S*|NET/\S+|direct pointer)", jo)))
        step = re.search(r"trained (\d+) steps in ([0-9.]+) s on (\d+) ranks \((\w+)\).*step ([0-9.]+) ms", jo)
        bus = [d.get("allreduce", {}).get("busbw_gb_s") for d in dones]
        if self.fake:
            self.verdict("excl.nccl", None, f"fake GPUs: {step.group(4) if step else '?'} backend, no NCCL")
        else:
            self.verdict("excl.nccl", bool(nccl) or n == 1,
                         f"transport {transport or 'none between ranks'} ({len(nccl)} NCCL INFO lines)",
                         transport=transport)
        self.verdict("excl.train", bool(step), (f"{step.group(1)} steps, {step.group(5)} ms/step, {step.group(4)}"
                                               if step else "no 'trained' line") + f", busbw GB/s {bus}",
                     step_ms=float(step.group(5)) if step else None, busbw_gb_s=bus[0] if bus else None)
        # tuning in force during, restored byte-exact after
        want = {"proc/sys/vm/swappiness": "10", "proc/sys/vm/dirty_ratio": "40"}
        ok_during = all(during[k].strip() == v for k, v in want.items()) and "[never]" in during[TUNABLES[2]]
        self.verdict("excl.tuning_during", ok_during, json.dumps({k: v.strip() for k, v in during.items()}))
        self.verdict("excl.tuning_restored", epi and after == before,
                     f"epilog done {epi}; before {json.dumps({k: v.strip() for k, v in before.items()})} "
                     f"after {json.dumps({k: v.strip() for k, v in after.items()})}")
        self.verdict("excl.mps_gone", not [q for q in self.mps_procs() if q["pipe"] == pipe]
                     and not (self.dir / "mps" / jid).exists(), f"{self.dir}/mps/{jid} absent after the epilog")
        # summary, gseff, JS1
        s = self.summary(user, jid, "excl")
        gpus = _summary_gpus(s)
        self.verdict("excl.summary", s is not None and len(gpus) == n,
                     f"gseff --json: state {_state(s)}, GPUs {gpus}")
        self.js1(s, n, jid, "excl")
        self.timings = {"excl": {**fig, "step_ms": float(step.group(5)) if step else None,
                                 "busbw_gb_s": bus[0] if bus else None}}

    def js1(self, s: dict | None, n: int, jid: str, name: str) -> None:
        if s is None:
            self.verdict(f"{name}.js1", False, "no summary")
            return
        from gsrun.report.accounting import valid_js1
        from gsrun.report.records import JobSummary
        from gsrun.report.summary import js1_blob
        blob = js1_blob(JobSummary.from_json(s))
        self.save(f"{name}/js1.txt", (blob or "") + "\n")
        dec = json.loads(gzip.decompress(base64.b64decode(blob[4:]))) if blob else {}
        ctld = [ln for ln in self.log_lines(jid) if "epilog-ctld" in ln]
        self.verdict(f"{name}.js1", bool(blob) and valid_js1(blob),
                     f"{len(blob or '')} chars from the summary (no slurmdbd here: AccountingStorageType=none, so the "
                     f"blob EpilogSlurmctld would store is rebuilt from gseff --json); keys {sorted(dec)[:6]}; "
                     f"epilog-ctld log lines {len(ctld)}")

    def shared(self) -> None:
        if self.ngpu < 2:
            for c in ("shared.two_daemons", "shared.own_gpu_only", "shared.no_leak", "shared.tuning_refused",
                      "shared.first_epilog_leaves_second"):
                self.verdict(c, None, "skipped: needs 2 GPUs")
            return
        hot_p, hot_out = self.gsrun(USERS[0], "hot", 1, "load", 25, ["--mps"])
        idle_p, idle_out = self.gsrun(USERS[1], "idle", 1, "idle", 45, ["--mps", "--tune", "swappiness=10"])
        hj, ij = self.job_id(USERS[0], "hot"), self.job_id(USERS[1], "idle")
        self.wait_started(hot_out, 1)
        self.wait_started(idle_out, 1)
        time.sleep(3)
        mps = self.mps_procs()
        pipes = {j: f"{self.dir}/mps/{j}/pipe" for j in (hj, ij)}
        daemons = {j: [q for q in mps if q["pipe"] == pipes[j]] for j in (hj, ij)}
        self.verdict("shared.two_daemons", all(daemons.values()) and pipes[hj] != pipes[ij],
                     f"hot {hj}: {daemons[hj]}; idle {ij}: {daemons[ij]}")
        t = {j: json.loads((o / "task-0.json").read_text()) for j, o in ((hj, hot_out), (ij, idle_out))
             if (o / "task-0.json").exists()}
        jg = {j: t[j]["env"].get("SLURM_JOB_GPUS") for j in t}
        self.verdict("shared.own_gpu_only", len(t) == 2 and jg[hj] != jg[ij] and
                     all(len(str(t[j]["env"].get("CUDA_VISIBLE_DEVICES", "")).split(",")) == 1 for j in t),
                     f"SLURM_JOB_GPUS {jg}, daemon CUDA_VISIBLE_DEVICES "
                     f"{ {j: [q['cuda_visible'] for q in daemons[j]] for j in daemons} }")
        refused = self.root(["sh", "-c", f"cat {self.res}/idle-{ij}.out"])
        hot_p.communicate(timeout=120)
        self.wait_epilog(hj)
        still = [q for q in self.mps_procs() if q["pipe"] == pipes[ij]]
        self.verdict("shared.first_epilog_leaves_second", bool(still) and not self.job_state(ij) in DONE_STATES,
                     f"after job {hj}'s epilog the idle job's daemon: {still}")
        idle_p.communicate(timeout=120)
        self.wait_epilog(ij)
        for name, j, o in (("hot", hj, hot_out), ("idle", ij, idle_out)):
            self.evidence(name, j, o)
        sh, si = self.summary(USERS[0], hj, "hot"), self.summary(USERS[1], ij, "idle")
        self.verdict("shared.no_leak", len(_summary_gpus(sh)) == 1 and len(_summary_gpus(si)) == 1,
                     f"hot GPUs {_summary_gpus(sh)}; idle GPUs {_summary_gpus(si)}")
        log = "\n".join(self.log_lines(ij)) + refused
        self.verdict("shared.tuning_refused", bool(re.search(r"tun\w*.*(refus|exclusive|not applied|skip)", log, re.I)),
                     "gsrun log/job output of the non-exclusive job with --tune")

    def failures(self) -> None:
        user = USERS[0]
        # scancel mid-run
        before = self.tunables()
        p, out = self.gsrun(user, "cancel", 1, "idle", 120, ["--exclusive", "--tune", TUNE, "--mps"])
        jid = self.job_id(user, "cancel")
        if jid and self.wait_started(out, 1):
            self.root(["scancel", jid])
            try:
                p.communicate(timeout=90)
            except subprocess.TimeoutExpired:
                p.kill()
            epi = self.wait_epilog(jid)
            self.evidence("cancel", jid, out)
            s = self.summary(user, jid, "cancel")
            st = _state(s)
            self.verdict("fail.scancel", epi and self.tunables() == before and not (self.dir / "mps" / jid).exists()
                         and not [q for q in self.mps_procs() if q["pipe"] and f"/mps/{jid}/" in q["pipe"]]
                         and bool(st) and "CANCEL" in str(st).upper(),
                         f"job {jid}: epilog {epi}, tunables restored {self.tunables() == before}, "
                         f"summary state {st}, Slurm state {self.job_state(jid)}")
        else:
            self.verdict("fail.scancel", False, f"job {jid} did not start")
            p.kill()
        # a task that segfaults
        p, out = self.gsrun(user, "segv", 1, "segv", 1, ["--exclusive", "--tune", TUNE, "--mps"])
        jid = self.job_id(user, "segv")
        try:
            p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
        if jid:
            epi = self.wait_epilog(jid)
            self.evidence("segv", jid, out)
            s = self.summary(user, jid, "segv")
            st = _state(s)
            self.verdict("fail.segfault", epi and self.tunables() == before and not (self.dir / "mps" / jid).exists()
                         and bool(st) and "FAIL" in str(st).upper(),
                         f"job {jid}: gsrun rc {p.returncode}, epilog {epi}, tunables restored "
                         f"{self.tunables() == before}, summary state {st}, Slurm state {self.job_state(jid)}")
        else:
            self.verdict("fail.segfault", False, "no job id")


def _wall(lines: list[str], hook: str) -> float | None:
    for ln in lines:
        m = re.search(rf": {hook}: done in ([0-9.]+) s", ln)
        if m:
            return float(m.group(1))
    return None


def _read_env(p: Path) -> dict:
    try:
        return dict(ln.split("=", 1) for ln in p.read_text().splitlines() if "=" in ln)
    except OSError:
        return {}


def _cpus(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-")
            out += range(int(a), int(b) + 1)
        elif part.strip():
            out.append(int(part))
    return sorted(out)


def _fmt(cpus: list[int]) -> str:
    return ",".join(map(str, cpus))


def _summary_gpus(s: dict | None) -> list:
    """(node, index) of each GPU in a ``gseff --json`` summary."""
    if not s:
        return []
    return [(g.get("node"), g.get("index")) for g in (s.get("gpu") or {}).get("devices") or []]


def _state(s: dict | None) -> str | None:
    return ((s or {}).get("job") or {}).get("state")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=os.environ.get("GSRUN_GPU_CLUSTER_DIR", "/tmp/gsrun-gpucluster"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--only", default="excl,shared,fail")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    r = Run(Path(a.dir), out, a.seconds)
    r.timings = {}
    t0 = time.monotonic()
    for name, fn in (("excl", r.exclusive), ("shared", r.shared), ("fail", r.failures)):
        if name in a.only.split(","):
            try:
                fn()
            except Exception as e:   # one broken check must not hide the others' verdicts
                r.verdict(f"{name}.error", False, f"{type(e).__name__}: {e}")
    cfg = {"node": r.node, "gpus": r.ngpu, "fake": r.fake, "mode": r.mode,
           "up_s": float((r.dir / "up_s").read_text()) if (r.dir / "up_s").exists() else None,
           "stepd": (r.dir / "stepd-mode").read_text().strip(),
           "cgroup_fallback": (r.dir / "cgroup-fallback.txt").read_text() if (r.dir / "cgroup-fallback.txt").exists() else None,
           "libs_carried_and_used": (r.dir / "libmissing.txt").read_text().split() if (r.dir / "libmissing.txt").exists() else []}
    for f in ("slurm.conf", "gres.conf", "cgroup.conf", "plugstack.conf", "gsrun.toml"):
        shutil.copy(r.dir / "etc" / f, out / f)
    shutil.copy(r.dir / "log" / "slurmd.log", out / "slurmd-full.log")
    shutil.copy(r.dir / "log" / "slurmctld.log", out / "slurmctld-full.log")
    fails = [v for v in r.verdicts if v["verdict"] == "FAIL"]
    verdict = {"ok": not fails, "checks": r.verdicts, "cluster": cfg, "timings": r.timings,
               "wall_s": round(time.monotonic() - t0, 1)}
    (out / "verdict.json").write_text(json.dumps(verdict, indent=1, sort_keys=True) + "\n")
    n = {w: sum(v["verdict"] == w for v in r.verdicts) for w in ("PASS", "FAIL", "SKIP")}
    print(f"VERDICT {'PASS' if not fails else 'FAIL'}: {n['PASS']} pass, {n['FAIL']} fail, {n['SKIP']} skipped "
          f"({r.ngpu} {'fake ' if r.fake else ''}GPU(s), {r.mode}, up {cfg['up_s']} s)", flush=True)
    return 0 if not fails else 1


if __name__ == "__main__":
    raise SystemExit(main())
