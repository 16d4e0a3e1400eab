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
Every name of the package's modules is re-exported here.
"""

from __future__ import annotations

from gsrun.node.tuning.knob import (BAN_PREFIX, bracket_choices, BRACKET_FILES, bracket_word, BracketKnob,
                                    _CPU, CPU, _cpuset, _dict_shortfall, _dict_value_ok, DIRTY_SIBLING,
                                    FileKnob, _is_scoped, JobScope, kernel_write, Knob, _plain, replaceable,
                                    scope_from_dict, ScopedKnob, THP, THP_DIRS, VM)
from gsrun.node.tuning.state import (JOURNAL_VERSION, LOCK_TIMEOUT_S, _State, _unlink, _write_json)
from gsrun.node.tuning.governor import (governor_cpus, GovernorKnob)
from gsrun.node.tuning.vm import (_check_swap_name, default_swap_effect, DirtyKnob, FakeSwapEffect,
                                  read_meminfo_kb, read_swaps, SWAP_FALLBACK_SWAPPINESS, SWAP_TIMEOUT_S,
                                  SwapEffect, SwapKnob, _unescape_swaps)
from gsrun.node.tuning.thp import (thp_dir, ThpKnob)
from gsrun.node.tuning.cstate import (_cpu_dirs, cstate_hold_us, CstateKnob, DMA_LATENCY, idle_states, _STATE)
from gsrun.node.tuning.irq import (BAN_ABSENT, BAN_PRESENT, IRQ, IRQ_BAN_DIR, irqbalance_ban_dir_of,
                                   irqbalance_check, irqbalance_pids, IRQBALANCE_POLICY_SCRIPT,
                                   irqbalance_policy_script, irqbalance_rescan, IrqKnob, PCI, pids_by_comm,
                                   _remove_ban, _write_ban, MASK_PREFIX, IRQ_SKIP_ERRNOS, effective_cpus,
                                   irq_cpus_text, retry_text, skip_text)
from gsrun.node.tuning.hugepages import (_HP_DIR, ALLOC_RETRIES, HugepagesKnob, NODE, hugetlbfs_mounts, in_use,
                                         job_hugetlbfs_files, pool_counts, remove_job_hugetlbfs_files)
from gsrun.node.tuning.plan import (KNOBS, _decide, Facts, format_plan, plan_tuning, PlanItem, Policy, read_facts,
                                    _short)
from gsrun.node.tuning.lifecycle import (_ban_dir_from_journal, _drop_if_rebooted, epilog_restore,
                                         _errtext, format_status, irq_paths, _leave, prolog_tune, _report,
                                         restore, _restore_entries, retry_skipped_irqs, status)

__all__ = ["KNOBS", "replaceable", "JOURNAL_VERSION", "LOCK_TIMEOUT_S", "SWAP_TIMEOUT_S",
           "SWAP_FALLBACK_SWAPPINESS", "VM", "THP",
           "THP_DIRS", "CPU", "DIRTY_SIBLING", "BRACKET_FILES", "bracket_word", "bracket_choices",
           "read_meminfo_kb", "read_swaps", "thp_dir", "governor_cpus", "kernel_write", "SwapEffect",
           "FakeSwapEffect", "default_swap_effect", "Knob", "FileKnob", "BracketKnob", "ThpKnob", "DirtyKnob",
           "GovernorKnob", "SwapKnob", "NODE", "IRQ", "PCI", "DMA_LATENCY", "JobScope", "scope_from_dict",
           "ScopedKnob", "idle_states", "CstateKnob", "cstate_hold_us", "pids_by_comm", "irqbalance_pids",
           "IRQBALANCE_POLICY_SCRIPT", "IRQ_BAN_DIR", "BAN_PREFIX", "BAN_PRESENT", "BAN_ABSENT",
           "irqbalance_policy_script", "irqbalance_ban_dir_of", "irqbalance_check", "irqbalance_rescan",
           "IrqKnob", "HugepagesKnob", "Facts", "Policy", "PlanItem", "plan_tuning", "format_plan",
           "read_facts", "prolog_tune", "irq_paths", "epilog_restore", "restore", "status", "format_status",
           "retry_skipped_irqs"]
