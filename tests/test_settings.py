"""Settings from the environment: strict parsing, and a production configuration that passes check --deploy."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from d0web.env import database_from_url, env_bool
from workers.protocol import node_queue


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


def test_the_zero_setup_broker_is_the_embedded_valkey_on_a_socket_only_its_user_reaches(tmp_path):
    from d0web import embedded_broker

    assert embedded_broker.broker_url(tmp_path) == f"redis+socket://{tmp_path}/valkey.sock"
    server = embedded_broker.start(tmp_path)
    try:
        assert embedded_broker.answers(tmp_path)
        assert stat.S_IMODE(os.stat(tmp_path / "valkey.sock").st_mode) == 0o700
        with pytest.raises(RuntimeError, match="already answers"):
            embedded_broker.start(tmp_path)
        # The transport Celery uses, over the socket: a message put is a message got
        from kombu import Connection

        with Connection(embedded_broker.broker_url(tmp_path)) as connection:
            queue = connection.SimpleQueue("d0-test")
            queue.put({"job": 1})
            assert queue.get(timeout=5).payload == {"job": 1}
            queue.close()
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert (tmp_path / "valkey" / "appendonlydir").is_dir()  # messages kept across restarts of `up`


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


def test_an_empty_var_dir_is_the_default_not_the_working_directory(tmp_path):
    result = subprocess.run([sys.executable, "-c", "import django; django.setup(); from django.conf import settings; "
                             "print(settings.VAR_DIR)"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "D0_VAR_DIR": "", "DJANGO_SETTINGS_MODULE": "d0web.settings",
                                 "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(Path(__file__).resolve().parent.parent / "var")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("variables, interval", [({"D0_LIVENESS_INTERVAL": "3"}, "3.0"),
                                                 ({"D0_SWEEP_INTERVAL": "4"}, "4.0"),  # its deprecated name
                                                 ({"D0_LIVENESS_INTERVAL": "3", "D0_SWEEP_INTERVAL": "4"}, "3.0"),
                                                 ({}, "10.0")])
def test_the_liveness_interval_is_read_under_its_name_and_its_old_one(tmp_path, variables, interval):
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("D0_LIVENESS_INTERVAL", "D0_SWEEP_INTERVAL")}
    result = subprocess.run([sys.executable, "-c", "import django; django.setup(); from django.conf import settings; "
                             "print(settings.D0_LIVENESS_INTERVAL, settings.CELERY_BEAT_SCHEDULE['check-liveness']"
                             "['schedule'])"], capture_output=True, text=True, timeout=120,
                            env={**environment, **variables, "D0_VAR_DIR": str(tmp_path),
                                 "DJANGO_SETTINGS_MODULE": "d0web.settings",
                                 "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [interval, interval]
