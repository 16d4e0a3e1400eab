"""The direction of every import (docs/DEVELOPING.md, "Layers").

    base <- facts <- request <- node | bind | report <- roles

A module imports only from its own layer or the layers before it; ``node``,
``bind`` and ``report`` are siblings and never import each other; nothing in
the core imports a role (``prolog/``, ``epilog/``, ``wrapper/``, ``admin/``,
``daemon/``, ``spank_py/``). Roles are entry points: ``admin`` (``gsrun-node``)
may dispatch to the hooks in ``prolog``/``epilog``, start the daemon and build
its client and the SPANK plugin; the daemon runs the hooks through admin's
entry point and the plugin's step plans; the user CLIs (``wrapper``), the
hooks and the plugin import no other role.

Every import is checked, also those inside functions (lazy imports on hot
paths), by reading the source: nothing is imported to run this test.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from helpers.paths import REPO

# folder of the checkout -> import package (pyproject's package-dir)
FOLDERS = {"gsrun": "gsrun", "prolog": "gsrun.prolog", "epilog": "gsrun.epilog", "wrapper": "gsrun.wrapper",
           "admin": "gsrun.admin", "daemon": "gsrun.daemon", "spank_py": "gsrun.spank_py",
           "templates": "gsrun.templates"}
RANK = {"base": 0, "facts": 1, "request": 2, "node": 3, "bind": 3, "report": 3,
        "prolog": 4, "epilog": 4, "wrapper": 4, "admin": 4, "daemon": 4, "spank_py": 4}
ROLES = {"prolog", "epilog", "wrapper", "admin", "daemon", "spank_py"}
# role -> roles it may import (entry-point dispatch): the admin command starts the daemon,
# builds its client and the SPANK plugin, and hands the hooks to their step tables; the
# daemon runs the hooks through that same entry point and the plugin's step plans
ROLE_DISPATCH = {"admin": {"prolog", "epilog", "spank_py", "daemon"},
                 "daemon": {"admin", "epilog", "spank_py"}}


def layer_of(module: str) -> str | None:
    """``gsrun.facts.nvml`` -> ``facts``; ``gsrun`` / ``gsrun.templates`` -> None (no layer)."""
    parts = module.split(".")
    if parts[0] != "gsrun" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in RANK else None


def modules() -> list[tuple[str, Path]]:
    out = []
    for folder, pkg in FOLDERS.items():
        for f in sorted((REPO / folder).rglob("*.py")):
            rel = f.relative_to(REPO / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out.append((".".join([pkg, *parts]), f))
    return out


def imports_of(module: str, path: Path) -> list[tuple[int, str]]:
    """Every module named by an import statement in ``path`` (absolute names)."""
    is_pkg = path.name == "__init__.py"
    package = module if is_pkg else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            # `from gsrun import node` names a subpackage, not an attribute
            found += [(node.lineno, f"{target}.{a.name}") for a in node.names
                      if target in ("gsrun", "gsrun.facts", "gsrun.node", "gsrun.report", "gsrun.request",
                                    "gsrun.base", "gsrun.bind")]
    return found


def violation(src: str, dst: str) -> str | None:
    a, b = layer_of(src), layer_of(dst)
    if a is None or b is None or a == b:
        return None
    if b in ROLES:
        if a in ROLES and b in ROLE_DISPATCH.get(a, set()):
            return None
        return f"{src} imports the role {dst}"
    if a in ROLES:
        return None                       # roles use every core layer
    if RANK[b] > RANK[a]:
        return f"{src} ({a}) imports {dst} ({b}), a later layer"
    if RANK[b] == RANK[a]:
        return f"{src} ({a}) imports its sibling layer {dst} ({b})"
    return None


def test_every_import_points_down_the_layers():
    bad = []
    for mod, path in modules():
        for line, dst in imports_of(mod, path):
            why = violation(mod, dst)
            if why:
                bad.append(f"{path.relative_to(REPO)}:{line}: {why}")
    assert not bad, "imports against the layer order (docs/DEVELOPING.md):\n" + "\n".join(bad)


def test_every_core_module_is_in_a_layer():
    """A new module must be put in a layer folder, not at gsrun/ top level."""
    top = sorted(p.name for p in (REPO / "gsrun").glob("*.py") if p.name != "__init__.py")
    assert top == [], f"modules outside a layer: {top}"
    layers = sorted(p.name for p in (REPO / "gsrun").iterdir() if p.is_dir() and p.name != "__pycache__")
    assert layers == sorted(k for k, r in RANK.items() if r < 4)


@pytest.mark.parametrize("src,dst,bad", [
    ("gsrun.facts.nvml", "gsrun.base.errors", False),
    ("gsrun.base.paths", "gsrun.facts.hostfs", True),
    ("gsrun.node.sampler", "gsrun.report.summary", True),
    ("gsrun.report.summary", "gsrun.node.sampler", True),
    ("gsrun.request.config", "gsrun.prolog.main", True),
    ("gsrun.prolog.main", "gsrun.node.tuning", False),
    ("gsrun.prolog.main", "gsrun.admin.node", True),
    ("gsrun.epilog.main", "gsrun.prolog.main", True),
    ("gsrun.admin.node", "gsrun.prolog.main", False),
])
def test_the_rule_itself(src, dst, bad):
    """The checker catches what it must (so a green run means something)."""
    assert (violation(src, dst) is not None) is bad
