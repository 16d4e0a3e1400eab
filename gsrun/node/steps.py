"""The one step runner of the Slurm hooks (prolog, epilog, EpilogSlurmctld).

:func:`run_steps` runs a hook's table of :class:`Step` rows in order and owns:

- the budget: a ``SIGALRM`` deadline per step, the hook's budget less the
  ``reserve_s`` of every later row (at least :data:`MIN_STEP_S`);
- the log lines ``<step>: begin`` / ``end (<s> s)`` / ``failed after <s> s: <error>``;
- the drain decision (:attr:`Outcome.rc`): :data:`SETUP` (prolog) exits 1
  only on :class:`NodeUnusable`; :data:`CLEANUP` (epilog) runs every step and
  exits 1 for a step out of time or a ``verdict(results)`` reason.

Fault injection (tests): ``GSRUN_FAULT_AT=<phase>:<step>[:end]`` SIGKILLs the
hook before (after) that step; users cannot set it (SPANK values are prefixed).
"""

from __future__ import annotations

import _signal as signal
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from gsrun.base.log import safe_text
from gsrun.facts.slurm import run_slurm

FAULT_ENV = "GSRUN_FAULT_AT"
MIN_STEP_S = 0.5
SETUP = "setup"
CLEANUP = "cleanup"


class BudgetExceeded(BaseException):
    """A step's deadline passed (SIGALRM); a BaseException: no ``except Exception`` swallows it."""


class NodeUnusable(Exception):
    """A :data:`SETUP` step found the node cannot run the job (NVML mismatch): exit 1."""


@dataclass(frozen=True, slots=True)
class Step:
    """One row of a hook's table: ``name`` (log, fault-point and result key),
    ``does`` (one line for docs), ``reserve_s`` (kept out of the hook's
    budget), ``fn(ctx)`` -> JSON-able result or None, ``when(ctx)``,
    ``quiet`` (no begin/end lines), ``catch`` (recorded as ``{"error": text}``;
    None: the hook's)."""

    name: str
    does: str
    reserve_s: float
    fn: Callable[[Any], Any]
    when: Callable[[Any], bool] | None = None
    quiet: bool = False
    catch: type[BaseException] | tuple[type[BaseException], ...] | None = None


@dataclass(slots=True)
class Outcome:
    """What :func:`run_steps` did; ``rc`` 1: drain."""

    results: dict = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    budget_exceeded: bool = False
    unusable: str | None = None

    @property
    def rc(self) -> int:
        return 1 if (self.reasons or self.unusable) else 0


def run_steps(phase: str, steps, ctx, log, *, rule: str, budget_s: float | None,
              catch: tuple[type[BaseException], ...] = (Exception,),
              results: dict | None = None, verdict: Callable[[dict], list[str]] | None = None,
              timeout_hint: str = "") -> Outcome:
    """Run ``steps`` in order with ``ctx`` under ``rule`` (module doc).
    ``budget_s`` None: no alarm; ``catch``: exceptions recorded (others
    propagate); ``verdict(results) -> [reason]``: a CLEANUP hook's reasons to
    drain; ``timeout_hint``: logged after a CLEANUP step ran out of time."""
    out = Outcome(results if results is not None else {})
    t0 = time.monotonic()
    steps = list(steps)
    timed = budget_s is not None
    old = signal.signal(signal.SIGALRM, _alarm) if timed else None
    try:
        for i, step in enumerate(steps):
            if step.when is not None and not step.when(ctx):
                continue
            step_s = None
            if timed:
                left = budget_s - (time.monotonic() - t0)
                if rule == SETUP and left <= 0:
                    out.budget_exceeded = True
                    break
                step_s = max(MIN_STEP_S, left - sum(s.reserve_s for s in steps[i + 1:]))
            try:
                if timed:
                    signal.setitimer(signal.ITIMER_REAL, step_s)
                res = _one(phase, step, ctx, log)
                if res is not None:
                    out.results[step.name] = res
            except BudgetExceeded:
                if rule == SETUP:
                    out.budget_exceeded = True
                    break
                out.results[step.name] = {"error": f"timed out after {step_s:.1f} s"}
                out.reasons.append(f"{step.name} step timed out")
                log.error(f"{step.name}: out of time ({step_s:.1f} s)" + (f"; {timeout_hint}" if timeout_hint else ""))
            except NodeUnusable as e:
                out.unusable = str(e)
                break
            except (step.catch if step.catch is not None else catch) as e:
                out.results[step.name] = {"error": safe_text(e)}
            finally:
                if timed:
                    signal.setitimer(signal.ITIMER_REAL, 0)
    except BudgetExceeded:     # an alarm between two steps
        if rule == SETUP:
            out.budget_exceeded = True
        else:
            out.reasons.append(f"{phase} budget exceeded")
    finally:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old if old is not None else signal.SIG_DFL)
    if rule == CLEANUP and verdict is not None:
        out.reasons += verdict(out.results)
    if out.reasons:
        log.error("node needs an admin: " + "; ".join(out.reasons))
    return out


def _one(phase: str, step: Step, ctx, log):
    """One step between its fault boundaries, with its log lines."""
    fault_point(phase, step.name)
    if step.quiet:
        res = step.fn(ctx)
    else:
        t0 = time.monotonic()
        log(f"{step.name}: begin")
        try:
            res = step.fn(ctx)
        except BaseException as e:
            log.error(f"{step.name}: failed after {time.monotonic() - t0:.3f} s: {e}")
            raise
        log(f"{step.name}: end ({time.monotonic() - t0:.3f} s)")
    fault_point(phase, f"{step.name}:end")
    return res


def fault_point(phase: str, point: str) -> None:
    """Tests only: SIGKILL this process when ``$GSRUN_FAULT_AT`` is ``<phase>:<point>``."""
    if os.environ.get(FAULT_ENV) == f"{phase}:{point}":
        os.kill(os.getpid(), signal.SIGKILL)


def _alarm(signum, frame):
    raise BudgetExceeded()


def drain_node(node: str, reason: str, log) -> None:
    """``scontrol update nodename=NODE state=drain reason="gsrun: ..."`` (10 s, one
    line of at most 200 characters). Never raises: a failure is logged."""
    reason = "gsrun: " + " ".join(safe_text(reason).split())[:200]
    log.error(f"draining {node}: {reason}")
    try:
        run_slurm(["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"], 10.0)
    except Exception as e:  # noqa: BLE001
        log.error(f"drain via scontrol failed: {e}")
