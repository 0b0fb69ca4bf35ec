"""`celery -A services.planner.entrypoint worker -Q plan --pool solo`: one planner."""

from shared.celery_app import make_celery
from shared.logs import configure_logging
from shared.runtime import Runtime
from shared.settings import Settings

from services.planner.tasks import register

settings = Settings.from_env()
configure_logging(settings.log_level)
app = make_celery(settings, "planner")
register(app, Runtime(settings))
