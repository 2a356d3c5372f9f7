"""Reading an uploaded config.json: size limit, JSON, and an object at the top. Shared by form and API."""

import json

from django.conf import settings
from django.core.exceptions import ValidationError


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def _non_finite_as_text(constant: str) -> str:
    """Released configs contain bare ``Infinity`` (Nemotron-H's time_step_limit), which Python's json reads but
    PostgreSQL's jsonb refuses; keep it as the text "Infinity" (or "-Infinity", "NaN") so nothing is lost."""
    return constant


def read_config_upload(upload) -> dict:
    """The parsed config from an uploaded file, or a ValidationError whose message a person can act on."""
    limit = settings.D0_MAX_CONFIG_BYTES
    if upload.size > limit:
        raise ValidationError(f"The file is {_mib(upload.size)}; the limit for a config.json is {_mib(limit)}.")
    raw = upload.read()
    try:
        config = json.loads(raw.decode("utf-8"), parse_constant=_non_finite_as_text)
    except UnicodeDecodeError:
        raise ValidationError("The file is not UTF-8 text; a config.json is JSON text.") from None
    except json.JSONDecodeError as error:
        raise ValidationError(f"Not valid JSON: {error.msg} at line {error.lineno}, column {error.colno}.") from None
    return check_config(config)


def check_config(config) -> dict:
    if not isinstance(config, dict):
        raise ValidationError(f"A config.json must be a JSON object ({{...}}), not {type(config).__name__}.")
    size = len(json.dumps(config))
    if size > settings.D0_MAX_CONFIG_BYTES:
        raise ValidationError(f"The config is {_mib(size)}; the limit is {_mib(settings.D0_MAX_CONFIG_BYTES)}.")
    return config


def model_name(given: str, config: dict, filename: str = "") -> str:
    """The name given, else the config's ``_name_or_path``, else the uploaded file's name without .json."""
    candidates = [given, config.get("_name_or_path"), filename.rsplit("/", 1)[-1].removesuffix(".json")]
    for candidate in candidates:
        if isinstance(candidate, str) and candidate.strip() and candidate.strip() != "config":
            return candidate.strip()[:200]
    raise ValidationError("Give the model a name (the config has no _name_or_path).")
