"""The signal and timer guard (`services/evaluator/harness/signal_guard.py`) in this process: what it finds
after a call, what it allows at import. Each test restores the signal state it changed."""

from __future__ import annotations

import ctypes
import os
import signal
import threading
from collections.abc import Iterator

import pytest

from services.evaluator.harness.signal_guard import SignalWatch

LIBC = ctypes.CDLL(None, use_errno=True)


@pytest.fixture
def watch() -> Iterator[SignalWatch]:
    saved = {n: signal.getsignal(n) for n in (signal.SIGALRM, signal.SIGUSR1, signal.SIGUSR2)}
    yield SignalWatch()
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.alarm(0)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
    for number, handler in saved.items():
        signal.signal(number, handler)


def _nothing(*unused) -> None:
    pass


def test_a_clean_process_has_no_finding(watch: SignalWatch) -> None:
    assert watch.check_call() is None and watch.check() is None and watch.after_import() is None


def test_an_armed_interval_timer_is_found(watch: SignalWatch) -> None:
    signal.signal(signal.SIGALRM, _nothing)
    watch.rebase()  # the handler as if installed at import
    signal.setitimer(signal.ITIMER_REAL, 5.0)
    assert "ITIMER_REAL" in watch.check_call()
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.alarm(5)
    assert "ITIMER_REAL" in watch.check_call() and "ITIMER_REAL" in watch.check()
    signal.alarm(0)
    signal.setitimer(signal.ITIMER_PROF, 5.0)
    assert "ITIMER_PROF" in watch.check_call()
    signal.setitimer(signal.ITIMER_PROF, 0)
    assert watch.check_call() is None


def test_a_handler_installed_during_a_call_is_found_and_one_at_import_is_not(watch: SignalWatch) -> None:
    signal.signal(signal.SIGUSR2, _nothing)
    assert "SIGUSR2" in watch.check()
    assert watch.check_call() is None  # the part inside the timed call reads only what could fire later
    assert watch.after_import() is None  # at import: allowed, and the base from now on
    assert watch.check() is None
    signal.signal(signal.SIGUSR2, lambda *unused: None)  # the same signal, another Python handler
    assert "SIGUSR2" in watch.check()


def test_a_handler_for_a_timers_signal_installed_at_import_is_found(watch: SignalWatch) -> None:
    signal.signal(signal.SIGALRM, signal.SIG_IGN)  # runs no code: allowed
    assert watch.after_import() is None
    signal.signal(signal.SIGALRM, _nothing)
    assert "handler for SIGALRM at its import" in watch.after_import()


def test_a_native_handler_for_a_timers_signal_installed_at_import_is_found(watch: SignalWatch) -> None:
    handler = ctypes.CFUNCTYPE(None, ctypes.c_int)(lambda number: None)
    action = ctypes.create_string_buffer(256)
    ctypes.memmove(action, ctypes.byref(ctypes.c_void_p(ctypes.cast(handler, ctypes.c_void_p).value)), 8)
    assert LIBC.sigaction(signal.SIGALRM, action, None) == 0
    assert "native handler for SIGALRM at its import" in watch.after_import()


def test_a_native_sigaction_is_found(watch: SignalWatch) -> None:
    handler = ctypes.CFUNCTYPE(None, ctypes.c_int)(lambda number: None)
    action = ctypes.create_string_buffer(256)
    ctypes.memmove(action, ctypes.byref(ctypes.c_void_p(ctypes.cast(handler, ctypes.c_void_p).value)), 8)
    assert LIBC.sigaction(signal.SIGUSR2, action, None) == 0  # a signal nothing caught: the mask shows it
    assert "caught" in watch.check() and "SIGUSR2" in watch.check()
    signal.signal(signal.SIGUSR1, _nothing)
    watch.rebase()
    assert LIBC.sigaction(signal.SIGUSR1, action, None) == 0  # one already caught: only its address changes
    assert "native handler of SIGUSR1" in watch.check()


def test_a_cpu_time_limit_set_during_a_call_is_found(watch: SignalWatch) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    resource.setrlimit(resource.RLIMIT_CPU, (int(time_used_s()) + 3600, hard))
    try:
        assert "RLIMIT_CPU" in watch.check_call() and "RLIMIT_CPU" in watch.check()
    finally:
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    assert watch.check_call() is None


def time_used_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def test_a_pending_signal_is_found(watch: SignalWatch) -> None:
    signal.signal(signal.SIGUSR1, _nothing)
    watch.rebase()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
    assert "SIGUSR1" in watch.check_call() and "pending" in watch.check()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})  # delivered now, to _nothing
    assert watch.check_call() is None


class _Sigevent(ctypes.Structure):
    _fields_ = [("value", ctypes.c_void_p), ("signo", ctypes.c_int), ("notify", ctypes.c_int),
                ("pad", ctypes.c_byte * 48)]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


@pytest.mark.skipif(not os.path.exists("/proc/self/timers"), reason="no /proc/self/timers on this kernel")
def test_a_posix_timer_created_or_armed_is_found(watch: SignalWatch) -> None:
    signal.signal(signal.SIGUSR1, _nothing)  # not a timer's own signal: its handler at import is allowed
    timer = ctypes.c_void_p()
    assert LIBC.timer_create(1, ctypes.byref(_Sigevent(None, signal.SIGUSR1, 0)), ctypes.byref(timer)) == 0
    try:
        assert "created POSIX timers" in watch.check_call()
        assert watch.after_import() is None  # created at import, unarmed: allowed
        assert watch.check_call() is None
        assert LIBC.timer_settime(timer, 0, ctypes.byref(_Itimerspec(_Timespec(0, 0), _Timespec(5, 0))), None) == 0
        assert "armed" in watch.check_call()
        assert watch.after_import() is not None  # armed at import: a finding too
    finally:
        LIBC.timer_delete(timer)


@pytest.mark.parametrize("which", ["_timers", "_status"])
def test_its_view_of_the_process_taken_away_is_a_finding(watch: SignalWatch, which: str) -> None:
    view = getattr(watch, which)
    if view.fd is None:
        pytest.skip(f"no {which[1:]} file in /proc here")
    fd = view.fd
    os.close(fd)
    replacement = os.open("/dev/null", os.O_RDONLY)  # the lowest free number: the one just closed
    try:
        assert replacement == fd
        assert "closed or replaced" in watch.check()
        if which == "_timers":  # the file the part inside the timed call reads
            assert "closed or replaced" in watch.check_call()
    finally:
        os.close(replacement)
        view.fd = None
