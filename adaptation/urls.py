from django.urls import path

from . import coverage_pages, sharded_runs, sweep_reports, views

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("clusters/", views.cluster_list, name="cluster-list"),
    path("clusters/new/", views.cluster_create, name="cluster-create"),
    path("clusters/<int:pk>/", views.cluster_detail, name="cluster-detail"),
    path("clusters/<int:pk>/topology/", views.cluster_topology_page, name="cluster-topology"),
    path("clusters/<int:pk>/env-check/", views.cluster_env_check, name="cluster-env-check"),
    path("models/", views.model_list, name="model-list"),
    path("models/new/", views.model_create, name="model-create"),
    path("models/catalog/", views.model_catalog, name="model-catalog"),
    path("models/catalog/<str:slug>/add/", views.model_catalog_add, name="model-catalog-add"),
    path("models/<int:pk>/", views.model_detail, name="model-detail"),
    path("jobs/", views.job_list, name="job-list"),
    path("jobs/new/", views.job_create, name="job-create"),
    path("jobs/<int:pk>/", views.job_detail, name="job-detail"),
    path("jobs/<int:pk>/progress/", views.job_progress, name="job-progress"),
    path("jobs/<int:pk>/cancel/", views.job_cancel, name="job-cancel"),
    path("jobs/<int:pk>/retry/", views.job_retry, name="job-retry"),
    path("account/token/", views.api_token, name="api-token-page"),
    path("sweeps/compare/", sweep_reports.compare_page, name="sweep-compare"),
    path("sweeps/<int:pk>/", sweep_reports.report_page, name="sweep-report"),
    path("sweeps/<int:pk>/report.html", sweep_reports.report_html, name="sweep-report-html"),
    path("sweeps/<int:pk>/report.json", sweep_reports.report_json, name="sweep-report-json"),
    path("sweeps/<int:pk>/trials.csv", sweep_reports.report_csv, name="sweep-report-csv"),
    path("coverage/", coverage_pages.coverage_overview, name="coverage"),
    path("coverage/diff/", coverage_pages.coverage_diff, name="coverage-diff"),
    path("models/<int:pk>/coverage/", coverage_pages.model_coverage, name="model-coverage"),
    path("stage-runs/<int:pk>/sharded/", sharded_runs.sharded_run_page, name="sharded-run"),
    path("models/<int:pk>/sharded-runs/", sharded_runs.compare_runs_page, name="sharded-run-compare"),
]
