"""Creates the zero-setup demo: an admin user, a team, and the cluster ``local`` for this machine."""

import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from adaptation.choices import InterconnectKind, TeamRole
from adaptation.models import Cluster, Membership, Team

DEMO_TEAM = "demo"
LOCAL_CLUSTER = "local"


class Command(BaseCommand):
    help = "Create (once) the demo admin, the demo team and cluster 'local'; print the credentials."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")

    @transaction.atomic
    def handle(self, *args, username, **options):
        credentials = settings.VAR_DIR / "demo-credentials.txt"
        user_model = get_user_model()
        user = user_model.objects.filter(username=username).first()
        if user is None:
            password = secrets.token_urlsafe(12)
            user = user_model.objects.create_superuser(username, password=password)
            credentials.write_text(f"{username} {password}\n")
            credentials.chmod(0o600)
        team, _ = Team.objects.get_or_create(slug=DEMO_TEAM, defaults={"name": "Demo team"})
        Membership.objects.get_or_create(team=team, user=user, defaults={"role": TeamRole.ADMIN})
        Cluster.objects.get_or_create(
            team=team, name=LOCAL_CLUSTER,
            defaults={"description": "This machine, registered by the zero-setup run.",
                      "interconnect": InterconnectKind.LOOPBACK},
        )
        if credentials.exists():
            saved_user, saved_password = credentials.read_text().split()
            self.stdout.write(f"Demo login: {saved_user} / {saved_password}   (kept in {credentials})")
        else:
            self.stdout.write(f"Demo login: {username} (password set earlier; change it with "
                              f"'python manage.py changepassword {username}')")
        self.stdout.write(f"Local cluster join name: {team.slug}/{LOCAL_CLUSTER}")
