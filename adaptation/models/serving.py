"""Serving endpoints someone else runs: a team's OpenAI-compatible deployment d0 benchmarks with its load client
(the ``endpoint_bench`` stage). The API key is stored encrypted and never shown again: forms and the API take it,
nothing returns it; the control plane decrypts it only to put it in the dispatched stage's parameters."""

from django.conf import settings
from django.db import models

from .names import slug_name_field
from .teams import Team, TeamOwnedQuerySet


class ServingEndpoint(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="serving_endpoints")
    name = slug_name_field(63, "Its reports and benchmarks are listed under it.")
    # Not a URLField: its validator refuses single-label hosts (gpu-node-3, a Kubernetes service), common here.
    base_url = models.CharField(max_length=500, help_text="The server's base URL, without /v1: http://host:8000")
    served_model = models.CharField(max_length=200, help_text="The model name the endpoint serves (its --served-"
                                                              "model-name, or the path it was started with).")
    api_key_encrypted = models.TextField(blank=True, editable=False)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created = models.DateTimeField(auto_now_add=True)

    objects = TeamOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="serving_endpoint_name_unique_in_team")]

    def __str__(self):
        return self.name

    def clean(self):
        from django.core.exceptions import ValidationError

        from workers.engine.serving.endpoint_bench import check_base_url

        try:
            check_base_url(self.base_url or "")
        except ValueError as error:
            raise ValidationError({"base_url": str(error)}) from None

    @classmethod
    def from_db(cls, db, field_names, values):
        endpoint = super().from_db(db, field_names, values)
        # The address the stored key was given for (absent when the read deferred it).
        endpoint._keyed_base_url = endpoint.__dict__.get("base_url")
        return endpoint

    def save(self, *args, **kwargs):
        """A key is a bearer credential for one server: when the address changes and no new key comes with it,
        the stored key is dropped rather than sent to the new address (whoever repointed the endpoint may not be
        who was given the key)."""
        if self.pk is not None and not getattr(self, "_key_given", False) and self._base_url_changed():
            self.api_key_encrypted = ""
            if kwargs.get("update_fields") is not None:
                kwargs["update_fields"] = {*kwargs["update_fields"], "api_key_encrypted"}
        super().save(*args, **kwargs)
        self._keyed_base_url, self._key_given = self.base_url, False

    def _base_url_changed(self) -> bool:
        stored = getattr(self, "_keyed_base_url", None)
        if stored is None:
            stored = type(self).objects.filter(pk=self.pk).values_list("base_url", flat=True).first()
        return stored is not None and stored != self.base_url

    @property
    def has_api_key(self) -> bool:
        return bool(self.api_key_encrypted)

    def set_api_key(self, key: str | None) -> None:
        """Sets (or, with no key, clears) the key; the next save keeps it whatever the address then is."""
        from ..secrets import encrypt

        self.api_key_encrypted = encrypt(key) if key else ""
        self._key_given = True

    def api_key(self) -> str | None:
        from ..secrets import decrypt

        return decrypt(self.api_key_encrypted) if self.api_key_encrypted else None
