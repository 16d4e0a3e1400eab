"""The prolog killed by SIGKILL at every write boundary (sysfs writes and
journal writes), in a real child process; then the epilog or ``restore
--all`` must return the fake host tree to its baseline byte for byte."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

from gsrun.node import tuning
from gsrun.facts.hostfs import HostFS
from helpers.tuning_tree import REPO, diff, make_tree, snapshot

REQ = "governor=performance,swappiness=10,swap=off,dirty_ratio=40,dirty_background_ratio=5,thp=never,zone_reclaim_mode=1"

CHILD = textwrap.dedent("""
    import json, os, signal, sys
    from gsrun.node import tuning
    from gsrun.facts.hostfs import HostFS
    root, state, kill_at, req = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    events = []

    def boundary(what):
        if len(events) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        events.append(what)

    class H(HostFS):
        def write(self, rel, value):
            boundary("write " + rel)
            super().write(rel, value)

    real_write_json = tuning._write_json
    def write_json(path, obj, *args):
        boundary("journal " + os.path.basename(str(path)))
        real_write_json(path, obj, *args)
    tuning._write_json = write_json
    tuning.prolog_tune(H(root), state, "4242", req, None, None, exclusive=True, log=lambda m: None)
    print(json.dumps(events))
""")


def run_child(root, state, kill_at):
    return subprocess.run([sys.executable, "-P", "-c", CHILD, str(REPO), str(root), str(state), str(kill_at), REQ],
                          capture_output=True, text=True, timeout=60)


def test_sigkill_at_every_write_boundary(tmp_path):
    full = run_child(make_tree(tmp_path / "full"), tmp_path / "fs", -1)
    assert full.returncode == 0, full.stderr
    events = json.loads(full.stdout)
    writes = [e for e in events if e.startswith("write ")]
    journals = [e for e in events if e.startswith("journal ")]
    assert len(writes) >= 10 and len(journals) >= 9, events
    for n in range(len(events)):
        root = make_tree(tmp_path / f"h{n}")
        state = tmp_path / f"s{n}"
        base = snapshot(root)
        r = run_child(root, state, n)
        assert r.returncode == -signal.SIGKILL, (n, events[n], r.stderr)
        if n % 2 == 0:   # alternate the two ways back (both run at every boundary in test_tuning.py)
            out = tuning.epilog_restore(HostFS(root), str(state), "4242", log=lambda m: None)
        else:
            out = tuning.restore(HostFS(root), str(state), all_jobs=True, log=lambda m: None)
        assert out["ok"], (n, events[n], out)
        assert diff(base, snapshot(root)) == [], f"killed before {events[n]} (event {n})"
        assert tuning.status(HostFS(root), str(state))["changes"] == []


# cstate, irq and hugepages: the same kill at every sysfs/procfs and journal write
REQ_HOST = "swappiness=10,cstate=c1,irq=local,hugepages=2M:64"
CHILD_HOST = CHILD.replace(
    'tuning.prolog_tune(H(root), state, "4242", req, None, None, exclusive=True, log=lambda m: None)',
    'scope = tuning.JobScope([{"bdf": "0000:00:06.0", "kind": "gpu", "name": "0", "numa_node": None}],\n'
    '                        list(range(2, 6)), {0: list(range(16))}, "test")\n'
    'tuning.prolog_tune(H(root), state, "4242", req, None, None, exclusive=True, log=lambda m: None, scope=scope)')


def test_sigkill_at_every_write_boundary_host_settings(tmp_path):
    from helpers.tuning_tree import add_host_tuning

    def child(root, state, kill_at):
        return subprocess.run([sys.executable, "-P", "-c", CHILD_HOST, str(REPO), str(root), str(state),
                               str(kill_at), REQ_HOST], capture_output=True, text=True, timeout=60)

    def tree(name):
        return add_host_tuning(make_tree(tmp_path / name, swap=False), cpus=4)

    full = child(tree("full"), tmp_path / "fs", -1)
    assert full.returncode == 0, full.stderr
    events = json.loads(full.stdout)
    writes = [e for e in events if e.startswith("write ")]
    assert any("cpuidle" in w for w in writes) and any("proc/irq/" in w for w in writes) \
        and any("nr_hugepages" in w for w in writes), events
    for n in range(len(events)):
        root = tree(f"h{n}")
        state = tmp_path / f"s{n}"
        base = snapshot(root)
        r = child(root, state, n)
        assert r.returncode == -signal.SIGKILL, (n, events[n], r.stderr)
        if n % 2 == 0:
            out = tuning.epilog_restore(HostFS(root), str(state), "4242", log=lambda m: None)
        else:
            out = tuning.restore(HostFS(root), str(state), all_jobs=True, log=lambda m: None)
        assert out["ok"], (n, events[n], out)
        assert diff(base, snapshot(root)) == [], f"killed before {events[n]} (event {n})"


def test_plain_job_killed_beside_a_tuned_one(tmp_path):
    """A job that asks nothing writes one journal (its registration, final state): killed
    before it, it does not count; after it, it holds the tuned job's settings on the node
    until its own epilog -- and either way the node ends at its baseline."""
    child = CHILD.replace('"4242", req,', '"4243", req,')
    assert child != CHILD
    for kill_at in (0, -1):
        root = make_tree(tmp_path / f"p{kill_at}")
        state = tmp_path / f"ps{kill_at}"
        base = snapshot(root)
        tuning.prolog_tune(HostFS(root), str(state), "4242", "swappiness=10,thp=never", None, None,
                           exclusive=True, log=lambda m: None)
        r = subprocess.run([sys.executable, "-P", "-c", child, str(REPO), str(root), str(state), str(kill_at), ""],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == (-signal.SIGKILL if kill_at == 0 else 0), r.stderr
        registered = (state / "tuning" / "jobs" / "4243.json").exists()
        assert registered == (kill_at == -1)
        out = tuning.epilog_restore(HostFS(root), str(state), "4242", log=lambda m: None)
        if registered:
            assert not out["last_job"] and diff(base, snapshot(root)) != []    # kept for 4243
            out = tuning.epilog_restore(HostFS(root), str(state), "4243", log=lambda m: None)
        assert out["last_job"] and out["ok"], out
        assert diff(base, snapshot(root)) == []
