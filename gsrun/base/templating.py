"""The one jinja2 environment: every file gsrun renders comes from here.

Templates live in the ``gsrun.templates`` package (``templates/`` in a
checkout). The environment is strict and the same for every template:

- ``StrictUndefined``: a variable the caller forgot is an error, never an
  empty string in a script, a mail or slurm.conf;
- ``trim_blocks`` / ``lstrip_blocks`` / ``keep_trailing_newline``: block tags
  take no lines of their own (``+%}`` keeps the newline where one is wanted);
- autoescape only for ``*.html.j2`` (HTML mail); scripts and config files are
  rendered as text and quote with the ``sh`` filter (:func:`shlex.quote`).

jinja2 is imported on first use, so hot paths that never render pay nothing;
the templates of :data:`gsrun.base.template_compile.COMPILED` (``sbatch.sh.j2``:
every ``gsrun``) are rendered by their generated Python in
``templates/compiled.py`` and import no jinja2 at all, while the template file
is the one they were generated from. No ``pathlib`` either: every ``gsrun``
renders through here.
"""

from __future__ import annotations

import os
import shlex
from functools import lru_cache


def template_dir() -> str:
    """The directory of the ``gsrun.templates`` package (installed or checkout), symlinks resolved."""
    import gsrun.templates

    return os.path.dirname(os.path.realpath(gsrun.templates.__file__))


@lru_cache(maxsize=1)
def environment():
    """The shared :class:`jinja2.Environment` (created once per process)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(template_dir()),
        undefined=jinja2.StrictUndefined,
        autoescape=lambda name: bool(name) and name.endswith((".html.j2", ".html")),
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["sh"] = lambda v: shlex.quote(str(v))
    return env


def _compiled(template: str):
    """The generated render function of ``template``, or None (not compiled,
    ``templates/compiled.py`` missing, or the template file changed since)."""
    try:
        from gsrun.templates.compiled import TEMPLATES
    except ImportError:
        return None
    entry = TEMPLATES.get(template)
    if entry is None:
        return None
    source, fn = entry
    try:
        with open(os.path.join(template_dir(), template), encoding="utf-8") as f:
            current = f.read()
    except (OSError, UnicodeDecodeError):
        return None
    return fn if current == source else None


def render(template: str, /, **variables) -> str:
    """Render ``template`` (e.g. ``"sbatch.sh.j2"``) with ``variables``.

    Raises:
        jinja2.UndefinedError: a variable the template uses was not passed
            (a caller out of step with its template); ``KeyError`` /
            ``AttributeError`` for a compiled template.
        jinja2.TemplateNotFound: the package data is missing (reinstall gsrun).
    """
    fn = _compiled(template)
    if fn is not None:
        return fn(variables)
    return environment().get_template(template).render(**variables)
