"""The pages, each capability's from its ``pages`` module (the API's router is ``api/urls.py``)."""

from django.urls import path

from . import reports
from .clusters import pages as clusters
from .coverage import pages as coverage
from .intake import pages as intake
from .jobs import pages as jobs
from .sharding import pages as sharding
from .serving import endpoint_pages as endpoints
from .serving import pages as serving
from .sweeps import pages as sweeps
from .teams import pages as teams

urlpatterns = [
    path("", jobs.dashboard, name="dashboard"),
    path("clusters/", clusters.cluster_list, name="cluster-list"),
    path("clusters/new/", clusters.cluster_create, name="cluster-create"),
    path("clusters/<int:pk>/", clusters.cluster_detail, name="cluster-detail"),
    path("clusters/<int:pk>/topology/", clusters.cluster_topology_page, name="cluster-topology"),
    path("clusters/<int:pk>/env-check/", clusters.cluster_env_check, name="cluster-env-check"),
    path("clusters/<int:pk>/join-tokens/", clusters.join_token_create, name="join-token-create"),
    path("clusters/<int:pk>/join-tokens/<int:token_pk>/revoke/", clusters.join_token_revoke,
         name="join-token-revoke"),
    path("models/", intake.model_list, name="model-list"),
    path("models/new/", intake.model_create, name="model-create"),
    path("models/catalog/", intake.model_catalog, name="model-catalog"),
    path("models/catalog/<str:slug>/add/", intake.model_catalog_add, name="model-catalog-add"),
    path("models/<int:pk>/", intake.model_detail, name="model-detail"),
    path("models/<int:pk>/adapt/", intake.model_adapt, name="model-adapt"),
    path("jobs/", jobs.job_list, name="job-list"),
    path("jobs/new/", jobs.job_create, name="job-create"),
    path("jobs/<int:pk>/", jobs.job_detail, name="job-detail"),
    path("jobs/<int:pk>/progress/", jobs.job_progress, name="job-progress"),
    path("jobs/<int:pk>/cancel/", jobs.job_cancel, name="job-cancel"),
    path("jobs/<int:pk>/retry/", jobs.job_retry, name="job-retry"),
    path("account/token/", teams.api_token, name="api-token-page"),
    path("reports/", reports.report_index, name="report-index"),
    path("sweeps/compare/", sweeps.compare_page, name="sweep-compare"),
    path("sweeps/<int:pk>/", sweeps.report_page, name="sweep-report"),
    path("sweeps/<int:pk>/report.html", sweeps.report_html, name="sweep-report-html"),
    path("sweeps/<int:pk>/report.json", sweeps.report_json, name="sweep-report-json"),
    path("sweeps/<int:pk>/trials.csv", sweeps.report_csv, name="sweep-report-csv"),
    path("engines/compare/", serving.compare_page, name="engine-compare"),
    path("engines/<int:pk>/", serving.report_page, name="engine-report"),
    path("engines/<int:pk>/report.json", serving.report_json, name="engine-report-json"),
    path("engines/<int:pk>/recipe.sh", serving.recipe, name="engine-recipe"),
    path("engines/<int:pk>/recipe.sbatch", serving.recipe, {"launcher": "slurm"}, name="engine-recipe-slurm"),
    path("engines/<int:pk>/recipe-lws.yaml", serving.recipe, {"launcher": "lws"}, name="engine-recipe-lws"),
    path("endpoints/", endpoints.endpoint_list, name="endpoint-list"),
    path("endpoints/<int:pk>/bench/", endpoints.endpoint_bench, name="endpoint-bench"),
    path("endpoints/<int:pk>/delete/", endpoints.endpoint_delete, name="endpoint-delete"),
    path("endpoints/reports/<int:pk>/", endpoints.report_page, name="endpoint-report"),
    path("endpoints/reports/<int:pk>/report.json", endpoints.report_json, name="endpoint-report-json"),
    path("coverage/", coverage.coverage_overview, name="coverage"),
    path("coverage/diff/", coverage.coverage_diff, name="coverage-diff"),
    path("models/<int:pk>/coverage/", coverage.model_coverage, name="model-coverage"),
    path("stage-runs/<int:pk>/sharded/", sharding.sharded_run_page, name="sharded-run"),
    path("models/<int:pk>/sharded-runs/", sharding.compare_runs_page, name="sharded-run-compare"),
]
