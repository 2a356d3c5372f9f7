"""The page behind a user's name: their API token, and a button that replaces it."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache

from . import services


@never_cache  # the page shows a credential: no cache may keep it
@login_required
def api_token(request):
    if request.method == "POST":
        services.rotate_api_token(request.user)
        messages.success(request, "A new API token was made; the old one no longer works.")
        return redirect("api-token-page")
    return render(request, "adaptation/teams/api_token.html", {"token": services.api_token(request.user)})
