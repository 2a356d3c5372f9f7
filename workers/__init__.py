"""Celery tasks (control plane and node side) and the Django-free engine."""
