import json

from django import template

register = template.Library()


@register.filter
def as_json(value) -> str:
    """Indented JSON for <pre> blocks (Python's repr would show True/None and single quotes)."""
    return json.dumps(value, indent=2, sort_keys=True)


@register.filter
def billions(value) -> str:
    """A parameter count as people write it: 671 B, 5.1 B, 0.6 B ("—" when unknown)."""
    if value in (None, ""):
        return "—"
    return f"{value / 1e9:.3g} B"


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
