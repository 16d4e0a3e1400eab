"""``gsrun-node``'s entry point: the Slurm hooks start without click.

slurmd runs ``gsrun-node prolog`` / ``gsrun-node epilog`` for every job on
every node, so their start-up is paid per job (issue 24: a hook's wall is
measured against ``python3 -c pass``). ``gsrun-node prolog|epilog`` with
only the options below is dispatched here straight to the hook; everything
else (``--help``, every other subcommand, any other option) goes to the
click CLI of :mod:`gsrun.wrapper.node`, which accepts the same hook options
and behaves the same.

Hook options (as in :mod:`gsrun.wrapper.node`): ``--host-root DIR``,
``--state-dir DIR``, ``--spool-dir DIR`` (also ``--opt=DIR``; defaults from
``GSRUN_HOST_ROOT``, ``GSRUN_STATE_DIR``, ``GSRUN_SPOOL_DIR``) and, for the
prolog, ``--dry-run``.
"""

from __future__ import annotations

import os
import sys

HOOKS = ("prolog", "epilog")
_DIRS = {"--host-root": "GSRUN_HOST_ROOT", "--state-dir": "GSRUN_STATE_DIR", "--spool-dir": "GSRUN_SPOOL_DIR"}


def parse_hook_args(argv: list[str]) -> dict | None:
    """``["prolog", "--state-dir", "/x"]`` -> ``{"phase": "prolog", "host_root":
    ..., "state_dir": "/x", "spool_dir": ..., "dry_run": False}``; None when
    ``argv`` is anything this fast path does not take (click handles it). Pure
    except for the environment defaults."""
    if not argv or argv[0] not in HOOKS:
        return None
    out = {"phase": argv[0], "dry_run": False}
    given: dict[str, str] = {}
    i = 1
    while i < len(argv):
        a = argv[i]
        name, eq, val = a.partition("=")
        if name in _DIRS:
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
    for opt, env in _DIRS.items():
        out[opt[2:].replace("-", "_")] = given.get(opt, os.environ.get(env) or None)
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    a = parse_hook_args(argv)
    if a is None:
        from gsrun.wrapper.node import main as click_main

        click_main(argv)
        return
    from gsrun.base.errors import GsrunError

    try:
        if a["phase"] == "prolog":
            from gsrun.prolog.main import run

            rc = run(os.environ, a["host_root"], a["state_dir"], a["spool_dir"], dry_run=a["dry_run"])
        else:
            # the job's sampler runs the steps when it listens (gsrun.epilog.handoff): then
            # this process imports nothing else
            from gsrun.epilog.handoff import try_handoff

            rc, why = try_handoff(os.environ, a["host_root"], a["state_dir"], a["spool_dir"])
            if rc is None:
                from gsrun.epilog.main import run_here

                rc = run_here(os.environ, a["host_root"], a["state_dir"], a["spool_dir"], note=why)
    except GsrunError as e:
        print(str(e), file=sys.stderr)
        sys.exit(2)
    except Exception as e:  # noqa: BLE001 - a hook must never die with a traceback
        import traceback

        print(f"gsrun: {a['phase']}: internal error: {e!r}", file=sys.stderr)
        traceback.print_exc(file=sys.stderr)
        sys.exit(0)     # a bug of ours must not drain the node
    sys.exit(rc or 0)


if __name__ == "__main__":
    main()
