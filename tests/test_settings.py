"""Settings from the environment: strict parsing, and a production configuration that passes check --deploy."""

import os
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from d0web.env import database_from_url, env_bool
from workers.protocol import broker_settings, node_queue


@pytest.mark.parametrize("raw, expected", [("1", True), ("yes", True), ("False", False), ("off", False)])
def test_booleans_accept_the_usual_spellings(monkeypatch, raw, expected):
    monkeypatch.setenv("D0_FLAG", raw)
    assert env_bool("D0_FLAG", not expected) is expected


def test_a_typo_in_a_boolean_is_an_error_not_false(monkeypatch):
    monkeypatch.setenv("D0_FLAG", "ture")
    with pytest.raises(ImproperlyConfigured, match="D0_FLAG='ture' is not a boolean"):
        env_bool("D0_FLAG", False)


def test_database_urls_map_to_django_settings():
    db = database_from_url("postgres://d0:s%40cret@db.internal:5433/d0prod")
    assert (db["ENGINE"], db["NAME"], db["USER"], db["PASSWORD"], db["HOST"], db["PORT"]) == (
        "django.db.backends.postgresql", "d0prod", "d0", "s@cret", "db.internal", "5433")
    with pytest.raises(ImproperlyConfigured, match="mysql"):
        database_from_url("mysql://x/y")


def test_the_filesystem_broker_keeps_its_folders_under_the_given_path(tmp_path):
    url, options = broker_settings(f"filesystem://{tmp_path}/broker")
    assert url == "filesystem://"
    assert options["data_folder_in"] == options["data_folder_out"] == str(tmp_path / "broker" / "messages")
    assert (tmp_path / "broker" / "control").is_dir()
    assert broker_settings("redis://h:6379/0") == ("redis://h:6379/0", {})


def test_node_queues_are_named_from_cluster_and_host():
    assert node_queue("Team A/H100 pod", "gpu-01.example.com") == "d0.node.team-a.h100-pod.gpu-01-example-com"


def test_production_settings_pass_check_deploy(tmp_path):
    env = {
        **os.environ,
        "D0_SECRET_KEY": "k" * 20 + "production-secret-key-with-enough-entropy-0123456789",
        "D0_ALLOWED_HOSTS": "d0.example.com",
        "D0_SECURE_SSL_REDIRECT": "true",
        "D0_SECURE_COOKIES": "true",
        "D0_HSTS_SECONDS": "31536000",
        "D0_VAR_DIR": str(tmp_path),
    }
    result = subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_the_default_settings_fail_check_deploy_loudly(tmp_path):
    result = subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
                            env={**os.environ, "D0_VAR_DIR": str(tmp_path)}, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode != 0
    assert "SECURE_HSTS_SECONDS" in result.stderr + result.stdout
