from django.apps import AppConfig


class AdaptationConfig(AppConfig):
    name = "adaptation"
    verbose_name = "Day-zero adaptation"
    default_auto_field = "django.db.models.BigAutoField"
