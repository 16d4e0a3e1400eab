"""Transparent hugepages: ``thp`` / ``thp_defrag``.

``/sys/kernel/mm/transparent_hugepage/{enabled,defrag}``, or RHEL 6's
``/sys/kernel/mm/redhat_transparent_hugepage/`` where only that exists
(:func:`thp_dir`); the current value is the bracketed word, allowed = the
words in the file.
"""

from __future__ import annotations

from gsrun.node.tuning.knob import THP, THP_DIRS, BracketKnob, bracket_choices, bracket_word, kernel_write


def thp_dir(hostfs) -> str:
    """The first of :data:`THP_DIRS` that exists here (the mainline path when neither does)."""
    return next((d for d in THP_DIRS if hostfs.exists(f"{d}/enabled")), THP)


class ThpKnob(BracketKnob):
    """``enabled`` or ``defrag`` in :func:`thp_dir` (mainline or RHEL 6 path)."""

    def __init__(self, key: str, name: str):
        super().__init__(key, f"{THP}/{name}", "transparent hugepages")
        self.name = name
        self.unsupported_reason = ("not supported here (transparent hugepages: neither "
                                   f"/{THP_DIRS[0]}/{name} nor /{THP_DIRS[1]}/{name})")

    def _rel(self, h) -> str:
        return f"{thp_dir(h)}/{self.name}"

    def read(self, h):
        return bracket_word(h.read(self._rel(h)))

    def choices(self, h):
        return bracket_choices(h.read(self._rel(h)))

    def apply(self, h, target, swap):
        kernel_write(h, self._rel(h), target)

    def restore(self, h, prior, swap):
        kernel_write(h, self._rel(h), prior)
