"""Deployment checks of d0's own (``manage.py check --deploy``), beside Django's."""

from django.conf import settings
from django.core import checks

# Placeholders that have stood in example files: a key anyone can read is no secret.
PLACEHOLDER_PREFIXES = ("change-me", "changeme", "django-insecure", "secret", "insecure")


@checks.register(checks.Tags.security, deploy=True)
def secret_key_is_given(app_configs, **kwargs):
    if not settings.D0_SECRET_KEY_FROM_ENVIRONMENT:
        return [checks.Error(
            "D0_SECRET_KEY is not set: the key d0 made in its var/ folder is for the zero-setup run on one machine.",
            hint='Set D0_SECRET_KEY to a long random string, e.g. python -c "import secrets; '
                 'print(secrets.token_urlsafe(50))".', id="d0.E001")]
    if settings.SECRET_KEY.lower().startswith(PLACEHOLDER_PREFIXES) or len(settings.SECRET_KEY) < 40:
        return [checks.Error("D0_SECRET_KEY is a placeholder or shorter than 40 characters.",
                             hint="Set it to a long random string that is not published anywhere.", id="d0.E002")]
    return []
