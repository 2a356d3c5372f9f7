"""``/api/token/``: a user's API token for their username and password, under the sign-in lockout."""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.authtoken.views import ObtainAuthToken
from rest_framework.exceptions import ValidationError


# What the token endpoint reads, as a schema of its own: DRF's AuthTokenSerializer also lists its read-only
# ``token`` as required, and the docs page's "Try it out" then silently refused to send a form that cannot hold it.
class TokenRequestSerializer(serializers.Serializer):
    """Your username and password (as on the sign-in page), as a form, multipart or JSON body."""

    username = serializers.CharField()
    password = serializers.CharField(style={"input_type": "password"})


class TokenSerializer(serializers.Serializer):
    token = serializers.CharField(help_text='Send it as the header "Authorization: Token <token>".')


class TokenView(ObtainAuthToken):
    """``POST username, password`` → ``{"token": ...}``. Failed attempts count towards the same lockout as the login
    pages (django-axes); while a username and address are locked out the answer is 429 with Retry-After."""

    # The username and password are the credentials: no session is read, so the docs page (signed in, its session
    # cookie sent along) is not held to the CSRF check of a session request, and a stale token header is no 401.
    authentication_classes = []

    @extend_schema(request=TokenRequestSerializer, responses={200: TokenSerializer}, auth=[])
    def post(self, request, *args, **kwargs):
        try:
            return super().post(request, *args, **kwargs)
        except ValidationError:
            # authenticate() was given DRF's request, so django-axes flagged the lockout there; its middleware,
            # which turns the flag into the lockout answer, reads Django's request.
            if getattr(request, "axes_locked_out", False):
                request._request.axes_locked_out = True
                request._request.axes_credentials = getattr(request, "axes_credentials", None)
            raise
