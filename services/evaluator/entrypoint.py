"""`celery -A services.evaluator.entrypoint worker -Q evaluate --pool solo`: one per device."""

from shared.celery_app import make_celery
from shared.logs import configure_logging
from shared.runtime import Runtime
from shared.settings import Settings

from services.evaluator.sandbox.isolation import use_reference_uid
from services.evaluator.tasks import register

settings = Settings.from_env()
configure_logging(settings.log_level)
use_reference_uid(settings.reference_uid)
app = make_celery(settings, "evaluator")
register(app, Runtime(settings))
