from django.apps import AppConfig


class AdaptationConfig(AppConfig):
    name = "adaptation"
    verbose_name = "Day-zero adaptation"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from d0web import checks  # noqa: F401 - registers d0's deployment checks

        from . import stages
        from .clusters import broker_users  # noqa: F401 - deleting a node or join token deletes its broker user

        stages.discover()
