"""The layer check reads the modules of the split packages too
(gsrun.node.tuning, gsrun.report.mail, gsrun.bind.plan) and keeps them in
their layer: an area module importing a sibling layer is caught."""

from __future__ import annotations

import pytest

from test_import_layers import imports_of, modules, violation

SPLIT = {
    "gsrun.node.tuning": {"knob", "state", "governor", "vm", "thp", "cstate", "irq", "hugepages", "plan",
                          "lifecycle"},
    "gsrun.report.mail": {"view", "message", "queue", "send"},
    "gsrun.bind.plan": {"rules", "env", "apply", "table"},
}


@pytest.mark.parametrize("pkg", sorted(SPLIT))
def test_every_module_of_a_split_package_is_checked(pkg):
    found = {m for m, _ in modules()}
    assert pkg in found
    assert {f"{pkg}.{s}" for s in SPLIT[pkg]} <= found


@pytest.mark.parametrize("pkg", sorted(SPLIT))
def test_a_split_package_imports_down_the_layers_only(pkg):
    for mod, path in modules():
        if mod == pkg or mod.startswith(pkg + "."):
            assert [d for _, d in imports_of(mod, path) if violation(mod, d)] == []


@pytest.mark.parametrize("src,dst", [("gsrun.node.tuning.irq", "gsrun.bind.plan.env"),
                                     ("gsrun.bind.plan.rules", "gsrun.report.mail.view"),
                                     ("gsrun.report.mail.queue", "gsrun.node.tuning.state")])
def test_a_sibling_import_from_a_split_module_is_caught(src, dst):
    assert violation(src, dst) is not None
