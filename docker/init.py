"""The compose cluster's one-shot `init` service: bring the DB schema to the newest Alembic migration
and create the object store's bucket, then exit 0.

Every KernelSwarm service waits for it (`depends_on: condition: service_completed_successfully`), so
migrations run once, before anything else opens the DB; a service that opens the DB later finds it
at head and changes nothing. PostgreSQL and MinIO are healthy before it starts; it still retries for
a while, since "healthy" can come a moment before they accept this client.

    python docker/init.py          # settings from KERNELSWARM_* as in every service
"""

from __future__ import annotations

import logging
import sys
import time

from alembic.script import ScriptDirectory
from sqlalchemy.exc import OperationalError

from shared.db.session import alembic_config, migrate
from shared.errors import StoreError
from shared.logs import configure_logging
from shared.settings import Settings
from shared.store import open_store

log = logging.getLogger("kernelswarm.init")
WAIT_S = 60.0
RETRY_EVERY_S = 2.0


def retrying(what: str, step, deadline: float):
    while True:
        try:
            return step()
        except (OperationalError, StoreError) as error:
            if time.monotonic() > deadline:
                raise
            log.warning("%s not ready, retrying: %s", what, str(error).splitlines()[0])
            time.sleep(RETRY_EVERY_S)


def main() -> int:
    settings = Settings.from_env()
    configure_logging(settings.log_level)
    deadline = time.monotonic() + WAIT_S
    retrying("database", lambda: migrate(settings.db_url), deadline)
    head = ScriptDirectory.from_config(alembic_config(settings.db_url)).get_current_head()
    log.info("database at migration %s", head)
    retrying("object store", lambda: open_store(settings), deadline)
    log.info("object store ready at %s", settings.object_store_url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
