#!/usr/bin/env python3
"""cstate, irq, hugepages, memlock and a jemalloc preload on a real GPU node,
through gsrun's own prolog/epilog. Run as root on the H200 VM from
the repository root; under 3 minutes; never touches MIG, compute mode,
clocks, persistence or ECC:

    python3 -P tests/gpu/tuning_real.py --out tuning_real.json

1. snapshot byte for byte every file the three settings govern: every
   ``cpuN/cpuidle/stateK/disable``, every ``/proc/irq/N/smp_affinity_list``,
   every ``nodeN/hugepages/*/nr_hugepages``;
2. with this checkout installed (``tests/gpu/run --steps tuning`` does it), run ``gsrun-node prolog``
   with slurmd's recorded environment (:mod:`slurm_env`, ``SLURM_JOB_GPUS=0``),
   ``SPANK_GS_TUNE=cstate=c1,irq=local,hugepages=2M:<N>`` and the fake
   ``scontrol`` saying ``OverSubscribe=NO`` (the job holds the node);
3. during the job: the GPU's MSI IRQs read the job CPUs of its NUMA node,
   ``nr_hugepages`` >= N on the GPU's node, the cpuidle states (if the VM has
   any) disabled, the sampler holds ``/dev/cpu_dma_latency`` (its
   ``/proc/<pid>/fd``), ``gsrun-node status --json`` lists the changes in
   effect; gsrun-bind raises a task's 64 KiB soft RLIMIT_MEMLOCK to its unlimited
   hard one and says nothing about a low hard one on the task's terminal; ``gsrun --malloc jemalloc``: the malloc block of the script ``gsrun
   --dry-run`` renders (site ``malloc.lib_dirs`` starting with ``--carry-dir``,
   default ``build/carry`` where ``tests/gpu/carry-malloc`` puts a
   ``libjemalloc.so.2``; else the node's own) runs, then ``gsrun-bind`` starts
   ``tests/gpu/malloc_task.py``, which sees jemalloc mapped (``/proc/self/maps``) and
   ``MALLOC_CONF`` in force (``mallctl opt.background_thread``);
4. ``gsrun-node epilog``; then every snapshotted file is byte-exact again,
   no sampler holds ``/dev/cpu_dma_latency``, a new process has no jemalloc,
   and the node summary's ``settings`` (the report's "node settings during the
   job" line) name irq, hugepages, cstate and malloc.

Prints one JSON verdict (``ok``, ``checks``, ``absent`` = what this machine
does not expose) and exits 0 when every check holds.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))

import slurm_env  # noqa: E402

JOB_ID = "990020"
NODE = "h200"
GLOBS = ("/sys/devices/system/cpu/cpu*/cpuidle/state*/disable", "/proc/irq/*/smp_affinity_list",
         "/sys/devices/system/node/node*/hugepages/hugepages-*/nr_hugepages")
LIBDIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/lib/x86_64-linux-gnu", "/usr/local/lib")


def snap() -> dict[str, bytes]:
    out = {}
    for g in GLOBS:
        for p in glob.glob(g):
            try:
                out[p] = Path(p).read_bytes()
            except OSError:
                pass
    return out


def run(argv, env, timeout=120, **kw):
    cp = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, cwd="/", **kw)
    return {"rc": cp.returncode, "stdout": cp.stdout[-3000:], "stderr": cp.stderr[-3000:]}


def gpu_irqs() -> tuple[str | None, list[str], int | None]:
    for d in sorted(glob.glob("/sys/bus/pci/devices/*")):
        try:
            if Path(d, "vendor").read_text().strip() == "0x10de" and Path(d, "class").read_text().startswith("0x03"):
                irqs = sorted(os.listdir(f"{d}/msi_irqs"), key=int) if os.path.isdir(f"{d}/msi_irqs") else []
                node = int(Path(d, "numa_node").read_text())
                return os.path.basename(d), irqs, node
        except (OSError, ValueError):
            continue
    return None, [], None


def find_lib(name: str) -> str | None:
    for d in LIBDIRS:
        p = os.path.join(d, name)
        if os.path.isfile(p):
            return p
    return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--pages", type=int, default=512, help="2 MiB pages per GPU NUMA node (default 512 = 1 GiB)")
    ap.add_argument("--seconds", type=float, default=5.0, help="how long the fake job runs")
    ap.add_argument("--carry-dir", default=str(REPO / "build" / "carry"),
                    help="a directory with a carried libjemalloc.so.2 (tests/gpu/carry-malloc)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print(json.dumps({"ok": False, "error": "run as root (slurmd's part)"}))
        return 2
    t0 = time.time()
    tune = f"cstate=c1,irq=local,hugepages=2M:{args.pages}"
    out: dict = {"tune": tune, "checks": {}, "absent": [], "figures": {}}
    checks, absent = out["checks"], out["absent"]
    before = snap()
    out["figures"]["files_snapshotted"] = len(before)
    idle_files = [p for p in before if "/cpuidle/" in p]
    if not idle_files:
        absent.append("cpuidle states (no /sys/devices/system/cpu/cpu*/cpuidle: cpuidle driver "
                      + (Path("/sys/devices/system/cpu/cpuidle/current_driver").read_text().strip()
                         if os.path.exists("/sys/devices/system/cpu/cpuidle/current_driver") else "absent")
                      + "): cstate is the /dev/cpu_dma_latency hold only")
    if not os.path.exists("/dev/cpu_dma_latency"):
        absent.append("/dev/cpu_dma_latency")
    bdf, irqs, numa = gpu_irqs()
    out["figures"].update({"gpu": bdf, "gpu_irqs": irqs, "gpu_numa_node": numa})
    if (subprocess.run(["pgrep", "-x", "irqbalance"], capture_output=True).returncode == 0):
        out["figures"]["irqbalance"] = "running: irq=local is refused while it runs"

    node_exe = shutil.which("gsrun-node")
    if not node_exe:
        raise SystemExit(json.dumps({"ok": False, "error": "gsrun-node not on PATH",
                                     "hint": "run it through tests/gpu/run (installs this checkout)"}))
    env_add, bindir = {}, os.path.dirname(node_exe)
    base = Path(tempfile.mkdtemp(prefix="gsrun-tune-", dir="/tmp"))
    os.chmod(base, 0o755)
    cfg = base / "gsrun.toml"
    from gsrun.request.malloc import LIB_DIRS
    carried = os.path.join(os.path.abspath(args.carry_dir), "libjemalloc.so.2")
    je = carried if os.path.isfile(carried) else find_lib("libjemalloc.so.2")
    out["figures"]["jemalloc"] = je
    lib_dirs = ([os.path.dirname(je)] if je else []) + [d for d in LIB_DIRS if not je or d != os.path.dirname(je)]
    cfg.write_text(f'[paths]\nstate_dir = "{base}/state"\nspool_dir = "{base}/spool"\nmps_dir = "{base}/mps"\n'
                   '\n[sampler]\ninterval_s = 1.0\nflush_s = 2.0\n'
                   '\n[malloc]\nlib_dirs = [' + ", ".join(json.dumps(d) for d in lib_dirs) + ']\n')
    fakebin = slurm_env.write_fake_scontrol(base / "bin")
    path = ":".join(x for x in (fakebin, bindir, slurm_env.SAFE_PATH) if x)
    extra = {"GSRUN_CONFIG": str(cfg), "PATH": path, "FAKE_COMMENT": "gsrun:tune=" + tune,
             "FAKE_USER": "nobody", "FAKE_UID": "65534", **env_add}
    spank = {"SPANK_GS_TUNE": tune, "SPANK_GS_EXCLUSIVE": "1"}
    cpus = os.cpu_count() or 1
    work = base / "job"
    work.mkdir()
    node_cmd = [sys.executable, "-P", "-m", "gsrun.admin.node"]
    daemon = slurm_env.start_node_daemon(shutil.which("gsrun-node") or "gsrun-node", base / "state", extra,
                                         log_path=base / "daemon.log")   # the node monitor the hooks ask

    if je:   # what gsrun --malloc jemalloc writes in the job comment (the report shows it)
        extra["SLURM_JOB_COMMENT"] = f"gsrun:tune={tune};malloc=jemalloc"
    penv = slurm_env.prolog_env(JOB_ID, 65534, 65534, "nobody", NODE, "0", cpus, str(work), spank, extra)
    pr = run(node_cmd + ["prolog"], penv)
    out["prolog"] = pr
    checks["prolog_rc0"] = pr["rc"] == 0
    rec_p = base / "spool" / "jobs" / JOB_ID / f"prolog-{NODE}.json"
    rec = json.loads(rec_p.read_text()) if rec_p.exists() else {}
    tun = (rec.get("steps") or {}).get("tuning") or {}
    out["tuning_report"] = {k: tun.get(k) for k in ("applied", "unchanged", "refused", "unsupported", "failed",
                                                    "holds")}
    out["tuning_items"] = [{k: i.get(k) for k in ("key", "action", "value", "reason")} for i in tun.get("items", [])]

    # --- during the job
    time.sleep(1.5)
    st = run(node_cmd + ["status", "--json"], penv)
    try:
        status = json.loads(st["stdout"])
    except ValueError:
        status = {}
    changes = {c["key"]: c for c in (status.get("tuning") or status).get("changes", [])} if status else {}
    out["status_keys"] = {k: c.get("in_effect") for k, c in changes.items()}
    checks["status_lists_irq_hugepages_in_effect"] = all(changes.get(k, {}).get("in_effect")
                                                         for k in ("irq", "hugepages"))
    if irqs:
        now = {n: (Path(f"/proc/irq/{n}/smp_affinity_list").read_text().strip()
                   if os.path.exists(f"/proc/irq/{n}/smp_affinity_list") else None) for n in irqs}
        out["figures"]["gpu_irq_affinity_during"] = now
        want = (changes.get("irq") or {}).get("target") or {}
        checks["gpu_irqs_pinned"] = bool(want) and all(now.get(n) == v for n, v in want.items())
    else:
        absent.append("GPU MSI IRQs (no msi_irqs)")
    hp = glob.glob("/sys/devices/system/node/node*/hugepages/hugepages-2048kB/nr_hugepages")
    out["figures"]["nr_hugepages_2M_during"] = {p.split("/")[5]: Path(p).read_text().strip() for p in hp}
    checks["hugepages_reserved"] = any(int(Path(p).read_text()) >= args.pages for p in hp)
    if idle_files:
        dis = sum(Path(p).read_text().strip() == "1" for p in idle_files)
        out["figures"]["idle_states_disabled_during"] = dis
        checks["cstate_states_disabled"] = dis > 0
    holders = []
    for fd in glob.glob("/proc/[0-9]*/fd/*"):
        try:
            if os.readlink(fd) == "/dev/cpu_dma_latency":
                holders.append(int(fd.split("/")[2]))
        except OSError:
            pass
    out["figures"]["dma_latency_holders"] = holders
    if os.path.exists("/dev/cpu_dma_latency"):
        checks["sampler_holds_cpu_dma_latency"] = bool(holders)

    # memlock: gsrun-bind raises a 64 KiB soft limit to an unlimited hard one, and a low hard
    # limit is the admin's (doctor, the report's node settings): nothing on the task's terminal
    tenv = slurm_env.task_env(JOB_ID, 65534, "nobody", NODE, "0", cpus, str(work), extra=env_add)
    tenv["PATH"] = path
    gbin = shutil.which("gsrun-bind", path=path) or "gsrun-bind"
    bind = run([gbin, "--", "/bin/sh", "-c", "ulimit -l"], tenv, timeout=60,
               preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_MEMLOCK, (65536, resource.RLIM_INFINITY)))
    out["memlock_bind_stdout"] = bind["stdout"][-200:]
    checks["memlock_soft_raised_to_hard"] = bind["rc"] == 0 and bind["stdout"].strip() == "unlimited"
    low = run([gbin, "--", "/bin/true"], tenv, timeout=60,
              preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_MEMLOCK, (65536, 65536)))
    out["memlock_bind_stderr"] = low["stderr"][-800:]
    checks["memlock_not_on_the_terminal"] = low["rc"] == 0 and "RLIMIT_MEMLOCK" not in low["stderr"]

    task = str(HERE / "malloc_task.py")
    if je:
        gsrun_exe = shutil.which("gsrun", path=path) or "gsrun"
        rendered = run([gsrun_exe, "--gpus", "1", "--gpus-per-node", "1", "--malloc", "jemalloc", "--dry-run",
                        sys.executable, task], {"PATH": path, "HOME": "/root", "GSRUN_CONFIG": str(cfg)},
                       timeout=60)
        lines = rendered["stdout"].splitlines()
        start = next((i for i, ln in enumerate(lines) if ln.startswith("# --malloc jemalloc")), None)
        end = next((i for i, ln in enumerate(lines) if start is not None and i > start
                    and ln.startswith("export MALLOC_CONF=")), None)
        checks["malloc_block_rendered"] = rendered["rc"] == 0 and start is not None and end is not None
        if start is not None and end is not None:
            block = "\n".join(lines[start:end + 1])
            out["malloc_block_tail"] = lines[end - 1:end + 1]
            gb = shutil.which("gsrun-bind", path=path) or "gsrun-bind"
            t = run(["/bin/bash", "-c", block + f"\nexec {gb} -- {sys.executable} {task}"], tenv, timeout=60)
            try:
                seen = json.loads(t["stdout"].strip().splitlines()[-1])
            except (ValueError, IndexError):
                seen = {"error": t}
            out["malloc_task"] = seen
            from gsrun.request.config import load_config
            want_conf = load_config(str(cfg))["malloc.jemalloc_conf"]
            checks["jemalloc_mapped_in_task"] = any(str(p).endswith("libjemalloc.so.2") for p in seen.get("mapped", []))
            checks["malloc_conf_in_force"] = (seen.get("MALLOC_CONF") == want_conf
                                              and seen.get("opt.background_thread") is True)
    else:
        absent.append("libjemalloc.so.2: not carried (tests/gpu/carry-malloc, then carry build/carry) and not in "
                      + ", ".join(LIBDIRS))

    time.sleep(max(0.0, args.seconds - (time.time() - t0) % args.seconds))
    eenv = slurm_env.epilog_env(JOB_ID, 65534, 65534, "nobody", NODE, "0", cpus, str(work), spank, extra)
    ep = run(node_cmd + ["epilog"], eenv)
    out["epilog"] = ep
    checks["epilog_rc0"] = ep["rc"] == 0
    after = snap()
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    out["figures"]["files_changed_after"] = changed[:20]
    checks["restored_byte_exact"] = not changed
    time.sleep(0.5)
    left = []
    for fd in glob.glob("/proc/[0-9]*/fd/*"):
        try:
            if os.readlink(fd) == "/dev/cpu_dma_latency":
                left.append(fd)
        except OSError:
            pass
    checks["dma_latency_released"] = not left
    if je:   # nothing of the preload stays on the node: a new process maps no jemalloc
        cp = subprocess.run([sys.executable, task], capture_output=True, text=True, timeout=30, cwd="/")
        checks["jemalloc_not_after"] = cp.returncode == 0 and json.loads(cp.stdout)["mapped"] == []
    # the report's "node settings during the job" line, from the node summary the epilog wrote
    node_p = base / "spool" / "jobs" / JOB_ID / f"node-{NODE}.json"
    try:
        from gsrun.report.render import settings_lines
        from gsrun.report.records import JobInfo, NodeSummary
        from gsrun.report.summary import job_summary
        node_s = json.loads(node_p.read_text())
        js = job_summary(JobInfo(**{"id": JOB_ID, "nodes": [NODE]}), [NodeSummary.from_json(node_s)])
        out["report_settings_lines"] = settings_lines(js)
        keys = {x["key"]: x["state"] for x in node_s.get("settings") or []}
        out["figures"]["settings_states"] = keys
        checks["report_names_the_settings"] = (len(out["report_settings_lines"]) == 1
                                               and all(k in keys for k in ("cstate", "irq", "hugepages"))
                                               and (not je or keys.get("malloc") == "requested"))
    except (OSError, ValueError, KeyError) as e:
        out["report_settings_error"] = str(e)
        checks["report_names_the_settings"] = False
    daemon.terminate()
    daemon.wait(30)
    out["wall_s"] = round(time.time() - t0, 1)
    out["ok"] = all(checks.values())
    text = json.dumps(out, indent=1, default=str)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    shutil.rmtree(base, ignore_errors=True)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
