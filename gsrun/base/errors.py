"""Errors with the message shape every gsrun tool prints.

``gsrun: <phase>: <what>: <detail>`` and, when the user can fix it, a second
line ``hint: <hint>``. Library code raises; only the CLI entry points turn an
error into an exit status.
"""

from __future__ import annotations

import os
import sys
from contextlib import suppress

import click


class GsrunError(Exception):
    """Base class. Raised with the phase (``bind``, ``prolog``, ``submit`` ...),
    the thing that failed, the detail and an optional hint."""

    def __init__(self, phase: str, what: str, detail: str, hint: str | None = None):
        self.phase = phase
        self.what = what
        self.detail = detail
        self.hint = hint
        super().__init__(str(self))

    def __str__(self) -> str:
        msg = f"gsrun: {self.phase}: {self.what}: {self.detail}"
        if self.hint:
            msg += f"\nhint: {self.hint}"
        return msg


class InputError(GsrunError):
    """A user- or admin-supplied value (flag, env var, job option, config key)
    failed validation. Likely cause: a typo or a value outside the allow-list."""


class ConfigError(InputError):
    """The site config (``/etc/gsrun/gsrun.toml`` or ``$GSRUN_CONFIG``) has an
    unknown key or a bad value."""


class SlurmError(GsrunError):
    """A Slurm command failed, timed out or printed something unparsable.
    Likely causes: slurmctld unreachable, wrong ``SLURM_CONF``, job id unknown."""


class TopologyError(GsrunError):
    """The host's GPUs/NUMA layout could not be read or a requested GPU does
    not exist on this node. Likely causes: a wrong ``--host-root``, a GPU
    token that matches no device, a driver that is not loaded."""


class NodeError(GsrunError):
    """A node-side change (tuning, MPS, MIG) could not be made or undone."""


def run_cli(command, prog_name: str, argv=None, *, fast_exit: bool = False) -> None:
    """Run a click ``command`` as a console script: a :class:`GsrunError`
    exits 2 with its message, Ctrl-C 130, else the command's return value;
    ``fast_exit``: end by :func:`exit_now` (a command leaving no thread or open file)."""
    try:
        rc = command.main(args=argv, prog_name=prog_name, standalone_mode=False)
    except GsrunError as e:
        click.echo(str(e), err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    if fast_exit:
        exit_now(rc or 0)
    sys.exit(rc or 0)


def flush_std() -> None:
    """Flush stdout and stderr; one closed or absent (started with that fd closed: cron, ``>&-``) is skipped."""
    for f in (sys.stdout, sys.stderr):
        with suppress(OSError, ValueError, AttributeError):
            f.flush()


def exit_now(rc: int) -> None:
    """End a finished process without the interpreter's teardown (1.5-2 ms of
    every hook, ~3.5 ms of every ``gsrun``): :func:`flush_std`, no ``atexit``
    handlers (gsrun registers none), the rest left to the kernel."""
    flush_std()
    os._exit(rc)
