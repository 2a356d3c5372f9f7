from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/", include("adaptation.api_urls")),
    path("", include("adaptation.urls")),
]

handler404 = "adaptation.api.errors.not_found"
handler500 = "adaptation.api.errors.server_error"
