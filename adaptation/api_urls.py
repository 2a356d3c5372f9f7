"""The one router: each capability's viewsets, plus the catalog, the coverage diff, tokens, the schema, its docs
and health."""

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.routers import DefaultRouter

from .clusters import api as clusters
from .coverage import api as coverage
from .intake import api as intake
from .jobs import api as jobs
from .jobs.health import StatusView
from .serving import api as serving
from .sweeps import api as sweeps
from .teams.api import TokenView

router = DefaultRouter()
router.register("clusters", clusters.ClusterViewSet)
router.register("join-tokens", clusters.JoinTokenViewSet)
router.register("nodes", clusters.NodeViewSet)
router.register("devices", clusters.DeviceViewSet)
router.register("links", clusters.LinkViewSet)
router.register("models", intake.ModelSpecViewSet)
router.register("jobs", jobs.JobViewSet)
router.register("stage-runs", jobs.StageRunViewSet)
router.register("env-reports", clusters.EnvReportViewSet)
router.register("model-plans", intake.ModelPlanViewSet)
router.register("coverage-reports", coverage.CoverageReportViewSet)
router.register("operators", coverage.OperatorRecordViewSet)
router.register("virtual-backends", coverage.VirtualBackendViewSet)
router.register("sweep-reports", sweeps.SweepReportViewSet, basename="sweep-report")
router.register("engine-reports", serving.EngineReportViewSet, basename="engine-report")
router.register("endpoint-reports", serving.EndpointReportViewSet, basename="endpoint-report")
router.register("serving-endpoints", serving.ServingEndpointViewSet)

urlpatterns = [
    path("status/", StatusView.as_view(), name="api-status"),
    path("catalog/", intake.CatalogView.as_view(), name="api-catalog"),
    path("coverage-diff/", coverage.CoverageDiffView.as_view(), name="api-coverage-diff"),
    path("token/", TokenView.as_view(), name="api-token"),
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    # The split view serves its start-up script as a file of its own, so the docs work under the CSP.
    path("docs/", SpectacularSwaggerSplitView.as_view(url_name="api-schema"), name="api-docs"),
    path("", include(router.urls)),
]
