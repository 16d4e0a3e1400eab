"""gsrun's irqbalance policy script (``templates/irqbalance-policy.sh``) run by
``/bin/sh`` as irqbalance runs it (``popen("SCRIPT <device dir> <irq>")``): ``ban=true``
for NVIDIA GPU IRQs and IRQs listed in the ban directory, nothing otherwise, exit 0 always."""

from __future__ import annotations

import subprocess
from importlib import resources

import pytest

from helpers.paths import REPO

pytestmark = pytest.mark.process
SCRIPT = REPO / "templates" / "irqbalance-policy.sh"


def device(tmp_path, name, vendor, cls):
    d = tmp_path / "sys" / name
    d.mkdir(parents=True)
    (d / "vendor").write_text(vendor + "\n")
    (d / "class").write_text(cls + "\n")
    return str(d)


def policy(tmp_path, dev, irq):
    cmd = f"{SCRIPT} {dev} {irq}"      # as irqbalance builds it (classify.c: snprintf + popen)
    p = subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, text=True, timeout=30,
                       env={"PATH": "/usr/bin:/bin", "GSRUN_IRQ_BAN_DIR": str(tmp_path / "ban")})
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""
    return p.stdout


def test_nvidia_gpu_irqs_are_banned_others_left_to_irqbalance(tmp_path):
    h200 = device(tmp_path, "0000:00:06.0", "0x10de", "0x030200")
    vga = device(tmp_path, "0000:01:00.0", "0x10de", "0x030000")
    nvswitch = device(tmp_path, "0000:02:00.0", "0x10de", "0x068000")
    nic = device(tmp_path, "0000:03:00.0", "0x15b3", "0x020000")
    assert policy(tmp_path, h200, 42) == "ban=true\n"
    assert policy(tmp_path, vga, 43) == "ban=true\n"
    assert policy(tmp_path, nvswitch, 44) == ""
    assert policy(tmp_path, nic, 45) == ""
    assert policy(tmp_path, str(tmp_path / "sys" / "absent"), 46) == ""


def test_irqs_listed_in_the_ban_dir(tmp_path):
    nic = device(tmp_path, "0000:03:00.0", "0x15b3", "0x020000")
    (tmp_path / "ban").mkdir()
    (tmp_path / "ban" / "45").write_text("")
    assert policy(tmp_path, nic, 45) == "ban=true\n"
    assert policy(tmp_path, nic, 46) == ""


def test_unexpected_arguments_leave_the_irq_alone(tmp_path):
    h200 = device(tmp_path, "0000:00:06.0", "0x10de", "0x030200")
    (tmp_path / "ban").mkdir()
    (tmp_path / "ban" / "x").write_text("")
    for irq in ("x", "", "4a", "..", "-1"):
        p = subprocess.run(["/bin/sh", str(SCRIPT), h200, irq], capture_output=True, text=True, timeout=30,
                           env={"PATH": "/usr/bin:/bin", "GSRUN_IRQ_BAN_DIR": str(tmp_path / "ban")})
        assert (p.returncode, p.stdout, p.stderr) == (0, "", ""), irq


def test_shipped_with_the_package_and_executable():
    f = resources.files("gsrun.templates") / "irqbalance-policy.sh"
    assert f.read_text() == SCRIPT.read_text()
    assert SCRIPT.stat().st_mode & 0o111
