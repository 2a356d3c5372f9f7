"""The OpenAPI schema documents the errors every operation can answer, from what d0 does everywhere rather than a
decorator on each view: the JSON errors of ``errors.py``, the body checks of ``parsers.py`` and the request checks of
``d0web/middleware.py``. A view documents only what is its own (``CONFLICT`` where it refuses a state change)."""

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers


class ErrorSerializer(serializers.Serializer):
    detail = serializers.CharField()


def _error(description: str) -> OpenApiResponse:
    return OpenApiResponse(ErrorSerializer, description=description)


FIELD_ERRORS = OpenApiResponse(
    OpenApiTypes.OBJECT,
    description='The request cannot be used: messages by field (`{"name": ["..."]}`, `non_field_errors` for the '
                'whole body), or `{"detail": "..."}` for a body that does not parse or a query string with a NUL.')
NOT_SIGNED_IN = _error("No credentials, or a token or session that is not valid.")
FORBIDDEN = _error("Not allowed to this user (e.g. only a team admin may), or a session request without its CSRF "
                   "token.")
NOT_FOUND = _error("No such row among your teams' (another team's is a 404 too), or a page past the last.")
CONFLICT = _error("The row's state forbids it (e.g. a finished job cannot be cancelled, a row still used by jobs "
                  "cannot be deleted).")
TOO_LARGE = _error("The request body is over D0_MAX_REQUEST_BYTES.")

UNSAFE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


class D0AutoSchema(AutoSchema):
    def _get_parameters(self):
        parameters = super()._get_parameters()
        if self._is_list_view():
            # A list's filters, ordering and page all read an empty value as "not given" (the HTML forms send
            # them so), and the schema says so.
            for parameter in parameters:
                if parameter["in"] == "query":
                    parameter["allowEmptyValue"] = True
        return parameters

    def _map_serializer_field(self, field, direction, bypass_extensions=False):
        schema = super()._map_serializer_field(field, direction, bypass_extensions)
        # drf-spectacular maps a ListField's min_length but not allow_empty=False, which refuses [] all the same.
        if isinstance(field, serializers.ListField) and not field.allow_empty and schema.get("type") == "array":
            schema.setdefault("minItems", 1)
        return schema

    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        if direction != "response":
            return responses
        for code, response in self._error_responses().items():
            responses.setdefault(str(code), self._get_response_for_code(response, str(code), direction=direction))
        return responses

    def _error_responses(self) -> dict:
        # Any request: a NUL in the query string or a bad filter value (400), a bad token even where no sign-in is
        # needed (401).
        errors = {400: FIELD_ERRORS, 401: NOT_SIGNED_IN}
        if "{" in self.path or (self._is_list_view() and self._get_paginator() is not None):
            errors[404] = NOT_FOUND
        if self.method in UNSAFE_METHODS:
            errors[403] = FORBIDDEN
            errors[413] = TOO_LARGE
        if self.method == "DELETE":
            errors[409] = CONFLICT
        return errors


# The name of the job-submit example (declared on the jobs API, which imports this module, so the name lives here).
JOB_EXAMPLE_NAME = "CheckAndTrace"


def job_example_for_the_caller(result, generator, request, public):
    """A drf-spectacular postprocessing hook: the job-submit example names a cluster of the caller's teams and a
    model of that cluster's team, so posting it as it stands from the docs page submits a job (its static ids,
    1 and 1, name another team's rows or none). Served without a signed-in user, the example keeps them."""
    from ..models import Cluster, ModelSpec

    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return result
    cluster = Cluster.objects.for_user(user).order_by("id").only("id", "team_id").first()
    model = cluster and ModelSpec.objects.filter(team_id=cluster.team_id).order_by("id").only("id").first()
    if cluster is None or model is None:
        return result
    operation = result.get("paths", {}).get("/api/jobs/", {}).get("post", {})
    for media in operation.get("requestBody", {}).get("content", {}).values():
        example = media.get("examples", {}).get(JOB_EXAMPLE_NAME)
        if example is not None:
            example["value"] = {**example["value"], "cluster": cluster.pk, "model": model.pk}
    return result
