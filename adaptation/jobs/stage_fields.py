"""Form fields made from the stages' parameter declarations (``workers.engine.stages``), so the job form offers
every parameter a stage takes, with its default, range and help, and reads the values back typed.

A field left blank means "the stage's default" (shown as the placeholder): only what a user fills in is sent.
Lists and objects are JSON; a stage's handler may offer a field of its own for a parameter (the team's virtual
backends are a choice, not ids to type). Values are checked by the
same declarations the API uses (``check_job_parameters``), and an error lands on the field it is about.
"""

from __future__ import annotations

import json

from django import forms

from workers.engine.stages import STAGES

from .. import stages as handlers

SEPARATOR = "__"


def field_name(kind: str, name: str) -> str:
    return f"{kind}{SEPARATOR}{name}"


def _allowed(parameter) -> str:
    if parameter.choices:
        return "one of " + ", ".join(map(str, parameter.choices))
    if parameter.item is not None and parameter.item.choices:
        return "a list of " + ", ".join(map(str, parameter.item.choices))
    low, high = parameter.minimum, parameter.maximum
    if parameter.kind in ("int", "float") and (low is not None or high is not None):
        if low is not None and high is not None:
            return f"{low:g} to {high:g}"
        return f"at least {low:g}" if low is not None else f"at most {high:g}"
    return ""


def _default_text(parameter) -> str:
    if parameter.default is None:
        return "none"
    return json.dumps(parameter.default) if not isinstance(parameter.default, str) else parameter.default


def _field(parameter) -> forms.Field:
    allowed = _allowed(parameter)
    help_text = parameter.help + (f". Allowed: {allowed}" if allowed else "") + \
        f". Default: {_default_text(parameter)}."
    common = {"required": False, "label": parameter.name, "help_text": help_text}
    placeholder = {"placeholder": _default_text(parameter)}
    if parameter.kind == "bool":
        return forms.TypedChoiceField(choices=[("", f"default ({_default_text(parameter)})"), ("true", "yes"),
                                               ("false", "no")], coerce=lambda value: value == "true",
                                      empty_value=None, **common)
    if parameter.kind == "choice":
        return forms.ChoiceField(choices=[("", f"default ({_default_text(parameter)})"),
                                          *[(choice, choice) for choice in parameter.choices]], **common)
    # Ranges are checked by the declaration (one message for the API and the form), not by the browser.
    if parameter.kind == "int":
        return forms.IntegerField(widget=forms.NumberInput(attrs=placeholder), **common)
    if parameter.kind == "float":
        return forms.FloatField(widget=forms.NumberInput(attrs={**placeholder, "step": "any"}), **common)
    if parameter.kind in ("list", "object"):
        return forms.CharField(widget=forms.Textarea(attrs={"rows": 2, **placeholder}), **common)
    return forms.CharField(widget=forms.TextInput(attrs=placeholder), **common)


def stage_fields(user) -> dict[str, dict[str, forms.Field]]:
    """``{kind: {field name: field}}`` for every stage's user parameters, as ``user`` may fill them in."""
    fields = {}
    for kind, spec in STAGES.items():
        handler = handlers.handler(kind)
        fields[kind] = {field_name(kind, parameter.name): handler.form_field(parameter, user) or _field(parameter)
                        for parameter in spec.parameters if parameter.set_by == "user"}
    return fields


def read_values(kind: str, cleaned: dict, add_error) -> dict:
    """The stage's filled-in values, typed (JSON parsed for lists and objects); blank fields are left out."""
    values = {}
    for parameter in STAGES[kind].parameters:
        name = field_name(kind, parameter.name)
        if parameter.set_by != "user" or name not in cleaned:
            continue
        value = cleaned[name]
        if value in (None, "") or (hasattr(value, "exists") and not value.exists()):
            continue
        if hasattr(value, "values_list"):  # rows chosen in a handler's field are sent as their ids
            value = sorted(value.values_list("pk", flat=True))
        elif parameter.kind in ("list", "object"):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as error:
                add_error(name, f"Not valid JSON: {error.msg} (column {error.colno}).")
                continue
        values[parameter.name] = value
    return values


def error_field(key: str) -> str | None:
    """The field a ParameterError's key (``sweep.workload``, ``sharded_run.tp``) is about, if the form has one."""
    kind, _, rest = key.partition(".")
    name = rest.split(".")[0].split("[")[0]
    if kind in STAGES and name:
        return field_name(kind, name)
    return None
