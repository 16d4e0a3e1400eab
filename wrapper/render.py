"""JobSpec -> sbatch script text. Pure: no I/O but reading the template.

The template (``templates/sbatch.sh.j2``) is rendered with ``StrictUndefined``
(a missing variable is an error) and every user value passes through the
``sh`` filter (:func:`shlex.quote`), so arguments like ``'$(touch x)'; echo``
reach the program literally. ``#SBATCH`` values are allow-listed by
:func:`gsrun.wrapper.spec.validate_fields` before rendering.
"""

from __future__ import annotations

import shlex
from importlib import resources

import jinja2

from .spec import JobSpec


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(_load_template),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["sh"] = lambda v: shlex.quote(str(v))
    return env


def _load_template(name: str) -> str:
    return resources.files("gsrun.templates").joinpath(name).read_text()


def render_script(spec: JobSpec) -> str:
    """The sbatch script for ``spec`` (bash). Passes ``bash -n``."""
    tpl = _env().get_template("sbatch.sh.j2")
    return tpl.render(spec=spec, command=" ".join(shlex.quote(a) for a in spec.command))
