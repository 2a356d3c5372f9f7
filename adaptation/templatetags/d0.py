import json

from django import template
from django.utils.html import format_html
from django.utils.timezone import localtime

register = template.Library()


@register.simple_tag
def status_badge(status, label) -> str:
    """A coloured status label (d0.css colours ``status-<status>``): a tag rather than an included template, whose
    context and lookup cost more than the label itself in a table's every row."""
    return format_html('<span class="status status-{}">{}</span>', status, label)


@register.filter
def stamp(value) -> str:
    """A moment as the tables show it, ``2026-12-04 14:52:10 UTC`` in the current time zone: the same text as the
    ``date:"Y-m-d H:i:s T"`` filter at a tenth of its cost (it formats through a character-by-character formatter;
    a job table has a date in every row)."""
    if not value:
        return ""
    return localtime(value).strftime("%Y-%m-%d %H:%M:%S %Z")


@register.filter
def as_json(value) -> str:
    """Indented JSON for <pre> blocks (Python's repr would show True/None and single quotes)."""
    return json.dumps(value, indent=2, sort_keys=True)


@register.filter
def billions(value) -> str:
    """A parameter count as people write it, never in exponent form: 1.03 T, 671 B, 5.14 B, 2.1 M, 1,536 ("—" when
    unknown)."""
    if value in (None, ""):
        return "—"
    value = float(value)
    # Three significant digits, but a unit up before .3g would write 999.6 as "1e+03".
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if value >= scale * 0.9995:
            return f"{value / scale:.3g} {unit}"
    return f"{value:,.0f}"


@register.filter
def grouped(value) -> str:
    """An integer with thousands separators: 1,525,914."""
    if value in (None, ""):
        return "—"
    return f"{int(value):,}"


@register.filter
def gib(value) -> str:
    """Bytes as GiB, the unit device memory is sold in (and torch reports)."""
    if value in (None, ""):
        return "—"
    return f"{value / 2**30:,.1f} GiB"


@register.filter
def gbps(value) -> str:
    if value in (None, ""):
        return "—"
    return f"{value / 1e9:,.0f} GB/s"


@register.filter
def get(mapping, key):
    return mapping.get(key) if isinstance(mapping, dict) else None


@register.filter
def humanize_key(value: str) -> str:
    return str(value).replace("_", " ")


@register.filter
def timeuntil_seconds(finished, started) -> str:
    """Seconds between two datetimes, for stage durations in reports."""
    return f"{(finished - started).total_seconds():.1f}"


@register.filter
def flops(value) -> str:
    if value in (None, ""):
        return "—"
    return f"{value / 1e9:,.1f} GFLOP/s" if value < 1e12 else f"{value / 1e12:,.1f} TFLOP/s"


@register.filter
def percent(fraction, digits=1) -> str:
    """A share (0.625) as a percentage ("62.5%"); "—" for anything that is not a number."""
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        return "—"
    return f"{100 * fraction:.{int(digits)}f}%"


def _phrase(value) -> str | None:
    """One mechanism's value as words: a nested object as "key value" pairs, a list joined, nothing for what is
    unset (None, false, empty)."""
    if value is None or value is False or value in ("", [], {}):
        return None
    if value is True:
        return "yes"
    if isinstance(value, dict):
        parts = [f"{humanize_key(key)} {said}" for key, item in value.items() if (said := _phrase(item))]
        return ", ".join(parts) or None
    if isinstance(value, list):
        return ", ".join(said for item in value if (said := _phrase(item))) or None
    if isinstance(value, float):
        # Positional, never 1e-06: the page writes numbers as people read them.
        return f"{value:.12f}".rstrip("0").rstrip(".")
    return str(value)


@register.filter
def mechanism_lines(mechanisms) -> list[tuple[str, list[str]]]:
    """The analysis's mechanisms as text for the model page: per section (attention, moe, norm...) its set fields
    as "name: value" lines, unset ones left out; scalar mechanisms gathered under "model"."""
    if not isinstance(mechanisms, dict):
        return []
    sections, model = [], []
    for key, value in mechanisms.items():
        if isinstance(value, dict):
            lines = [f"{humanize_key(name)}: {said}" for name, item in value.items() if (said := _phrase(item))]
            if lines:
                sections.append((humanize_key(key), lines))
        elif (said := _phrase(value)) is not None:
            model.append(f"{humanize_key(key)}: {said}")
    return ([("model", model)] if model else []) + sections
