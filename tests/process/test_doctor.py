"""gsrun-node doctor on recorded host roots (real H200 VM, CI emulated),
the emulated cluster's fake gres, and synthetic failures."""

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from gsrun.admin import doctor
from gsrun.facts.hostfs import HostFS
from gsrun.admin.node import cli

DATA = Path(__file__).resolve().parents[1] / "data"
H200 = DATA / "hosts" / "h200-vm"
CI = DATA / "hosts" / "ci-emulated"


class FakeRun:
    def __init__(self, answers=None):
        self.answers = answers or {}
        self.calls = []

    def __call__(self, argv, **kw):
        self.calls.append(list(argv))
        assert kw.get("timeout", 0) > 0
        a = self.answers.get(argv[0])
        if a is None:
            raise FileNotFoundError(argv[0])
        return subprocess.CompletedProcess(argv, a[0], a[1], a[2] if len(a) > 2 else "")


def ctx_for(root, tmp_path, config_text="", run=None, **kw):
    cfg = tmp_path / "gsrun.toml"
    cfg.write_text(config_text)
    (tmp_path / "state").mkdir(exist_ok=True)
    (tmp_path / "spool").mkdir(exist_ok=True)
    kw.setdefault("slurm_conf", str(tmp_path / "no-slurm" / "slurm.conf"))
    return doctor.Context(HostFS(root), config_path=str(cfg), state_dir=str(tmp_path / "state"),
                          spool_dir=str(tmp_path / "spool"), run=run or FakeRun(), environ={"PATH": ""}, **kw)


def by_name(checks):
    return {c.name: c for c in checks}


def test_h200_recording(tmp_path):
    ctx = ctx_for(H200, tmp_path, run=FakeRun({"slurmctld": (0, "slurm-wlm 22.05.8\n")}))
    r = by_name(doctor.run_all(ctx))
    assert r["nvml"].status == "ok"
    assert r["nvml"].data == {"driver": "580.159.04", "nvml": "13.580.159.04", "cuda": "13.0", "count": 1}
    g = r["gpus"]
    assert g.status == "ok"
    assert g.data["gpus"][0]["pci_bus_id"] == "0000:00:06.0"
    assert g.data["gpus"][0]["minor"] == 0
    assert g.data["gpus"][0]["sysfs_numa_node"] == -1        # the VM's firmware gives no locality ...
    assert g.data["gpus"][0]["numa_node"] == 0               # ... decided from the NVML affinity mask
    assert "NVIDIA H200" in g.detail and "sysfs -1" in g.detail
    assert r["mig"].status == "ok" and "MIG disabled" in r["mig"].detail
    assert r["mig"].data["gpus"][0]["current"] == 0
    assert "MIG 1g.18gb" in r["mig"].data["gpus"][0]["profiles"]
    assert r["cpufreq"].status == "n/a" and "not supported here" in r["cpufreq"].detail
    assert r["thp"].status == "ok" and r["thp"].data["enabled"] == "madvise"
    assert r["swap"].status == "ok" and r["swap"].data["areas"] == [] and r["swap"].data["total_kb"] == 0
    assert r["cgroup"].data["version"] == 2
    assert r["config"].status == "ok"
    assert r["spool"].status == "ok" and r["state dir"].status == "ok"
    # no MPS/numactl binaries inside the recorded tree
    assert r["mps"].status == "warn" and r["numactl"].status == "warn"
    assert r["slurm gres"].status == "n/a"                   # scontrol absent here
    assert r["spank"].status == "n/a" and r["spank"].data["slurm"] == "22.05.8"
    assert all(c.duration_s >= 0 for c in r.values())


def test_ci_emulated_has_no_nvml(tmp_path):
    r = by_name(doctor.run_all(ctx_for(CI, tmp_path)))
    assert r["nvml"].status == "n/a" and r["nvml"].data["error"] == "LIBRARY_NOT_FOUND"
    assert r["gpus"].status == "n/a"
    assert r["mig"].status == "n/a"
    assert r["thp"].status == "n/a" and r["swap"].status == "n/a"
    assert r["cgroup"].status == "warn"


def copy_root(src, tmp_path, name="root"):
    dst = tmp_path / name
    shutil.copytree(src, dst, symlinks=True)
    return dst


def test_driver_library_mismatch_fails(tmp_path):
    root = copy_root(H200, tmp_path)
    (root / "nvml.json").write_text(json.dumps({"init": {"error": "Driver/library version mismatch", "code": 18}}))
    checks = doctor.run_all(ctx_for(root, tmp_path))
    r = by_name(checks)
    assert r["nvml"].status == "fail" and "reboot" in r["nvml"].hint
    assert doctor.exit_status(checks) == 1
    # the GPU is still seen through sysfs/procfs
    assert r["gpus"].data["gpus"][0]["pci_bus_id"] == "0000:00:06.0"


def test_library_version_differs_from_driver_warns(tmp_path):
    root = copy_root(H200, tmp_path)
    d = json.loads((root / "nvml.json").read_text())
    d["nvml"] = {"ok": "13.575.51.03"}
    (root / "nvml.json").write_text(json.dumps(d))
    r = doctor.run_check("nvml", doctor.check_nvml, ctx_for(root, tmp_path))
    assert r.status == "warn" and "13.575.51.03 does not match driver 580.159.04" in r.detail


def test_gpu_on_pci_without_driver_fails(tmp_path):
    root = copy_root(H200, tmp_path)
    (root / "nvml.json").unlink()
    r = doctor.run_check("nvml", doctor.check_nvml, ctx_for(root, tmp_path))
    assert r.status == "fail" and r.data["pci"] == ["0000:00:06.0"]


def emulated_node_root(tmp_path, governors="performance powersave schedutil"):
    """What tests/cluster/up builds for gpu01: THP, vm, synthetic cpufreq for 2 CPUs."""
    hr = tmp_path / "hostroot" / "gpu01"
    for c in (0, 1):
        d = hr / f"sys/devices/system/cpu/cpu{c}/cpufreq"
        d.mkdir(parents=True)
        (d / "scaling_governor").write_text("schedutil\n")
        (d / "scaling_available_governors").write_text(governors + "\n")
    (hr / "sys/devices/system/cpu/online").write_text("0-1\n")
    (hr / "sys/kernel/mm/transparent_hugepage").mkdir(parents=True)
    (hr / "sys/kernel/mm/transparent_hugepage/enabled").write_text("always [madvise] never\n")
    (hr / "sys/kernel/mm/transparent_hugepage/defrag").write_text("always defer defer+madvise [madvise] never\n")
    (hr / "proc/sys/vm").mkdir(parents=True)
    (hr / "proc/sys/vm/swappiness").write_text("60\n")
    (hr / "proc/swaps").write_text("Filename\tType\tSize\tUsed\tPriority\n/swapfile  file  2097148  0  -2\n")
    (hr / "proc/meminfo").write_text("MemTotal: 4194304 kB\nSwapTotal: 2097148 kB\n")
    return hr


def test_emulated_cluster_node(tmp_path):
    hr = emulated_node_root(tmp_path)
    dev = tmp_path / "dev" / "gpu01"
    dev.mkdir(parents=True)
    for i in range(4):
        p = dev / f"nvidia{i}"
        if os.geteuid() == 0:
            os.mknod(p, 0o666 | 0o020000, os.makedev(1, 3))   # what tests/cluster/up makes
        else:
            p.write_text("")
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "slurm.conf").write_text("ClusterName=gsrun\n")
    (etc / "gres.conf").write_text(f"NodeName=gpu01 Name=gpu File={dev}/nvidia[0-3]\n"
                                   f"NodeName=gpu02 Name=gpu File={tmp_path}/dev/gpu02/nvidia[0-3]\n")
    run = FakeRun({"scontrol": (0, "NodeName=gpu01 Arch=x86_64 CoresPerSocket=4 Gres=gpu:4 State=IDLE\n"),
                   "slurmctld": (0, "slurm-wlm 22.05.8\n")})
    ctx = ctx_for(hr, tmp_path, run=run, node="gpu01", slurm_conf=str(etc / "slurm.conf"))
    r = by_name(doctor.run_all(ctx))
    assert ["scontrol", "-o", "show", "node", "gpu01"] in run.calls
    g = r["slurm gres"]
    assert g.status == "warn"
    assert g.data["gres_gpus"] == 4 and g.data["visible_gpus"] == 0
    assert g.data["gres_files"] == [f"{dev}/nvidia{i}" for i in range(4)]
    assert len(g.data["not_nvidia_devices"]) == 4 and "emulated" in g.detail
    if os.geteuid() == 0:
        assert "(char 1:3)" in g.detail
    assert r["cpufreq"].status == "ok" and r["cpufreq"].data["available"] == ["performance", "powersave", "schedutil"]
    assert r["cpufreq"].data["current"] == ["schedutil"]
    assert r["swap"].data["areas"] == ["/swapfile"] and "2.0 GiB" in r["swap"].detail
    assert r["thp"].data["defrag"] == "madvise"
    assert r["nvml"].status == "n/a" and r["gpus"].status == "n/a"


def test_cpufreq_without_performance_warns(tmp_path):
    hr = emulated_node_root(tmp_path, governors="powersave")
    r = doctor.run_check("cpufreq", doctor.check_cpufreq, ctx_for(hr, tmp_path))
    assert r.status == "warn" and "performance" in r.hint


def test_slurm_gres_count_mismatch(tmp_path):
    run = FakeRun({"scontrol": (0, "NodeName=n1 Gres=gpu:h200:8(S:0-1) State=IDLE\n")})
    ctx = ctx_for(H200, tmp_path, run=run, node="n1", slurm_conf=str(tmp_path / "none" / "slurm.conf"))
    r = doctor.run_check("slurm gres", doctor.check_slurm_gres, ctx)
    assert r.status == "warn" and "Slurm has 8, NVML sees 1" in r.detail


def test_parse_gres_conf():
    text = ("# comment\nName=gpu File=/dev/nvidia[0-1]\nNodeName=a[1-2] Name=gpu File=/dev/nvidia[2,4-5]\n"
            "NodeName=b1 Name=gpu File=/dev/nvidia7\nName=mps Count=100\n")
    assert doctor.parse_gres_conf(text, "a2") == ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidia4",
                                                  "/dev/nvidia5"]
    assert doctor.parse_gres_conf(text, "b1") == ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia7"]
    # Slurm's hostlist rules: a comma list, zero padding kept; a bad range is kept as written (the check reports it)
    assert doctor.parse_gres_conf("Name=gpu File=/dev/nvidia0,/dev/nvidia[01-02]\n", None) == \
        ["/dev/nvidia0", "/dev/nvidia01", "/dev/nvidia02"]
    assert doctor.parse_gres_conf("Name=gpu File=/dev/nvidia[3-1]\n", None) == ["/dev/nvidia[3-1]"]


def test_binaries_inside_a_fake_root(tmp_path):
    root = copy_root(CI, tmp_path)
    (root / "usr" / "bin").mkdir(parents=True)
    for name in ("numactl", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server"):
        p = root / "usr" / "bin" / name
        p.write_text("#!/bin/sh\n")
        p.chmod(0o755)
    ctx = ctx_for(root, tmp_path)
    assert doctor.run_check("numactl", doctor.check_numactl, ctx).detail == "/usr/bin/numactl"
    mps = doctor.run_check("mps", doctor.check_mps, ctx)
    assert mps.status == "ok" and mps.data["server"] == "/usr/bin/nvidia-cuda-mps-server"
    ctx2 = ctx_for(root, tmp_path, config_text="[mps]\nenabled = false\n")
    assert doctor.run_check("mps", doctor.check_mps, ctx2).status == "n/a"


def spank_setup(tmp_path, built_for):
    lib = tmp_path / "lib"
    lib.mkdir()
    so = lib / "gsrun_spank.so"
    so.write_bytes(b"\x7fELF")
    (lib / "gsrun_spank.json").write_text(json.dumps({"slurm_version": built_for, "python_version": "3.11.2"}))
    etc = tmp_path / "etc"
    (etc / "plugstack.conf.d").mkdir(parents=True)
    (etc / "slurm.conf").write_text("ClusterName=x\n")
    (etc / "plugstack.conf").write_text(f"include {etc}/plugstack.conf.d/*.conf\n")
    (etc / "plugstack.conf.d" / "gsrun.conf").write_text(f"# BEGIN gsrun\nrequired {so} bind=auto\n")
    return str(etc / "slurm.conf"), str(so)


@pytest.mark.parametrize("running,status", [("22.05.8", "ok"), ("22.05.11", "ok"), ("24.11.1", "fail")])
def test_spank_version(tmp_path, running, status):
    conf, so = spank_setup(tmp_path, "22.05.8")
    ctx = ctx_for(CI, tmp_path, run=FakeRun({"slurmd": (0, f"slurm {running}\n")}), slurm_conf=conf)
    assert doctor.find_spank_so(ctx) == so
    r = doctor.run_check("spank", doctor.check_spank, ctx)
    assert r.status == status
    assert r.data["built_for"] == "22.05.8" and r.data["slurm"] == running
    if status == "fail":
        assert "rebuild" in r.hint


def test_spank_named_but_missing_fails(tmp_path):
    conf, so = spank_setup(tmp_path, "22.05.8")
    os.unlink(so)
    r = doctor.run_check("spank", doctor.check_spank, ctx_for(CI, tmp_path, slurm_conf=conf))
    assert r.status == "fail" and "does not exist" in r.detail


def test_mail_reachability(tmp_path):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    try:
        ctx = ctx_for(CI, tmp_path, config_text=f'[mail]\nsmtp_host = "127.0.0.1"\nsmtp_port = {port}\n')
        r = doctor.run_check("mail", doctor.check_mail, ctx)
        assert r.status == "ok" and f"127.0.0.1:{port}" in r.detail
    finally:
        srv.close()
    r = doctor.run_check("mail", doctor.check_mail,
                         ctx_for(CI, tmp_path, config_text=f'[mail]\nsmtp_host = "127.0.0.1"\nsmtp_port = {port}\n'))
    assert r.status == "warn" and "not reachable" in r.detail
    r = doctor.run_check("mail", doctor.check_mail,
                         ctx_for(CI, tmp_path, config_text='[mail]\nmailprog = "/nonexistent/sendmail"\n'))
    assert r.status == "fail"
    r = doctor.run_check("mail", doctor.check_mail, ctx_for(CI, tmp_path, config_text='[mail]\npolicy = "never"\n'))
    assert r.status == "n/a"


def test_bad_config_fails_and_names_the_key(tmp_path):
    r = doctor.run_check("config", doctor.check_config, ctx_for(CI, tmp_path, config_text="[sampler]\ninterval_s = 0\n"))
    assert r.status == "fail" and "sampler.interval_s" in r.detail


def test_spool_and_state(tmp_path):
    ctx = ctx_for(CI, tmp_path)
    shutil.rmtree(tmp_path / "spool")
    r = doctor.run_check("spool", doctor.check_spool, ctx)
    assert r.status == "fail" and "gsrun-node install" in r.hint
    (tmp_path / "spool").mkdir()
    r = doctor.run_check("spool", doctor.check_spool, ctx)
    assert r.status in ("ok", "warn") and r.data["free_bytes"] > 0
    r = doctor.run_check("state dir", doctor.check_state, ctx)
    if os.geteuid() == 0:
        assert r.status == "ok" and "writable" in r.detail
        assert os.listdir(tmp_path / "state") == []      # the probe file is gone
    else:
        assert r.status == "fail"                        # not owned by root


def test_a_hanging_check_times_out_and_others_run(tmp_path):
    def hang(ctx):
        time.sleep(30)

    t0 = time.monotonic()
    r = doctor.run_check("slow", hang, ctx_for(CI, tmp_path), timeout_s=0.2)
    assert time.monotonic() - t0 < 2
    assert r.status == "fail" and "timed out after 0.2 s" in r.detail

    def boom(ctx):
        raise ValueError("bad\nfile")

    r = doctor.run_check("boom", boom, ctx_for(CI, tmp_path))
    assert r.status == "fail" and r.detail == "check failed: bad"


def test_every_check_has_a_timeout_and_name():
    names = [n for n, _ in doctor.CHECKS]
    assert len(names) == len(set(names)) >= 15
    for n in names:
        assert doctor.TIMEOUTS_S.get(n, doctor.DEFAULT_TIMEOUT_S) <= 30


def test_table_json_and_exit_status(tmp_path):
    checks = [doctor.Check("a", "ok", "fine"), doctor.Check("b", "warn", "meh", "do x"),
              doctor.Check("c", "n/a", "none", "ignored")]
    t = doctor.render_table(checks)
    assert "hint: do x" in t and "ignored" in t and "1 ok, 1 warn, 0 fail, 1 n/a" in t
    assert doctor.exit_status(checks) == 0
    assert doctor.exit_status(checks + [doctor.Check("d", "fail", "x")]) == 1
    j = json.loads(doctor.to_json(checks, ctx_for(CI, tmp_path)))
    assert j["schema"] == "gsrun.doctor/1" and j["counts"]["warn"] == 1
    assert j["checks"][1] == {"name": "b", "status": "warn", "detail": "meh", "hint": "do x", "data": {},
                              "duration_s": 0.0}


def test_cli_json(tmp_path):
    cfg = tmp_path / "g.toml"
    cfg.write_text("")
    res = CliRunner().invoke(cli, ["doctor", "--host-root", str(H200), "--json", "--config", str(cfg),
                                   "--check", "nvml", "--check", "gpus", "--check", "thp"],
                             standalone_mode=False)
    assert res.exception is None, res.output
    j = json.loads(res.output)
    assert [c["name"] for c in j["checks"]] == ["nvml", "gpus", "thp"]
    assert j["checks"][1]["data"]["gpus"][0]["numa_source"]
    assert res.return_value == 0


def test_install_readable_by_users(tmp_path):
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="gsrun-doctor-"))   # pytest's tmp_path is 0700 itself
    base.chmod(0o755)
    try:
        _install_readable(base, tmp_path)
    finally:
        shutil.rmtree(base)


def _install_readable(base, tmp_path):
    home = base / "root"
    (home / "bin").mkdir(parents=True)
    py = home / "bin" / "python3"
    py.write_text("#!/bin/sh\n")
    py.chmod(0o755)
    link = base / "venv-python"
    link.symlink_to(py)
    assert doctor.world_usable(str(link)) is None
    home.chmod(0o700)                         # like /root with root's pyenv in it
    try:
        assert doctor.world_usable(str(link)) == str(home)
        ctx = ctx_for(CI, tmp_path)
        ctx.environ["GSRUN_DOCTOR_PYTHON"] = str(link)
        r = doctor.run_check("install", doctor.check_install, ctx)
        assert r.status == "fail" and "/usr/bin/python3 -m venv" in r.hint
    finally:
        home.chmod(0o755)


def test_log_check_warns_when_the_hooks_log_lines_would_be_lost(tmp_path):
    """No syslog daemon (no /dev/log socket under the host root) and no GSRUN_LOG_FILE in
    the hooks: warn; a Prolog= script that sets one (install --log-file): ok, named."""
    from gsrun.admin import doctor
    from gsrun.facts.hostfs import HostFS

    (tmp_path / "host").mkdir()
    hook = tmp_path / "gsrun-prolog"
    hook.write_text("#!/bin/sh\nexec /opt/gsrun/venv/bin/gsrun-node prolog\n")
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"Prolog={hook}\n")
    ctx = doctor.Context(HostFS(str(tmp_path / "host")), slurm_conf=str(conf))
    got = doctor.check_log(ctx)
    assert got.status == "warn" and "their log lines are lost" in got.detail and "--log-file" in got.hint
    hook.write_text("#!/bin/sh\nGSRUN_LOG_FILE=/var/log/gsrun.log exec /opt/gsrun/venv/bin/gsrun-node prolog\n")
    got = doctor.check_log(ctx)
    assert (got.status, got.detail) == ("ok", "the hooks log to /var/log/gsrun.log"), got
