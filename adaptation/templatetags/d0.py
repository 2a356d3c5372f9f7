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
