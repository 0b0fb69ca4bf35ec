"""What a Python process started by the tests does at start-up, through `site/sitecustomize.py`
(tests/conftest.py puts `site/` on PYTHONPATH): when `shared.db.session` is imported, redirect its
SQLite file URLs to PostgreSQL (the PostgreSQL pass, pgtest.py) and record that the current test
used a database (while recording, dbuse.py), as the test process itself does.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from collections.abc import Callable
from types import ModuleType

import dbuse
import pgtest

TARGET = "shared.db.session"


def install() -> None:
    actions: list[Callable[[ModuleType], None]] = []
    server_url = os.environ.get(pgtest.SERVER_URL_VAR)
    if server_url:
        redirect = pgtest.Redirect(server_url)
        actions.append(lambda module: pgtest.redirect_engines(module, redirect))
    log = dbuse.child_log()
    if log is not None:
        actions.append(lambda module: dbuse.record_engines(module, log.record))
    if actions:
        after_import(TARGET, lambda module: [action(module) for action in actions])


def after_import(name: str, then: Callable[[ModuleType], object]) -> None:
    """`then(module)` once module `name` has run its code (now, if it was imported already)."""
    if name in sys.modules:
        then(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))


class _ThenLoader(importlib.abc.Loader):
    def __init__(self, inner, then) -> None:
        self.inner, self.then = inner, then

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        self.then(module)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, then) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None and spec.loader is not None:
                sys.meta_path.remove(self)
                spec.loader = _ThenLoader(spec.loader, self.then)
                return spec
        return None
