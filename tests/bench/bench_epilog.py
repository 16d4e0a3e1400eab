#!/usr/bin/env python3
"""Hook wall times on a fake host root, against the interpreter floor measured
in the same run (docs/history/benchmarks-log.md, "Hot paths").

    python3 -P tests/bench/bench_epilog.py [--venv /opt/gsrun/venv] [--runs 11] [--interval-s 5] [--run-s 0.3]

The hooks run as slurmd runs them: through the node daemon (``*_daemon``: the
venv's ``gsrun-node daemon run`` on a private socket, each hook run by its
client ``gsrun-hook`` as ``gsrun-node install`` writes it), and, for the
cost of the hook's own code, the command the daemon runs (the venv's
interpreter ``-I -S``, :func:`gsrun.admin.node_entry.hook_argv`) as a fresh
process (``prolog``, ``epilog``). ``--venv`` defaults to the
cluster install ``tests/cluster/up`` makes from this checkout
(``/opt/gsrun/venv``). The floor is that venv's ``python3 -c pass``; the
isolated floor (``python3 -I -S -c pass``) is printed too.

As root or not (the fake site of ``tests/helpers/node_site.py``: the H200
VM recording with a fake NVML, tuning applied to the fake tree). For each
run: ``gsrun-node prolog`` (the node monitor begins sampling the job, tuning
journaled when tuned), ``--run-s`` seconds of "job", then ``gsrun-node epilog``
(restore, then the monitor's final sample and the node summary; through the
daemon the client has its answer before these two: ``epilog_done_*`` is the
time until the job's state directory is gone, the report's end). One node daemon runs
for the whole bench: its monitor (NVML opened once) serves every hook.
Without and with tuning (``SPANK_GS_TUNE``); ``--no-daemon`` skips the runs
through the daemon (no C compiler). Also ``gsrun --dry-run`` and
``gsrun-bind --plan --json`` on the same recorded host, with the venv's
interpreter; the dry run without a site config (``dry_run``: built-in
defaults, as the target is set) and with the fake site's ``gsrun.toml``
(``dry_run_config``: ``tomllib`` and the checks, as on a cluster).

Prints JSON: medians (ms) and ratios to the floor; the targets (epilog <=
2.5x, prolog <= 3x, ``gsrun --dry-run`` <= 4x) are in ``targets`` with
``met`` true/false. Exits 0 whatever the figures (2: no usable venv).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from helpers.node_site import TUNE, make_site  # noqa: E402

CLI = "import sys\nfrom gsrun.wrapper.cli import main\nmain(sys.argv[1:])\n"
BIND = "from gsrun.wrapper.bind import main\nmain(prog_name='gsrun-bind')\n"
H200 = REPO / "tests" / "data" / "hosts" / "h200-vm"


def wall_ms(argv, env=None, cwd="/") -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    cp = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=cwd, timeout=120)
    return (time.perf_counter() - t0) * 1000.0, cp


def _parts(stderr: str) -> dict[str, float]:
    """A hook's log lines ``<step>: end (S s)`` and ``done in S s`` -> {step: ms, "steps": ms}."""
    import re

    out = {m.group(1): float(m.group(2)) * 1000 for m in re.finditer(r": ([a-z+_]+): end \(([0-9.]+) s\)", stderr)}
    m = re.search(r"done in ([0-9.]+) s", stderr)
    if m:
        out["steps"] = float(m.group(1)) * 1000
    return out


def hook_ms(hook: list[str], env, via: tuple[str, str] | None = None) -> tuple[float, subprocess.CompletedProcess]:
    """One hook run: ``hook`` is the command as ``gsrun-node install`` writes it (the install's
    interpreter -I -S with the hook bootstrap: :func:`gsrun.admin.node_entry.hook_argv`); ``via``:
    ``(gsrun-hook, socket)``, through the node daemon as slurmd runs it, else the command itself."""
    argv = [via[0], via[1], *hook] if via else hook
    t0 = time.perf_counter()
    cp = subprocess.run(argv, env=env, capture_output=True, text=True, errors="replace", timeout=120, cwd="/")
    return (time.perf_counter() - t0) * 1000.0, cp


def start_daemon(venv: str, site, real_host: bool, build: bool = True) -> tuple[str | None, str]:
    """The node daemon of ``venv`` on a socket under the site's base, with the site's
    state dir, config and (unless ``real_host``) host root: its node monitor serves every
    hook of the run, through the daemon or not -> ``(client, socket)``; ``client`` is
    the ``gsrun-hook`` built there, None when ``build`` is off or there is no C compiler."""
    import atexit

    client = None
    if build:
        client_dir = os.path.join(site.base, "daemon-bin")
        b = subprocess.run([os.path.join(venv, "bin", "gsrun-node"), "daemon", "build", "--out-dir", client_dir],
                           capture_output=True, text=True)
        if b.returncode:
            print(f"bench_epilog: no gsrun-hook ({b.stderr.strip()[-200:]})", file=sys.stderr)
        else:
            client = os.path.join(client_dir, "gsrun-hook")
    run_dir = os.path.join(site.base, "daemon-run")
    os.mkdir(run_dir, 0o700)
    sock = os.path.join(run_dir, "daemon.sock")
    site.state.mkdir(mode=0o755, parents=True, exist_ok=True)
    args = ["--state-dir", str(site.state), "--metrics-port", "0"]
    if not real_host:
        args += ["--host-root", str(site.host)]
    p = subprocess.Popen([os.path.join(venv, "bin", "gsrun-node"), "daemon", "run", "--socket", sock, *args],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/",
                         env={**os.environ, "GSRUN_CONFIG": str(site.config)})
    atexit.register(lambda: (p.terminate(), p.wait()))
    deadline = time.monotonic() + 30
    while not (site.state / "monitor.sock").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return client, sock


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--venv", default="/opt/gsrun/venv", help="a regular install of gsrun (not editable)")
    ap.add_argument("--runs", type=int, default=11)
    ap.add_argument("--interval-s", type=float, default=5.0, help="sampler.interval_s (site default 5)")
    ap.add_argument("--run-s", type=float, default=0.3, help="job length between prolog and epilog")
    ap.add_argument("--no-daemon", action="store_true",
                    help="skip the hooks through the node daemon (gsrun-node daemon run + gsrun-hook; needs cc)")
    ap.add_argument("--real-host", action="store_true",
                    help="the hooks on this machine's own /proc, /sys and NVML (root; a GPU node: the tuned "
                         "case changes and restores real settings), not the recorded H200 VM")
    a = ap.parse_args()
    python = os.path.join(a.venv, "bin", "python3")
    probe = subprocess.run([python, "-P", "-c", "import json, os, gsrun\nfrom gsrun.admin.node_entry import hook_argv\n"
                            "print(json.dumps([hook_argv('prolog'), os.path.dirname(os.path.dirname(gsrun.__file__))]))"],
                           capture_output=True, text=True, cwd="/")
    got = json.loads(probe.stdout) if probe.returncode == 0 and probe.stdout.strip() else None
    if not got:
        print(f"bench_epilog: no gsrun in {a.venv} ({probe.stderr.strip()[-200:]})"
              "\nhint: tests/cluster/up installs this checkout there; or: python3 -m venv V && V/bin/pip install .",
              file=sys.stderr)
        return 2
    # what `gsrun-node install` writes: the interpreter -I -S with the bootstrap, or (a venv that
    # needs its site module, e.g. one that sees another Python's packages) its gsrun-node
    argv, site_dir = got[0] or [os.path.join(a.venv, "bin", "gsrun-node"), "prolog"], got[1]
    hooks = {"prolog": argv, "epilog": [*argv[:-1], "epilog"]}
    # byte-compile that install as pip does for a wheel (--no-compile installs exist)
    subprocess.run([python, "-m", "compileall", "-q", os.path.join(site_dir, "gsrun")], check=True,
                   capture_output=True)
    where = [os.path.join(site_dir, "gsrun")]
    site = make_site()
    text = site.config.read_text().replace("interval_s = 0.2", f"interval_s = {a.interval_s}") \
        .replace("flush_s = 0.2", "flush_s = 30")
    site.config.write_text(text)
    py = [python, "-P"]
    res: dict[str, list[float]] = {k: [] for k in ("floor", "floor_isolated", "prolog", "epilog", "prolog_tuned",
                                                    "epilog_tuned", "dry_run", "dry_run_config", "bind_plan")}
    client, sock = start_daemon(a.venv, site, a.real_host, build=not a.no_daemon)
    daemon = (client, sock) if client else None
    if daemon:
        for k in ("prolog_daemon", "epilog_daemon", "prolog_tuned_daemon", "epilog_tuned_daemon"):
            res[k] = []
    errors: list[str] = []
    parts: dict[str, list[dict]] = {"epilog": [], "epilog_tuned": []}
    script = site.base / "train.py"
    script.write_text("print('hi')\n")
    job = 5000
    for i in range(a.runs):
        res["floor"].append(wall_ms([python, "-c", "pass"])[0])
        res["floor_isolated"].append(wall_ms([python, "-I", "-S", "-c", "pass"])[0])
        for tuned, via in ((False, None), (True, None), *(((False, daemon), (True, daemon)) if daemon else ())):
            job += 1
            # slurmd 22.05's prolog environment (the credential's SLURM_JOB_RESTART_COUNT): a plain job
            # makes no Slurm call; a tuned one asks for the job record (OverSubscribe), which the
            # fake scontrol answers at once, one bash start
            env = site.env(job_id=str(job), spank={"SPANK_GS_TUNE": TUNE} if tuned else None, FAKE_SLURM="record",
                           SLURM_JOB_RESTART_COUNT="0",
                           FAKE_SCONTROL_RECORD=f"JobId={job} JobName=bench UserId=nobody(65534) "
                                                "OverSubscribe=NO Comment=(null)")
            if a.real_host:
                env.pop("GSRUN_HOST_ROOT", None)
            sfx = ("_tuned" if tuned else "") + ("_daemon" if via else "")
            ms, cp = hook_ms(hooks["prolog"], env, via)
            parts.setdefault("prolog" + sfx, []).append(_parts(cp.stderr))
            res["prolog" + sfx].append(ms)
            if cp.returncode:
                errors.append(f"prolog rc {cp.returncode}: {cp.stderr[-300:]}")
            time.sleep(a.run_s)
            t0 = time.perf_counter()
            ms, cp = hook_ms(hooks["epilog"], env, via)
            parts.setdefault("epilog" + sfx, []).append(_parts(cp.stderr))
            res["epilog" + sfx].append(ms)
            if cp.returncode:
                errors.append(f"epilog rc {cp.returncode}: {cp.stderr[-300:]}")
            if via:     # answered once the node is restored; its report (the job's state dir removed last)
                sdir = site.state / "jobs" / str(job)      # ends before the next hook, as slurmd's jobs do
                while sdir.exists() and time.perf_counter() - t0 < 10:
                    time.sleep(0.0005)
                res.setdefault("epilog_done" + sfx, []).append((time.perf_counter() - t0) * 1000.0)
        ms, cp = wall_ms([*py, "-c", CLI, "--dry-run", "--gpus", "1", "--gpus-per-node", "1",
                          str(script)], cwd=str(site.base))
        res["dry_run"].append(ms)
        if cp.returncode:
            errors.append(f"gsrun --dry-run rc {cp.returncode}: {cp.stderr[-300:]}")
        ms, cp = wall_ms([*py, "-c", CLI, "--dry-run", "--gpus", "1", "--gpus-per-node", "1",
                          str(script)], env={**os.environ, "GSRUN_CONFIG": str(site.config)}, cwd=str(site.base))
        res["dry_run_config"].append(ms)
        if cp.returncode:
            errors.append(f"gsrun --dry-run (site config) rc {cp.returncode}: {cp.stderr[-300:]}")
        ms, cp = wall_ms([*py, "-c", BIND, "--plan", "--json", "--host-root", str(H200),
                          "--gpus", "0"])
        res["bind_plan"].append(ms)
        if cp.returncode:
            errors.append(f"gsrun-bind --plan rc {cp.returncode}: {cp.stderr[-300:]}")
    med = {k: round(statistics.median(v), 1) for k, v in res.items()}
    floor = med["floor"]
    ratio = {k: round(v / floor, 2) for k, v in med.items() if k != "floor"}
    targets = {"epilog": 2.5, "epilog_tuned": 2.5, "prolog": 3.0, "prolog_tuned": 3.0, "dry_run": 4.0}
    if daemon:      # the same targets, for the hooks through the node daemon
        targets.update({k + "_daemon": targets[k] for k in ("epilog", "epilog_tuned", "prolog", "prolog_tuned")})
    out = {"runs": a.runs, "interval_s": a.interval_s, "real_host": a.real_host, "python": python, "gsrun": where[0], "hooks": hooks,
           "load_avg": [round(x, 2) for x in os.getloadavg()], "median_ms": med, "ratio_to_floor": ratio,
           "targets": {k: {"max_ratio": t, "ratio": ratio[k], "met": ratio[k] <= t} for k, t in targets.items()},
           "steps_median_ms": {k: {p: round(statistics.median([d[p] for d in v if p in d]), 1)
                                               for p in sorted({p for d in v for p in d})}
                                           for k, v in parts.items()},
           "errors": errors[:5]}
    print(json.dumps(out, indent=1))
    shutil.rmtree(site.base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
