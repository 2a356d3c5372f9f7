import json

from django import template

register = template.Library()


@register.filter
def as_json(value) -> str:
    """Indented JSON for <pre> blocks (Python's repr would show True/None and single quotes)."""
    return json.dumps(value, indent=2, sort_keys=True)
