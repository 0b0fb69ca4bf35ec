"""`celery -A services.worker.entrypoint worker -Q write --pool threads -c N`: N writers."""

from shared.celery_app import make_celery
from shared.logs import configure_logging
from shared.runtime import Runtime
from shared.settings import Settings

from services.worker.tasks import register

settings = Settings.from_env()
configure_logging(settings.log_level)
app = make_celery(settings, "worker")
register(app, Runtime(settings))
