"""The swarm's own files kept to their owner (issue 40): the home (`KERNELSWARM_HOME`, .kernelswarm
by default) 0700, so that its SQLite DB (which holds the web's session key), local object store,
logs and private Redis are nobody else's to read; the DB file itself 0600 wherever it lies.

Folders the swarm makes for its data are made 0700 (`private_folder`); an existing home found
looser is tightened (`secure_home`, called where a process takes its settings: the services'
Runtime, the web app, `kernelswarm up` and every CLI command whose home exists). Only the home and
the DB's own files are ever tightened: a DB or store in a folder of someone else's (/tmp) leaves
that folder as it is.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from shared.settings import Settings

log = logging.getLogger(__name__)
PRIVATE = 0o077  # the group's and others' bits


def private_folder(path: Path) -> Path:
    """`path`, with every folder of it that was missing made 0700 (existing ones left as they are)."""
    missing = []
    for folder in (path, *path.parents):
        if folder.exists():
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:  # made meanwhile by another process
            pass
    return path


def tighten(path: Path) -> bool:
    """Take the group's and others' rights off `path` (left a link's target alone); whether it had any."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(mode) or not mode & PRIVATE:
        return False
    os.chmod(path, stat.S_IMODE(mode) & ~PRIVATE)
    return True


def private_db_file(path: Path) -> None:
    """A SQLite DB file and its -wal and -shm beside it: 0600, created so when missing (SQLite gives
    its -wal and -shm the DB file's mode). A path SQLite cannot open (a folder) is left to it. An
    existing file is never opened here: SQLite's locks are POSIX locks, and closing any descriptor of
    the file would drop every lock this process's own connections hold on it (another process's
    last close would then delete the WAL they still read)."""
    if path.is_dir():
        return
    if not path.exists():
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            pass  # made meanwhile by another process: not opened here
        except OSError:
            return  # SQLite reports it, with the URL
    for file in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if tighten(file):
            log.warning("%s was readable by others: now %o", file, stat.S_IMODE(file.stat().st_mode))


def secure_home(settings: Settings, create: bool = True) -> Path:
    """The home, 0700: made so (`create`), or tightened when found looser."""
    home = settings.home.resolve()
    if create:
        private_folder(home)
    if home.is_dir() and tighten(home):
        log.warning("the home %s was open to others: now %o", home, stat.S_IMODE(home.stat().st_mode))
    return home
