from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from .teams import Team, TeamOwnedQuerySet


class ModelSpecQuerySet(TeamOwnedQuerySet):
    pass


def architecture_of(config: dict) -> str:
    """The architecture a config.json declares: its first ``architectures`` entry, else its ``model_type``."""
    architectures = config.get("architectures")
    if isinstance(architectures, list) and architectures and isinstance(architectures[0], str):
        return architectures[0]
    model_type = config.get("model_type")
    return model_type if isinstance(model_type, str) else ""


class ModelSpec(models.Model):
    """A released model as its config.json describes it. Only the config is kept: never weights, never code."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="model_specs")
    name = models.CharField(max_length=200)
    config = models.JSONField(help_text="The released config.json, as uploaded.")
    source_note = models.TextField(blank=True, help_text="Where the config came from (release, revision).")
    analysis = models.JSONField(null=True, blank=True, editable=False,
                                help_text="d0's offline analysis of the config: sizes, memory, KV cache, mechanisms.")
    catalog_slug = models.CharField(max_length=100, blank=True, editable=False,
                                    help_text="The d0 catalog entry it was added from, if any.")
    architecture = models.CharField(max_length=200, blank=True, editable=False)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created = models.DateTimeField(auto_now_add=True)

    objects = ModelSpecQuerySet.as_manager()

    class Meta:
        ordering = ["-created"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="model_name_unique_in_team")]

    def clean(self):
        if self.config is not None and not isinstance(self.config, dict):
            raise ValidationError({"config": "A config.json must be a JSON object ({...}), not a single value."})
        if isinstance(self.config, dict) and self._analysed is not self.config and (
                self.analysis is None or self._config_changed()):
            try:
                self.analyse()
            except ValidationError as error:
                raise ValidationError({"config": error.messages}) from None

    # The config the analysis was made from, in this process: not analysed again when the instance is cleaned.
    _analysed = None

    def analyse(self) -> None:
        """The config's analysis, which is its validation too: a config it cannot read is a ValidationError with
        the reason (it checks every dimension's range before building anything, so this never hangs or
        allocates). It runs in the analysis process (torch and transformers stay out of the web tier)."""
        from workers.engine.analysis.worker import AnalysisFailed

        from ..analysis_process import analyze

        try:
            self.analysis = analyze(self.config)
        except ValueError as error:  # ConfigError is a ValueError
            raise ValidationError(f"d0 cannot read this config: {error}") from None
        except AnalysisFailed as error:
            raise ValidationError(f"d0 could not analyse this config: {error}") from None
        self._analysed = self.config

    def _config_changed(self) -> bool:
        if self.pk is None:
            return True
        return type(self).objects.filter(pk=self.pk).values_list("config", flat=True).first() != self.config

    def save(self, *args, **kwargs):
        self.architecture = architecture_of(self.config)
        super().save(*args, **kwargs)

    def __str__(self):
        return self.name
