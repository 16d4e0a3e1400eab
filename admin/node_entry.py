"""``gsrun-node``'s entry point: ``prolog|epilog|epilog-ctld`` with only the
hook options (:func:`parse_hook_args`) go straight to the hook, without click;
anything else to the click CLI of :mod:`gsrun.admin.node`, which behaves the same.

The hooks start the interpreter ``-I -S`` (:func:`hook_argv`): isolated and
without ``site`` (no ``.pth`` files: ~3 ms per hook, ~9 ms with an editable
finder); :data:`HOOK_BOOTSTRAP` puts gsrun's ``site-packages`` after the
standard library, as ``site`` would.
"""

from __future__ import annotations

import os
import shlex
import sys

import gsrun

HOOKS = ("prolog", "epilog", "epilog-ctld")
# ``python3 -I -S -c HOOK_BOOTSTRAP <site-packages> <command>``, run by the daemon (server.hook_args)
HOOK_BOOTSTRAP = "import sys; sys.path.append(sys.argv.pop(1)); from gsrun.admin.node_entry import main; main()"


def hook_argv(command: str, python: str | None = None) -> list[str] | None:
    """``[python, "-I", "-S", "-c", HOOK_BOOTSTRAP, site_dir, command]``; None
    unless gsrun is a regular install in a venv (the hook then runs ``gsrun-node``)."""
    site_dir = os.path.dirname(os.path.dirname(os.path.abspath(gsrun.__file__)))
    prefix = os.path.abspath(sys.prefix)
    if not (os.path.isfile(os.path.join(site_dir, "gsrun", "prolog", "main.py"))
            and os.path.isfile(os.path.join(site_dir, "gsrun", "admin", "node_entry.py"))
            and os.path.isfile(os.path.join(prefix, "pyvenv.cfg"))
            and site_dir.startswith(prefix + os.sep)):
        return None
    return [python or sys.executable, "-I", "-S", "-c", HOOK_BOOTSTRAP, site_dir, command]
_DIRS = {"--host-root": "GSRUN_HOST_ROOT", "--state-dir": "GSRUN_STATE_DIR", "--spool-dir": "GSRUN_SPOOL_DIR"}


def parse_hook_args(argv: list[str], environ=None) -> dict | None:
    """``["prolog", "--state-dir", "/x"]`` -> ``{"phase": "prolog", "host_root":
    ..., "state_dir": "/x", "spool_dir": ..., "dry_run": False}``; None when
    ``argv`` is anything this fast path does not take (click handles it). Pure
    except for the environment defaults (``environ``, default :data:`os.environ`)."""
    if not argv or argv[0] not in HOOKS:
        return None
    out = {"phase": argv[0], "dry_run": False}
    allowed = ("--spool-dir",) if argv[0] == "epilog-ctld" else tuple(_DIRS)
    given: dict[str, str] = {}
    i = 1
    while i < len(argv):
        a = argv[i]
        name, eq, val = a.partition("=")
        if name in allowed:
            if not eq:
                if i + 1 >= len(argv):
                    return None
                i += 1
                val = argv[i]
            if name in given or not val:
                return None
            given[name] = val
        elif a == "--dry-run" and argv[0] == "prolog" and not out["dry_run"]:
            out["dry_run"] = True
        else:
            return None
        i += 1
    for opt in allowed:
        out[opt[2:].replace("-", "_")] = given.get(opt, (os.environ if environ is None else environ).get(
            _DIRS[opt]) or None)
    return out


def hook_command(command: str, gsrun_node: str) -> str:
    """The shell words a hook ``exec``s: :func:`hook_argv`, else ``gsrun_node command``
    (an editable install). ``python -m gsrun.admin.node_entry --hook-command CMD GSRUN_NODE``
    prints it for scripts that write hooks (tests/cluster/up, tests/gpu/cluster/up)."""
    return shlex.join(hook_argv(command) or [gsrun_node, command])


def _site_when_needed() -> None:
    """Started ``-S``: run ``site`` after all for a ``--system-site-packages``
    venv, or ``site.addsitedir`` when the site directory has path-adding
    ``.pth`` files (tests/gpu/install-venv; not setuptools' distutils one)."""
    if not sys.flags.no_site:
        return
    try:
        # next to the venv's bin/ (sys.prefix is the base interpreter's until site runs)
        with open(os.path.join(os.path.dirname(os.path.dirname(sys.executable)), "pyvenv.cfg"),
                  encoding="utf-8", errors="replace") as f:
            cfg = f.read(65536)
    except OSError:
        cfg = ""
    for line in cfg.splitlines():
        key, eq, val = line.partition("=")
        if eq and key.strip().lower() == "include-system-site-packages" and val.strip().lower() == "true":
            import site

            site.main()
            return
    # gsrun's site directory: <site>/gsrun/admin/node_entry.py (hooks written by older releases
    # put it first on sys.path, the current bootstrap last)
    site_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        pth = [n for n in os.listdir(site_dir) if n.endswith(".pth") and n != "distutils-precedence.pth"]
    except OSError:
        return
    if pth:
        import site

        site.addsitedir(site_dir)


def main(argv: list[str] | None = None) -> None:
    _site_when_needed()
    # after the site directory is set up: gsrun's dependencies (click) may be reachable only from there
    from gsrun.base.errors import exit_now

    argv = sys.argv[1:] if argv is None else list(argv)
    a = parse_hook_args(argv)
    if a is None:
        from gsrun.admin.node import main as click_main

        click_main(argv)
        return
    exit_now(run_hook(a))   # no interpreter teardown: 1.5-2 ms of every hook (every file is closed by now)


def run_hook(a: dict, answer=None) -> int:
    """Run the hook :func:`parse_hook_args` gave -> its exit status: 2 for a ``GsrunError``
    (printed), 0 for a bug of ours (printed with its traceback: it must not drain the node).
    ``answer(status)``: the node daemon's, for an epilog that answers before its report."""
    from gsrun.base.errors import GsrunError

    try:
        if a["phase"] == "prolog":
            from gsrun.prolog.main import run

            return run(os.environ, a["host_root"], a["state_dir"], a["spool_dir"], dry_run=a["dry_run"]) or 0
        if a["phase"] == "epilog-ctld":
            from gsrun.epilog.ctld_start import detach

            return detach(os.environ, a["spool_dir"]) or 0
        from gsrun.epilog.main import run

        return run(os.environ, a["host_root"], a["state_dir"], a["spool_dir"], answer=answer) or 0
    except GsrunError as e:
        print(str(e), file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - a hook must never die with a traceback
        import traceback

        print(f"gsrun: {a['phase']}: internal error: {e!r}", file=sys.stderr)
        traceback.print_exc(file=sys.stderr)
        return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--hook-command"] and len(sys.argv) == 4:
        print(hook_command(sys.argv[2], sys.argv[3]))
    else:
        main()
