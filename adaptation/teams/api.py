"""``/api/token/``: a user's API token for their username and password, under the sign-in lockout."""

from rest_framework.authtoken.views import ObtainAuthToken
from rest_framework.exceptions import ValidationError


class TokenView(ObtainAuthToken):
    """``POST username, password`` → ``{"token": ...}``. Failed attempts count towards the same lockout as the login
    pages (django-axes); while a username and address are locked out the answer is 429 with Retry-After."""

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
