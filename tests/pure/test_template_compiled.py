"""``templates/compiled.py``: the hot-path templates translated to Python
(:mod:`gsrun.base.template_compile`) are current, render what jinja2 renders,
and give way to jinja2 when the template file differs from their source.
The golden sbatch scripts run both ways in tests/process/test_golden_sbatch.py."""

from __future__ import annotations

from pathlib import Path

import pytest

import gsrun.base.templating as templating
from gsrun.base.template_compile import COMPILED, Unsupported, module_source, render_function, translate
from gsrun.templates import compiled


def test_compiled_module_is_current():
    path = Path(templating.template_dir()) / "compiled.py"
    assert path.read_text(encoding="utf-8") == module_source(), \
        "regenerate: python -P -m gsrun.base.template_compile"
    assert sorted(compiled.TEMPLATES) == sorted(COMPILED)


SUBSET = """{% set xs = items | map("sh") | join(",") %}
a={{ a }} {% if a == 1 %}one{% elif a != 2 %}other{% else %}two{% endif %}
{% for k, v in pairs %}
{{ k }}={{ v | sh }}{% if not v %}!{% endif %}
{% endfor %}
{% if n is none and (a or b) %}none{% endif %}{% if n is not none %}{{ n ~ "/" }}{% endif %}
{{ xs }} {{ items | join(' or ') }} {{ obj.name }} {{ obj.f() }} {{ '{' }}
"""


class _Obj:
    name = "o b"

    def f(self):
        return "called"


@pytest.mark.parametrize("values", [
    dict(a=1, b=0, n=None, items=["x y", "z"], pairs=[("K", "it's"), ("E", "")], obj=_Obj()),
    dict(a=3, b="", n=7, items=[], pairs=[], obj={"name": "dict item", "f": lambda: 5}),
    dict(a=2, b=1, n="p", items=["$(id)"], pairs=(("A", 0),), obj=_Obj()),
])
def test_translation_renders_what_jinja2_renders(values):
    env = templating.environment()
    assert render_function("t.sh.j2", SUBSET, env)(dict(values)) == env.from_string(SUBSET).render(**values)


def test_missing_variable_is_an_error():
    fn = render_function("t.sh.j2", "{{ spec.nodes }}", templating.environment())
    with pytest.raises(KeyError):
        fn({})
    with pytest.raises(AttributeError):
        fn({"spec": object()})


@pytest.mark.parametrize("text", ["{{ loop.index }}", "{% for x in y %}{% set z = 1 %}{% endfor %}",
                                  "{{ x | upper }}", "{{ x[0] }}", "{{ x < 1 }}", "{% macro m() %}{% endmacro %}",
                                  "{{ f(a=1) }}", "{% for x in y if x %}{% endfor %}"])
def test_outside_the_subset_is_refused(text):
    with pytest.raises(Unsupported):
        translate("t.sh.j2", text, templating.environment())


def test_html_templates_are_not_translated():
    with pytest.raises(Unsupported):
        translate("mail.html.j2", "{{ x }}", templating.environment())


def test_changed_template_file_falls_back_to_jinja2(tmp_path, monkeypatch):
    src = (Path(templating.template_dir()) / "sbatch.sh.j2").read_text(encoding="utf-8")
    assert templating._compiled("sbatch.sh.j2") is compiled.TEMPLATES["sbatch.sh.j2"][1]
    (tmp_path / "sbatch.sh.j2").write_text(src + "# edited by the site\n", encoding="utf-8")
    monkeypatch.setattr(templating, "template_dir", lambda: tmp_path)
    assert templating._compiled("sbatch.sh.j2") is None
    assert templating._compiled("mail.txt.j2") is None
