"""A problem's notes: the shared Markdown log its writers read in their brief and append to with the
`note` tool (what was tried, what the profile said, what failed and why).

Where it lives:
- every entry, for good, as a `notes` row (`NoteRow`: author, time, text, the writer's latest
  attempt if any, and `shown`: how the current file shows it, FULL, SHORT or DROPPED);
- the current notes file, the FULL and SHORT entries in order rendered as below, in the object store
  by its SHA-256 like everything else there; the problem's `notes_files` row names it (with its
  entry and character counts). Every append and every trim writes a new file and moves the row.

The file:

    # Notes: <problem name>

    _3 earlier entries are not shown and 2 are shortened, to keep the notes within budget; every
    entry is on the problem's page._

    ### #12 · 2026-12-07 01:02 UTC · gpt-oss-120b · attempt 1a2b3c4d
    <the entry's text, as written>

    ### #9 · 2026-12-07 00:40 UTC · qwen3-coder · attempt 5e6f7a8b · shortened
    <its first line, at most 160 characters>…

The budget is `notes_budget_chars`. An append never refuses for the file's size: the planner trims
the file back under the budget on its next tick (`services/planner/notes.py`, which says which
entries it keeps); until then `read_notes` gives the title and the newest entries that fit.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from shared.db.models import AttemptRow, NoteRow, NotesFileRow, ProblemRow, utcnow
from shared.errors import NotFoundError, UserError
from shared.runtime import Runtime
from shared.store import ObjectStore

log = logging.getLogger(__name__)

FULL, SHORT, DROPPED = "FULL", "SHORT", "DROPPED"
IN_FILE = (FULL, SHORT)
SHORT_CHARS = 160  # a shortened entry: its first line, cut to this
AUTHOR_CHARS = 255
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # all but tab and newline (\r is normalised first)


@dataclass(frozen=True)
class NotesFile:
    """The current file of a problem, as the web shows it."""

    text: str
    entries: int
    chars: int
    updated_at: datetime
    trimmed_at: datetime | None


@dataclass(frozen=True)
class NoteEntry:
    """One history entry, as the web shows it."""

    id: int
    author: str
    text: str
    attempt_id: str | None
    shown: str
    created_at: datetime


def check_note(text: str, max_chars: int) -> tuple[str, str | None]:
    """The text as it will be stored (line ends normalised, outer blank space stripped), and why it
    is refused (None when it is not): empty, longer than `max_chars`, or control characters."""
    clean = str(text).replace("\r\n", "\n").replace("\r", "\n").strip()
    if not clean:
        return clean, "note refused: it is empty; write what you tried, what you measured and what it showed"
    if len(clean) > max_chars:
        return clean, (f"note refused: {len(clean)} characters, the limit is {max_chars}; "
                       "keep the finding and its evidence, drop the rest")
    if _CONTROL.search(clean):
        return clean, "note refused: it holds control characters; write plain Markdown text"
    return clean, None


def append_note(runtime: Runtime, problem_id: int, author: str, text: str, *, attempt_id: str | None = None) -> str:
    """Append an entry to the problem's notes and rewrite its file; returns what the model is told:
    "noted (n entries, m chars)", or why the note was refused (nothing is recorded then). An
    `attempt_id` that is not the problem's is the caller's mistake, not the model's: `UserError`."""
    settings = runtime.settings
    clean, refused = check_note(text, settings.note_max_chars)
    if refused:
        return refused
    with runtime.db.session() as session:
        problem = lock_problem(session, problem_id)
        if attempt_id is not None:
            attempt_problem = session.scalar(select(AttemptRow.problem_id).where(AttemptRow.id == attempt_id))
            if attempt_problem != problem_id:
                raise UserError(f"attempt {attempt_id} is not an attempt of problem {problem_id}")
        session.add(NoteRow(problem_id=problem_id, author=(author or "unknown")[:AUTHOR_CHARS], text=clean,
                            attempt_id=attempt_id, shown=FULL, created_at=utcnow()))
        session.flush()
        row = rewrite_notes(session, runtime.store, problem)
        entries, chars = row.entries, row.chars
    told = f"noted ({entries} entr{'y' if entries == 1 else 'ies'}, {chars} chars)"
    if chars > settings.notes_budget_chars:
        told = told[:-1] + f"; over the {settings.notes_budget_chars}-char budget: the planner will shorten " \
                           "or drop the entries with the least evidence)"
    return told


def read_notes(runtime: Runtime, problem_id: int) -> str:
    """The problem's current notes Markdown, "" when it has none; never longer than
    `notes_budget_chars` (over it, until the planner trims: the title and the newest entries that
    fit). A file gone from the store is rendered again from its entries, as the file was."""
    budget = runtime.settings.notes_budget_chars
    with runtime.db.session() as session:
        row = session.get(NotesFileRow, problem_id)
        if row is None:
            return ""
        if row.chars > budget:
            return _newest_that_fit(session, problem_id, budget)
        digest = row.notes_hash
    try:
        return runtime.store.get(digest).decode()
    except NotFoundError:
        log.warning("problem=%s notes file %s is not in the store: rendered from the DB", problem_id, digest)
        with runtime.db.session() as session:
            return _newest_that_fit(session, problem_id, budget)


def lock_problem(session: Session, problem_id: int) -> ProblemRow:
    """The problem's row, locked until the session ends: appends and trims of one problem's notes
    run one at a time (SQLite: a write first takes the database's write lock)."""
    if session.get_bind().dialect.name == "sqlite":
        session.execute(update(ProblemRow).where(ProblemRow.id == problem_id).values(name=ProblemRow.name))
    problem = session.scalars(select(ProblemRow).where(ProblemRow.id == problem_id).with_for_update()
                              .execution_options(populate_existing=True)).first()
    if problem is None:
        raise NotFoundError(f"no problem {problem_id}")
    return problem


def count_entries(session: Session, problem_id: int) -> int:
    return session.scalar(select(func.count()).select_from(NoteRow).where(NoteRow.problem_id == problem_id))


def shown_entries(session: Session, problem_id: int) -> list[NoteRow]:
    """The entries the file shows (FULL or SHORT), oldest first."""
    return list(session.scalars(select(NoteRow).where(NoteRow.problem_id == problem_id, NoteRow.shown.in_(IN_FILE))
                                .order_by(NoteRow.id)))


def rewrite_notes(session: Session, store: ObjectStore, problem: ProblemRow, trimmed: bool = False) -> NotesFileRow:
    """Render the entries as they are `shown` now into a new file, put it in the store and point the
    problem's `notes_files` row at it. The caller holds `lock_problem`."""
    rows = shown_entries(session, problem.id)
    total = count_entries(session, problem.id)
    text = render_notes(problem.name, rows, total)
    digest = store.put(text.encode())
    now = utcnow()
    row = session.get(NotesFileRow, problem.id)
    if row is None:
        row = NotesFileRow(problem_id=problem.id)
        session.add(row)
    row.notes_hash, row.entries, row.chars, row.updated_at = digest, len(rows), len(text), now
    if trimmed:
        row.trimmed_at = now
    session.flush()
    return row


def render_notes(problem_name: str, rows: list[NoteRow], total: int) -> str:
    """The file: the title, a line on what trimming left out (when it did), the entries. `total`:
    the problem's entries in all, those the file does not show included."""
    shortened = sum(1 for r in rows if r.shown == SHORT)
    parts = [title(problem_name)]
    if total > len(rows) or shortened:
        parts.append(omitted_line(total - len(rows), shortened))
    parts += [render_entry(r, r.shown) for r in rows]
    return "\n".join(parts)


def title(problem_name: str) -> str:
    return f"# Notes: {problem_name}\n"


def omitted_line(hidden: int, shortened: int) -> str:
    """"_3 earlier entries are not shown and 2 are shortened, to keep ..._" (the parts that apply)."""
    said = [f"{hidden} earlier entr{'y is' if hidden == 1 else 'ies are'} not shown"] if hidden else []
    if shortened:
        said.append(f"{shortened} {'is' if shortened == 1 else 'are'} shortened" if said else
                    f"{shortened} entr{'y is' if shortened == 1 else 'ies are'} shortened")
    return f"_{' and '.join(said)}, to keep the notes within budget; every entry is on the problem's page._\n"


def render_entry(row: NoteRow, shown: str) -> str:
    """`### #id · time UTC · author[ · attempt xxxxxxxx][ · shortened]`, then the text (or its first line)."""
    head = f"### #{row.id} · {row.created_at:%Y-%m-%d %H:%M} UTC · {row.author}"
    if row.attempt_id:
        head += f" · attempt {row.attempt_id[:8]}"
    if shown == SHORT:
        return f"{head} · shortened\n{shorten(row.text)}\n"
    return f"{head}\n{row.text}\n"


def shorten(text: str) -> str:
    """The first line, cut to SHORT_CHARS; an ellipsis when anything was left out."""
    lines = text.strip().splitlines()
    first = lines[0].strip() if lines else ""
    if len(first) > SHORT_CHARS:
        return first[:SHORT_CHARS - 1] + "…"
    return first + ("…" if len(lines) > 1 else "")


def _newest_that_fit(session: Session, problem_id: int, budget: int) -> str:
    """An over-budget file, cut as `read_notes` gives it: the title, then the newest entries (as the
    file shows them) that fit, oldest of them first."""
    problem = session.get(ProblemRow, problem_id)
    rows = shown_entries(session, problem_id)
    head = title(problem.name)
    kept: list[str] = []
    used = len(head) + len(omitted_line(10**9, 10**9)) + 1
    for row in reversed(rows):
        entry = render_entry(row, row.shown)
        if used + len(entry) + 1 > budget:
            break
        kept.append(entry)
        used += len(entry) + 1
    total = count_entries(session, problem_id)
    shortened = sum(1 for r in rows[len(rows) - len(kept):] if r.shown == SHORT)
    parts = [head]
    if total > len(kept) or shortened:
        parts.append(omitted_line(total - len(kept), shortened))
    return "\n".join(parts + list(reversed(kept)))[:budget]  # [:budget]: a budget below the title's length


def notes_file(session: Session, store_get, problem_id: int) -> NotesFile | None:
    """The problem's current file, read with `store_get(digest) -> bytes`; None when it has none."""
    row = session.get(NotesFileRow, problem_id)
    if row is None:
        return None
    return NotesFile(store_get(row.notes_hash).decode(), row.entries, row.chars, row.updated_at, row.trimmed_at)


def note_history(session: Session, problem_id: int, limit: int | None = None) -> tuple[list[NoteEntry], int]:
    """The newest `limit` entries (all when None), newest first, and how many there are in all."""
    query = select(NoteRow).where(NoteRow.problem_id == problem_id).order_by(NoteRow.id.desc())
    if limit is not None:
        query = query.limit(limit)
    entries = [NoteEntry(r.id, r.author, r.text, r.attempt_id, r.shown, r.created_at) for r in session.scalars(query)]
    total = count_entries(session, problem_id)
    return entries, total
