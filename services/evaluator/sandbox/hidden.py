"""The swarm's own data, out of every sandboxed process's view: the evaluator's home (the SQLite DB,
which holds the web's session key, the local object store, the logs, the local Redis's files), the
DB's folder and the store's folder where the settings put them elsewhere, and a scratch folder the
settings name (`KERNELSWARM_SCRATCH_DIR`: every attempt's folder; the default, /dev/shm or /tmp,
is emptied in every view anyway).

The process that starts sandboxed children says once, from its settings, what they must not see
(`hide(swarm_data(settings))`: the evaluator service's `tasks.apply_settings`, `kernelswarm eval`);
`isolation.candidate_view` covers those folders in every child's view (`fsview.private_view`: an
empty read-only tmpfs, the child's own folders bound back in where they lie below). A folder that
holds the code a child runs (this package, its import path, the interpreter) is never covered:
the DB file and the home's known entries are, one by one.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

PACKAGE_ROOT = Path(__file__).resolve().parents[3]
HOME_ENTRIES = ("kernelswarm.db", "store", "logs", "redis")  # what the home holds (settings, `up`)
SQLITE_SIDE_FILES = ("", "-wal", "-shm", "-journal")

_hidden: tuple[Path, ...] = ()


def swarm_data(settings) -> tuple[Path, ...]:
    """The folders (or files) of `settings`' swarm no sandboxed process may read: its home, the
    folder of a SQLite DB and of a file store (`shared.settings.Settings.db_url`, `object_store_url`),
    its scratch folder (a child's own attempt folder below it is bound back in)."""
    home = Path(settings.home).resolve()
    found: list[Path] = [home]
    db = _sqlite_path(settings.db_url)
    if db is not None:
        found.append(db.parent)
    url = urlparse(settings.object_store_url)
    if url.scheme == "file":
        found.append(Path(unquote(url.path)).resolve())
    if settings.scratch_dir is not None:
        found.append(Path(settings.scratch_dir).resolve())
    return _coverable(found, [home / name for name in HOME_ENTRIES]
                      + ([db.with_name(db.name + side) for side in SQLITE_SIDE_FILES] if db is not None else []))


def hide(paths: tuple[Path, ...]) -> None:
    """From now on every sandboxed child of this process sees none of `paths`."""
    global _hidden
    _hidden = tuple(paths)


def hidden() -> tuple[Path, ...]:
    """What `hide` was given last (none before)."""
    return _hidden


def _sqlite_path(url: str) -> Path | None:
    """The file of a `sqlite:///path` URL; None for another DB or an in-memory one."""
    if not url.startswith("sqlite:///"):
        return None
    path = url[len("sqlite:///"):].split("?", 1)[0]
    return Path(path).resolve() if path and path != ":memory:" else None  # relative: to the working directory


def _coverable(folders: list[Path], entries: list[Path]) -> tuple[Path, ...]:
    """`folders` but those holding code a child runs; for those, `entries` below them instead."""
    code = [Path(os.path.realpath(p)) for p in (PACKAGE_ROOT, sys.prefix, sys.base_prefix,
                                                *os.environ.get("PYTHONPATH", "").split(os.pathsep)) if p]
    kept: list[Path] = []
    for folder in dict.fromkeys(folders):
        if any(c == folder or folder in c.parents for c in code):
            kept += [e for e in entries if folder in e.parents and e not in kept]
        elif folder not in kept:
            kept.append(folder)
    return tuple(kept)
