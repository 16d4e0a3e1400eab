"""The one jinja2 environment (templates in ``gsrun.templates``):
``StrictUndefined`` (a forgotten variable is an error), block tags take no
lines (``+%}`` keeps one), autoescape only for ``*.html.j2``; scripts quote
with the ``sh`` filter (:func:`shlex.quote`).
"""

from __future__ import annotations

import os
import shlex
from functools import lru_cache

import jinja2

import gsrun.templates


def template_dir() -> str:
    """The directory of the ``gsrun.templates`` package (installed or checkout), symlinks resolved."""
    return os.path.dirname(os.path.realpath(gsrun.templates.__file__))


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The shared :class:`jinja2.Environment` (created once per process)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(template_dir()),
        undefined=jinja2.StrictUndefined,
        autoescape=lambda name: bool(name) and name.endswith((".html.j2", ".html")),
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["sh"] = lambda v: shlex.quote(str(v))
    return env


def render(template: str, /, **variables) -> str:
    """Render ``template`` (e.g. ``"sbatch.sh.j2"``) with ``variables``.

    Raises:
        jinja2.UndefinedError: a variable the template uses was not passed
            (a caller out of step with its template).
        jinja2.TemplateNotFound: the package data is missing (reinstall gsrun).
    """
    return environment().get_template(template).render(**variables)
