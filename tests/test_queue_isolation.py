"""The tests never share a queue with a development worker (`make run`) in the same checkout."""

from django.conf import settings

from tidalproject.celery import app


def test_tasks_go_to_a_queue_of_the_tests_own() -> None:
    assert app.conf.task_default_queue.startswith("tidal-tests")
    assert app.conf.task_default_queue != "celery"  # the development worker's


def test_on_the_embedded_broker_the_tests_have_a_folder_of_their_own() -> None:
    if not settings.CELERY_BROKER_URL.startswith("filesystem://"):
        return
    options = settings.CELERY_BROKER_TRANSPORT_OPTIONS
    development = str(settings.VAR_DIR / "broker")
    assert options["data_folder_in"] != development and options["data_folder_out"] != development
    assert "test-broker" in options["control_folder"]
