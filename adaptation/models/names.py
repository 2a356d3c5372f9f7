"""Names that end up in other names (a cluster's in a node's join name ``<team>/<cluster>``, a virtual backend's in
``virtual:<name>``, an endpoint's in its report) take letters, digits, - and _ only; the field says so before one is
typed, and a refusal says which rule and which value, on the form, in the admin and in the API alike (a CharField
with this validator, not Django's SlugField, whose refusal DRF words anew: "Enter a valid slug")."""

import re

from django.core.exceptions import ValidationError
from django.db import models

SLUG_RULE = "letters, digits, - and _ only"
SLUG_NAME = re.compile(r"[-a-zA-Z0-9_]+")  # Django's slug_re, ASCII only


def validate_slug_name(value: str) -> None:
    # A function, not a RegexValidator instance, so migrations name it rather than copy its message.
    if not SLUG_NAME.fullmatch(value):
        raise ValidationError(f"“%(value)s” cannot be used: a name here takes {SLUG_RULE} (no spaces, dots, "
                              "slashes or accents), e.g. h100-pod_2.", code="invalid", params={"value": value})


def slug_name_field(max_length: int, help_text: str = "", **options) -> models.CharField:
    """A name of ``SLUG_RULE``'s characters, its help text saying so first. Indexed, as SlugField was."""
    rule = f"{SLUG_RULE[0].upper()}{SLUG_RULE[1:]}."
    return models.CharField(max_length=max_length, db_index=True, validators=[validate_slug_name],
                            help_text=f"{rule} {help_text}".strip(), **options)
