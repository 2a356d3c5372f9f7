"""Pages for sharded validation runs (a job's ``sharded_run`` stage): the run page and the comparison of runs."""

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse


@login_required
def sharded_run_page(request, pk):
    return HttpResponse(status=501)


@login_required
def compare_runs_page(request, pk):
    return HttpResponse(status=501)
