"""Node tuning per job: apply in the prolog, restore exactly in the epilog.

Every setting is a get/set pair (:class:`Knob`): ``read`` (fact), ``apply`` and
``restore`` (effects), ``matches``/``is_prior`` (pure). A job's tuning goes

    read facts -> plan (pure, :func:`plan_tuning`) -> journal prior value
    (atomic write + fsync) -> write -> read back and verify

Settings are node-wide, each documented in its area's module; every file is
read and written through :class:`gsrun.facts.hostfs.HostFS` (``--host-root``).
A setting missing on the host is "unsupported", never an error; one whose
prior value cannot be read is never written.

The baseline (:mod:`~gsrun.node.tuning.state`) is an ordered list of entries
``{key, prior, value, owner, holders}``, each fsync'd *before* its setting
changes, so a crash at any point leaves a journal that restores the node. The
first job changing a setting records its prior value; later jobs asking the
same value join ``holders``, a different value is refused. The last job out
restores the entries in reverse order. A baseline from another boot is dropped.
The names other modules use are re-exported here.
"""

from __future__ import annotations

from gsrun.node.tuning.knob import bracket_word, JobScope
from gsrun.node.tuning.state import LOCK_TIMEOUT_S, _State, _write_json
from gsrun.node.tuning.governor import governor_cpus
from gsrun.node.tuning.vm import (default_swap_effect, FakeSwapEffect, read_meminfo_kb, read_swaps,
                                  SWAP_FALLBACK_SWAPPINESS, SwapEffect)
from gsrun.node.tuning.thp import thp_dir
from gsrun.node.tuning.cstate import cstate_hold_us, DMA_LATENCY, idle_states
from gsrun.node.tuning.irq import (IRQ, IRQ_BAN_DIR, irqbalance_check, irqbalance_policy_script, PCI, pids_by_comm,
                                   _write_ban)
from gsrun.node.tuning.hugepages import ALLOC_RETRIES, HugepagesKnob, NODE
from gsrun.node.tuning.plan import KNOBS, format_plan
from gsrun.node.tuning.lifecycle import epilog_restore, format_status, prolog_tune, restore, retry_skipped_irqs, status

__all__ = ["bracket_word", "JobScope", "LOCK_TIMEOUT_S", "_State", "_write_json", "governor_cpus",
           "default_swap_effect", "FakeSwapEffect", "read_meminfo_kb", "read_swaps", "SWAP_FALLBACK_SWAPPINESS",
           "SwapEffect", "thp_dir", "cstate_hold_us", "DMA_LATENCY", "idle_states", "IRQ", "IRQ_BAN_DIR",
           "irqbalance_check", "irqbalance_policy_script", "PCI", "pids_by_comm", "_write_ban", "ALLOC_RETRIES",
           "HugepagesKnob", "NODE", "KNOBS", "format_plan", "epilog_restore", "format_status", "prolog_tune",
           "restore", "retry_skipped_irqs", "status"]
