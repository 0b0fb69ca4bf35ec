"""`shared.logs`: the console handler writes to the stream it started with until that is closed,
then to the `sys.stderr` of the moment."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator

import pytest

from shared.logs import configure_logging


@pytest.fixture
def fresh_root() -> Iterator[logging.Logger]:
    """The root logger without the handler an earlier test's `configure_logging` left, restored after."""
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    for handler in before:
        if getattr(handler, "_kernelswarm", False):
            root.removeHandler(handler)
    yield root
    for handler in root.handlers[:]:
        root.removeHandler(handler)
    for handler in before:
        root.addHandler(handler)
    root.setLevel(level)


def test_a_line_goes_to_the_current_stderr_after_the_first_was_closed(fresh_root, monkeypatch) -> None:
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    configure_logging("INFO")
    first.close()  # what pytest does to a captured stream once its test ends
    monkeypatch.setattr(sys, "stderr", second)
    logging.getLogger("kernelswarm.test").info("after the first stream closed")
    written = second.getvalue()
    assert "Logging error" not in written  # logging's complaint about the closed stream quotes the message
    assert written.rstrip().endswith("INFO kernelswarm.test: after the first stream closed")


def test_a_line_logged_in_a_celery_worker_reaches_the_stream_it_started_with(fresh_root, monkeypatch) -> None:
    """A Celery worker redirects `sys.stderr` to a proxy that logs what is written to it: a handler
    writing to the proxy would lose every line (the proxy drops what comes back to it), and the
    services' logs would hold only Celery's banner."""
    from celery.utils.log import LoggingProxy

    started = io.StringIO()
    monkeypatch.setattr(sys, "stderr", started)
    configure_logging("INFO")
    monkeypatch.setattr(sys, "stderr", LoggingProxy(logging.getLogger("celery.redirected"), logging.WARNING))
    logging.getLogger("kernelswarm.test").info("the broker restarted")
    assert started.getvalue().rstrip().endswith("INFO kernelswarm.test: the broker restarted")
