"""What a service process holds: its Settings, and the DB and object store opened on first use."""

from __future__ import annotations

import threading

from shared.db import Database
from shared.home import secure_home
from shared.settings import Settings
from shared.store import ObjectStore, open_store


class Runtime:
    """Thread-safe lazy handles: a writer worker runs several threads on one Runtime."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        secure_home(settings)
        self._lock = threading.Lock()
        self._db: Database | None = None
        self._store: ObjectStore | None = None

    @property
    def db(self) -> Database:
        with self._lock:
            if self._db is None:
                self._db = Database(self.settings.db_url)
            return self._db

    @property
    def store(self) -> ObjectStore:
        with self._lock:
            if self._store is None:
                self._store = open_store(self.settings)
            return self._store
