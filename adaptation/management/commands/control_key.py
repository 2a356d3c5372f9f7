"""Prints the control plane's public key: what a node is given as ``--control-key`` (or ``$D0_CONTROL_KEY``) when
it joins, as the cluster page's join command shows it. Makes the key pair first if there is none yet."""

from django.core.management.base import BaseCommand

from adaptation import control_messages


class Command(BaseCommand):
    help = "Print the control plane's public key (a node's --control-key)."

    def handle(self, *args, **options):
        self.stdout.write(control_messages.public_key())
