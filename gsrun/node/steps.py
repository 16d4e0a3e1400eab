"""The one step runner of the Slurm hooks (prolog, epilog, EpilogSlurmctld).

A hook is an ordered table of :class:`Step` rows -- name, what it does in one
line, the seconds it keeps out of the hook's budget, the function -- that
:func:`run_steps` runs in order. The runner owns what every hook shares:

- **the budget**: a hard deadline by ``SIGALRM`` raising
  :class:`BudgetExceeded` (a ``BaseException``, so no library's ``except
  Exception`` swallows it). Each step may run until the hook's budget minus
  the ``reserve_s`` of every later row (at least :data:`MIN_STEP_S`), so one
  wedged step cannot starve the steps after it;
- **the log lines**: ``<step>: begin`` / ``<step>: end (<s> s)`` /
  ``<step>: failed after <s> s: <error>`` (none for a ``quiet`` row: a check
  that changes nothing);
- **the fault boundary** (tests only, below);
- **the drain decision** (:attr:`Outcome.rc`), by the hook's rules
  (:data:`SETUP` or :data:`CLEANUP`).

Two rules, one per kind of hook:

- :data:`SETUP` (prolog, before the job): the hook exits non-zero only when
  the node truly cannot run the job -- a step raised :class:`NodeUnusable`;
  the runner stops there. Running out of budget ends the hook too, but the
  job goes on with what was done: no drain.
- :data:`CLEANUP` (epilog, after the job): every step runs, even when an
  earlier one failed or ran out of time. A step out of time may have left the
  node changed, so it is a reason to drain (``"<step> step timed out"``), and
  so is every reason ``verdict(results)`` returns (a lost GPU, GPU memory
  still held); any reason makes the hook exit 1 and slurmd drains the node.

Fault injection (tests only) -- the one hook point left in production code:
with ``GSRUN_FAULT_AT=<phase>:<step>`` the runner SIGKILLs its own process
just before that step, with ``<phase>:<step>:end`` just after it succeeded,
so tests can kill the real prolog/epilog at every step boundary. It is a
kill of the process itself and nothing else (no code is loaded from the
environment); slurmd never sets the variable and users cannot: the hook
environment comes from slurmd, and SPANK values reach it only with a
``SPANK_`` prefix.

:func:`drain_node` is the drain itself (``scontrol update ... state=drain``),
for the steps that must drain at once (a MIG GPU that cannot be put back).
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
    """Raised by SIGALRM when a step's deadline passes. A BaseException, so
    that no ``except Exception`` of a library (``comment_from_slurm``...) can
    swallow the deadline."""


class NodeUnusable(Exception):
    """Raised by a :data:`SETUP` step when the node truly cannot run the job
    (NVML driver/library mismatch): the runner stops and :attr:`Outcome.rc`
    is 1, so slurmd drains the node. ``str()`` is the reason."""


@dataclass(frozen=True, slots=True)
class Step:
    """One row of a hook's table.

    ``name``: log and fault-point name (``GSRUN_FAULT_AT=<phase>:<name>``),
    also the key of its result. ``does``: what it does, one line (docs,
    ``--help``). ``reserve_s``: seconds kept for this step out of the hook's
    budget (earlier steps are cut off that much sooner; 0: the step gets only
    what is left). ``fn(ctx)``: the step; it returns a JSON-able result
    (``None``: nothing recorded). ``when(ctx)``: run the step only if true
    (decided when its turn comes). ``quiet``: no begin/end lines (a check
    that changes nothing). ``catch``: exceptions recorded as ``{"error":
    text}`` instead of ending the hook (``None``: the hook's).
    """

    name: str
    does: str
    reserve_s: float
    fn: Callable[[Any], Any]
    when: Callable[[Any], bool] | None = None
    quiet: bool = False
    catch: type[BaseException] | tuple[type[BaseException], ...] | None = None


@dataclass(slots=True)
class Outcome:
    """What :func:`run_steps` did. ``results``: step name -> result (or
    ``{"error": text}``); ``reasons``: why the node needs an admin (drain);
    ``budget_exceeded``: a :data:`SETUP` hook ran out of budget and skipped
    the rest; ``unusable``: the :class:`NodeUnusable` reason, if any; ``rc``:
    the hook's exit status (0, or 1: drain)."""

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
    """Run ``steps`` (a sequence of :class:`Step`) in order with ``ctx``.

    ``phase``: the hook (``prolog``, ``epilog``, ``epilog-ctld``): fault
    points are ``<phase>:<step>``. ``log``: a :class:`gsrun.base.log.JobLog`.
    ``rule``: :data:`SETUP` or :data:`CLEANUP` (module doc). ``budget_s``:
    the hook's hard budget in seconds (``None``: no alarm). ``catch``: the
    exceptions a step's failure is recorded for (the hook goes on); others
    end the hook (they propagate, the alarm is off). ``results``: the dict
    results are written into (e.g. the prolog record's ``steps``).
    ``verdict(results) -> [reason]``: a :data:`CLEANUP` hook's own reasons
    to drain, asked after every step ran. ``timeout_hint``: said after a
    CLEANUP step ran out of time (what the admin can do).

    Returns an :class:`Outcome`; when it says to drain (``rc`` 1) the reasons
    are logged as ``node needs an admin: ...``.
    """
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
    """Tests only: SIGKILL this process when ``$GSRUN_FAULT_AT`` is
    ``<phase>:<point>`` (module doc). Does nothing otherwise."""
    if os.environ.get(FAULT_ENV) == f"{phase}:{point}":
        os.kill(os.getpid(), signal.SIGKILL)


def _alarm(signum, frame):
    raise BudgetExceeded()


def drain_node(node: str, reason: str, log) -> None:
    """``scontrol update nodename=NODE state=drain reason="gsrun: ..."``
    (bounded, 10 s; the reason on one line, at most 200 characters). Never
    raises: a failed scontrol is logged (the epilog also exits non-zero,
    which drains the node even if this fails)."""
    reason = "gsrun: " + " ".join(safe_text(reason).split())[:200]
    log.error(f"draining {node}: {reason}")
    try:
        run_slurm(["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"], 10.0)
    except Exception as e:  # noqa: BLE001
        log.error(f"drain via scontrol failed: {e}")
