"""`celery -A services.planner.entrypoint worker -Q plan --pool solo`: one planner.

The planner handles one message per finished assignment and sends one per new assignment; Celery's
task events would double its Redis traffic and halve its throughput (bench/planner_scale.py), so
they are off for this worker: campaign progress is in the DB (`kernelswarm campaign list`, the web),
and the writers' and evaluators' tasks still send theirs.
"""

from shared.celery_app import make_celery
from shared.logs import configure_logging
from shared.runtime import Runtime
from shared.settings import Settings

from services.planner.tasks import register

settings = Settings.from_env()
configure_logging(settings.log_level)
app = make_celery(settings, "planner")
app.conf.update(worker_send_task_events=False, task_send_sent_event=False)
register(app, Runtime(settings))
