#!/usr/bin/env python3
"""cstate, irq, hugepages, memlock and a jemalloc preload on a real GPU node,
through gsrun's own prolog/epilog (issue 20). Run as root on the H200 VM from
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
   effect; gsrun-bind warns about memlock for a task whose RLIMIT_MEMLOCK is
   64 KiB; ``libjemalloc.so.2`` (if on the node) preloads in a child process;
4. ``gsrun-node epilog``; then every snapshotted file is byte-exact again and
   no sampler holds ``/dev/cpu_dma_latency``.

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
    cfg.write_text(f'[paths]\nstate_dir = "{base}/state"\nspool_dir = "{base}/spool"\nmps_dir = "{base}/mps"\n'
                   '\n[sampler]\ninterval_s = 1.0\nflush_s = 2.0\n')
    fakebin = slurm_env.write_fake_scontrol(base / "bin")
    path = ":".join(x for x in (fakebin, bindir, slurm_env.SAFE_PATH) if x)
    extra = {"GSRUN_CONFIG": str(cfg), "PATH": path, "FAKE_COMMENT": "gsrun:tune=" + tune,
             "FAKE_USER": "nobody", "FAKE_UID": "65534", **env_add}
    spank = {"SPANK_GS_TUNE": tune, "SPANK_GS_EXCLUSIVE": "1"}
    cpus = os.cpu_count() or 1
    work = base / "job"
    work.mkdir()
    node_cmd = [sys.executable, "-P", "-m", "gsrun.wrapper.node"]

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

    # memlock: a task at 64 KiB must get gsrun-bind's warning (local rank 0)
    tenv = slurm_env.task_env(JOB_ID, 65534, "nobody", NODE, "0", cpus, str(work), extra=env_add)
    tenv["PATH"] = path
    bind_cmd = [shutil.which("gsrun-bind", path=path) or "gsrun-bind", "--", "/bin/true"]
    bind = run(bind_cmd, tenv, timeout=60,
               preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_MEMLOCK, (65536, 65536)))
    out["memlock_bind_stderr"] = bind["stderr"][-800:]
    checks["memlock_warning"] = bind["rc"] == 0 and "RLIMIT_MEMLOCK is 65536 bytes" in bind["stderr"]
    bind_ok = run(bind_cmd, tenv, timeout=60)
    out["figures"]["memlock_root_limit"] = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    if resource.getrlimit(resource.RLIMIT_MEMLOCK)[0] == resource.RLIM_INFINITY:
        checks["memlock_no_warning_when_unlimited"] = "RLIMIT_MEMLOCK" not in bind_ok["stderr"]

    je = find_lib("libjemalloc.so.2")
    if je:
        cp = subprocess.run([sys.executable, "-c", "import os;print(open('/proc/self/maps').read().count('jemalloc'))"],
                            env={**os.environ, "LD_PRELOAD": je}, capture_output=True, text=True, timeout=30)
        checks["jemalloc_preloaded"] = cp.returncode == 0 and int(cp.stdout.strip() or 0) > 0
    else:
        absent.append("libjemalloc.so.2 (Debian/Ubuntu package libjemalloc2) in " + ", ".join(LIBDIRS))

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
