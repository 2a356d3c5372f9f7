from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.authtoken.views import obtain_auth_token
from rest_framework.routers import DefaultRouter

from . import views

router = DefaultRouter()
router.register("clusters", views.ClusterViewSet)
router.register("nodes", views.NodeViewSet)
router.register("devices", views.DeviceViewSet)
router.register("links", views.LinkViewSet)
router.register("models", views.ModelSpecViewSet)
router.register("jobs", views.JobViewSet)
router.register("stage-runs", views.StageRunViewSet)
router.register("env-reports", views.EnvReportViewSet)
router.register("model-plans", views.ModelPlanViewSet)
router.register("coverage-reports", views.CoverageReportViewSet)
router.register("operators", views.OperatorRecordViewSet)
router.register("virtual-backends", views.VirtualBackendViewSet)
router.register("sweep-reports", views.SweepReportViewSet, basename="sweep-report")

urlpatterns = [
    path("status/", views.StatusView.as_view(), name="api-status"),
    path("catalog/", views.CatalogView.as_view(), name="api-catalog"),
    path("coverage-diff/", views.CoverageDiffView.as_view(), name="api-coverage-diff"),
    path("token/", obtain_auth_token, name="api-token"),
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("", include(router.urls)),
]
