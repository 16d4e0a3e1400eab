"""Golden ``gsrun-node doctor`` tables (text and ``--json``) on recorded hosts.

Runs the real command (``gsrun-node doctor --host-root tests/data/hosts/<host>
--config <empty file> --state-dir <missing dir> --spool-dir <dir> --node
<name>``, click in-process) and compares with
``tests/data/golden/doctor/<host>.txt`` / ``<host>.json``. The host's
sysfs/procfs/NVML facts come from the recording; what doctor would otherwise
read from *this* machine is fixed by the test:

- Slurm commands: the doctor's ``Context`` gets a fake ``run`` (``scontrol -o
  show node`` answers ``Gres=gpu:<n>`` for the recorded GPU count,
  ``slurmctld -V`` answers ``slurm-wlm 23.11.4``) and ``environ={"PATH": ""}``;
  ``SLURM_CONF`` names a missing file (no gres.conf, no plugstack.conf);
- spool free space: ``shutil.disk_usage`` answers 1 TiB total, 600 GiB free;
- SMTP: ``socket.create_connection`` is refused (as on a node without a relay);
- the install check's file modes: ``doctor.world_usable`` says every user can
  run the interpreter (this machine's venv may sit under a 0700 ``/root``).

Normalised in the output (placeholders): ``<PYTHON>`` ``sys.executable``,
``<PYTHON-REAL>`` its real path, ``<PACKAGE>`` the installed ``gsrun``
package directory, ``<REPO>`` this checkout, ``<TMP>`` the test's temporary
directory; in the JSON also ``"host"`` (``<HOST>``), ``"time"`` (0) and every
``"duration_s"`` (0.0). Regenerate with ``GSRUN_REGEN_GOLDEN=1``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections import namedtuple

import pytest
from click.testing import CliRunner

import gsrun
from gsrun.admin import doctor
from gsrun.admin.node import cli
from helpers.golden import check_text
from helpers.paths import DATA, REPO

GOLDEN = DATA / "golden" / "doctor"
HOSTS = {"h200-vm": 1, "server-2s8g": 8, "ci-emulated": 0}      # host -> GPUs in Slurm's Gres
DiskUsage = namedtuple("DiskUsage", "total used free")


class FakeRun:
    """subprocess.run for doctor's Slurm commands; anything else is 'not installed'."""

    def __init__(self, gpus: int):
        gres = f"gpu:h200:{gpus}" if gpus else "(null)"
        self.answers = {
            "scontrol": (0, f"NodeName=gpu-golden Arch=x86_64 CoresPerSocket=32 CPUAlloc=0 CPUTot=64 "
                            f"Gres={gres} NodeAddr=gpu-golden State=IDLE Partitions=gpu\n"),
            "slurmctld": (0, "slurm-wlm 23.11.4\n")}

    def __call__(self, argv, **kw):
        assert kw.get("timeout", 0) > 0
        a = self.answers.get(argv[0])
        if a is None:
            raise FileNotFoundError(argv[0])
        return subprocess.CompletedProcess(argv, a[0], a[1], "")


def _refused(*_a, **_k):
    raise ConnectionRefusedError(111, "Connection refused")


def run_doctor(host: str, tmp_path, monkeypatch, as_json: bool) -> tuple[int, str]:
    cfg = tmp_path / "gsrun.toml"
    cfg.write_text("")
    (tmp_path / "spool").mkdir(exist_ok=True)
    monkeypatch.setattr(doctor, "Context", functools.partial(doctor.Context, run=FakeRun(HOSTS[host]),
                                                             environ={"PATH": ""}))
    monkeypatch.setattr(shutil, "disk_usage", lambda p: DiskUsage(1 << 40, 424 << 30, 600 << 30))
    monkeypatch.setattr(socket, "create_connection", _refused)
    monkeypatch.setattr(doctor, "world_usable", lambda path: None)
    for k in [k for k in os.environ if k.startswith(("GSRUN_", "SLURM"))]:
        monkeypatch.delenv(k)
    args = ["doctor", "--host-root", str(DATA / "hosts" / host), "--config", str(cfg),
            "--state-dir", str(tmp_path / "state"), "--spool-dir", str(tmp_path / "spool"), "--node", "gpu-golden"]
    res = CliRunner().invoke(cli, args + (["--json"] if as_json else []), standalone_mode=False,
                             env={"SLURM_CONF": str(tmp_path / "slurm" / "slurm.conf")})
    assert res.exception is None, (res.output, res.exception)
    return res.return_value, normalise(res.stdout, tmp_path)


def normalise(text: str, tmp_path) -> str:
    pkg = os.path.dirname(gsrun.__file__)
    for real, placeholder in sorted({sys.executable: "<PYTHON>", os.path.realpath(sys.executable): "<PYTHON-REAL>",
                                     pkg: "<PACKAGE>", str(REPO): "<REPO>", str(tmp_path): "<TMP>"}.items(),
                                    key=lambda kv: -len(kv[0])):
        text = re.sub(rf"{re.escape(real)}(?![A-Za-z0-9_.-])", placeholder, text)
    text = re.sub(r'"host": "[^"]*"', '"host": "<HOST>"', text)
    text = re.sub(r'"time": \d+', '"time": 0', text)
    return re.sub(r'"duration_s": [0-9.e-]+', '"duration_s": 0.0', text)


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("host", sorted(HOSTS))
def test_golden_doctor(host, as_json, tmp_path, monkeypatch):
    rc, got = run_doctor(host, tmp_path, monkeypatch, as_json)
    ext = "json" if as_json else "txt"
    check_text(GOLDEN / f"{host}.{ext}", got, f"gsrun-node doctor --host-root {host}{' --json' if as_json else ''}")
    fails = json.loads(got)["counts"]["fail"] if as_json else int(re.search(r"(\d+) fail,", got).group(1))
    assert rc == (1 if fails else 0)
