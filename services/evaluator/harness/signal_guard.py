"""The signal and timer guard of the candidate's child (part of `guards.Guard`): no work may be left
to run after a call returns, out of its timer's sight, through a signal.

A solution could return at once and do its work in a signal handler that fires after the timer's
end reading (an interval timer, `alarm`, a POSIX timer, a signal left pending). This guard reads
the process's state, not the Python calls that change it, so that the same calls made natively
(`sigaction`, `setitimer`, `alarm`, `timer_create` through ctypes) are seen too:

- the handlers: the kernel's mask of caught signals (`SigCgt` in /proc/self/status: a native
  `sigaction` shows there; a signal ignored or set to its default runs no code and is allowed),
  Python's handlers (`signal.getsignal`), and, outside the timed region, every signal's native handler address (libc's `sigaction` queried, nothing set);
- the interval timers (`signal.getitimer`: ITIMER_REAL, which `alarm` also arms, ITIMER_VIRTUAL,
  ITIMER_PROF), the POSIX timers (listed in /proc/self/timers; each read with the
  `timer_gettime` system call), the CPU-time limit (`RLIMIT_CPU`, whose SIGXCPU is a timer too),
  and the pending signals (`signal.sigpending`; `SigPnd` and `ShdPnd`).

Findings: after the solution's import, an armed timer, a pending signal, or a handler of its own
for a timer's signal (SIGALRM, SIGVTALRM, SIGPROF; other handlers installed at import are allowed:
honest libraries install some; `rebase` takes the state then); after a call,
a handler installed or changed, a POSIX timer created, any timer armed, the CPU-time limit
changed, any signal pending. `check_call` is the cheap part, run right after every timed call's
end reading (`Guard.check_after_call`): the timers, the limit and the pending signals (about 4 us
on the 2-core CPU VM alone, up to 100 us right after a parallel torch kernel). `check` adds the
handlers (the masks, Python's, every native one: about 0.1 ms) and runs between calls and after
the timed batch, before `end`; so a handler installed during a timed call is found before `end`.

The C library's own real-time signals (32 and 33: thread cancellation and set*id) are left out of
the masks: glibc installs their handlers when the first thread starts, which an honest first call
may do. Where /proc is missing, the masks and POSIX timers are not seen (the itimers, Python's
handlers and pending signals still are).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import resource
import signal

_ITIMERS = (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF)
_ITIMER_NAMES = ("ITIMER_REAL (signal.setitimer or alarm)", "ITIMER_VIRTUAL", "ITIMER_PROF")
_LIBC_OWN = (1 << 31) | (1 << 32)  # signals 32 and 33 in SigCgt's bit numbering (signal n is bit n - 1)
_TIMER_GETTIME = {"x86_64": 224, "aarch64": 108}  # the system call's number
_SIGNALS = range(1, 65)
_TIMER_SIGNALS = (int(signal.SIGALRM), int(signal.SIGVTALRM), int(signal.SIGPROF))
_SIGACTION_BYTES = 256  # more than glibc's struct sigaction; its first field is the handler


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class _ProcFile:
    """A /proc file of this process, opened once (before the solution loads) and read again with
    `pread`; `read` returns None where it was never there, and raises `Tampered` where the
    descriptor no longer names the same file (closed and reused by the solution)."""

    def __init__(self, path: str) -> None:
        self._pread, self._fstat = os.pread, os.fstat
        try:
            self.fd: int | None = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            stat = os.fstat(self.fd)
            self._identity = (stat.st_dev, stat.st_ino)
        except OSError:
            self.fd = None

    def read(self) -> bytes | None:
        if self.fd is None:
            return None
        try:
            stat = self._fstat(self.fd)
            if (stat.st_dev, stat.st_ino) != self._identity:
                raise Tampered
            return self._pread(self.fd, 16384, 0)
        except OSError:
            raise Tampered from None


class Tampered(Exception):
    """The guard's own view of the process was taken away."""


def _status_masks(text: bytes | None) -> dict[str, int]:
    """SigCgt, SigIgn, SigPnd and ShdPnd from /proc/self/status; {} where unreadable."""
    found: dict[str, int] = {}
    if text is None:
        return found
    for key in _MASKS:
        at = text.find(key)
        if at >= 0:
            found[key[:-1].decode()] = int(text[at + len(key):text.find(b"\n", at)], 16)
    return found


_MASKS = (b"SigCgt:", b"SigIgn:", b"SigPnd:", b"ShdPnd:")


def _timer_ids(text: bytes | None) -> frozenset[int]:
    if not text:
        return frozenset()
    return frozenset(int(line.split()[1]) for line in text.split(b"\n") if line.startswith(b"ID:"))


def _names(mask: int) -> str:
    numbers = [n for n in _SIGNALS if mask >> (n - 1) & 1]
    return ", ".join(_signal_name(n) for n in numbers)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


class SignalWatch:
    """Built before the solution loads (what it calls is bound then); `rebase` after its import."""

    def __init__(self) -> None:
        self._getitimer, self._getsignal, self._sigpending = signal.getitimer, signal.getsignal, signal.sigpending
        self._getrlimit = resource.getrlimit
        self._cpu_limit = resource.getrlimit(resource.RLIMIT_CPU)  # never rebased: a CPU-time limit is a timer
        self._status, self._timers = _ProcFile("/proc/self/status"), _ProcFile("/proc/self/timers")
        libc = _libc()
        number = _TIMER_GETTIME.get(platform.machine())
        self._syscall = libc.syscall if libc is not None and number is not None else None
        self._timer_gettime = number
        self._sigaction = libc.sigaction if libc is not None else None
        self._spec = _Itimerspec()
        self._action = ctypes.create_string_buffer(_SIGACTION_BYTES)
        self._masks: dict[str, int] = {}
        self._handlers: dict[int, object] = {}
        self._native: dict[int, int] = {}
        self._timer_set: frozenset[int] = frozenset()
        self.rebase()

    def rebase(self) -> None:
        """The state to compare with: taken before the solution loads and again after its import."""
        self._masks = _status_masks(self._status.read())
        self._handlers = self._python_handlers()
        self._native = self._native_handlers()
        self._timer_set = _timer_ids(self._timers.read())

    def after_import(self) -> str | None:
        """After the solution's import: no timer armed, no signal pending, no handler of its own for a
        timer's signal; then its handlers are the base."""
        try:
            found = self._armed_or_pending("its import") or self._timer_handlers()
        except Tampered:
            return _TAMPERED
        if found is None:
            self.rebase()
        return found

    def _timer_handlers(self) -> str | None:
        """A handler the solution's import installed for SIGALRM, SIGVTALRM or SIGPROF (Python's, or a
        native one outside an installed library's code). Those signals only ever report a timer, and
        a handler for one, armed later in a call, is how work runs after the timer's end reading. The
        armed timer is found inside the call (`check_call`) unless it fires first: then a native
        handler runs in whichever thread the kernel picks, and can wait there for the interpreter
        lock until after the end reading (on CI, 2026-12-06: the outer clock charged the workloads
        and the handler, calling torch from a signal, hung the child). So the handler itself is the
        finding, before any call."""
        native = self._native_handlers()
        library = self._library_handlers(native)
        caught = _status_masks(self._status.read()).get("SigCgt", 0)
        for number in _TIMER_SIGNALS:
            bit = 1 << (number - 1)
            python = self._getsignal(number)
            if callable(python) and python is not self._handlers.get(number):
                return (f"the solution installed a handler for {_signal_name(number)} at its import (signal.signal): "
                        f"a timer's signal runs no solution code (no work outside the call)")
            newly = "SigCgt" in self._masks and caught & bit and not self._masks["SigCgt"] & bit
            replaced = native.get(number, 0) > 1 and self._native.get(number) != native.get(number)
            if (newly or replaced) and not library & bit:
                return (f"the solution installed a native handler for {_signal_name(number)} at its import "
                        f"(sigaction): a timer's signal runs no solution code (no work outside the call)")
        return None

    def check_call(self) -> str | None:
        """Right after every timed call's end reading: what could run work after it (timers armed,
        signals pending). A handler installed in the call is found by `check`,
        at the latest after the timed batch and before its `end`."""
        try:
            return self._armed_or_pending("a call")
        except Tampered:
            return _TAMPERED

    def check(self) -> str | None:
        """Between calls and after the timed batch (before `end`): everything `check_call` reads,
        the masks of caught and ignored signals, Python's handlers, every signal's native handler."""
        try:
            return self._armed_or_pending("a call") or self._handlers_kept() or self._pending_in_status()
        except Tampered:
            return _TAMPERED

    def _armed_or_pending(self, after: str) -> str | None:
        for which, name in zip(_ITIMERS, _ITIMER_NAMES):
            if self._getitimer(which) != (0.0, 0.0):
                return (f"the solution left the interval timer {name} armed after {after}: a signal would run "
                        f"its handler after the timer's end reading (no work outside the call)")
        timers = _timer_ids(self._timers.read())
        created = timers - self._timer_set
        if created and after != "its import":
            return (f"the solution created POSIX timers {sorted(created)} (timer_create) during {after}: a signal "
                    f"could run its handler after the timer's end reading (no work outside the call)")
        armed = [t for t in sorted(timers) if self._timer_armed(t)]
        if armed:
            return (f"the solution left POSIX timers {armed} armed after {after} (timer_settime): a signal would "
                    f"run its handler after the timer's end reading (no work outside the call)")
        if self._getrlimit(resource.RLIMIT_CPU) != self._cpu_limit:
            return (f"the solution changed its CPU-time limit (RLIMIT_CPU) by {after}: SIGXCPU would run a handler "
                    f"when it is reached, after the timer's end reading (no work outside the call)")
        pending = self._sigpending()
        if pending:
            names = ", ".join(_signal_name(int(s)) for s in sorted(pending))
            return (f"the solution left signals pending after {after} ({names}): their handlers would run after "
                    f"the timer's end reading (no work outside the call)")
        return None

    def _timer_armed(self, timer: int) -> bool:
        if self._syscall is None:
            return False
        if self._syscall(self._timer_gettime, ctypes.c_int(timer), ctypes.byref(self._spec)) != 0:
            return False  # deleted since it was listed
        value = self._spec.it_value
        return value.tv_sec != 0 or value.tv_nsec != 0

    def _handlers_kept(self) -> str | None:
        masks = _status_masks(self._status.read())
        native = self._native_handlers()
        library = self._library_handlers(native)
        # Only the caught mask: a signal ignored (SIG_IGN) or left to its default runs no code; the
        # same LLVM sets SIGXFSZ to be ignored in an honest Triton call (H100, 2026-12-05). Signals
        # now caught by an installed library's own handler (`library`) are allowed.
        if "SigCgt" in self._masks:
            changed = (masks.get("SigCgt", 0) ^ self._masks["SigCgt"]) & ~_LIBC_OWN & ~library
            if changed:
                return (f"the solution changed which signals this process caught during a call ({_names(changed)}; "
                        f"a native sigaction or signal.signal): a handler could run after the timer's end reading "
                        f"(no work outside the call)")
        for number, handler in self._handlers.items():
            now = self._getsignal(number)
            if now is not handler and callable(now):  # SIG_IGN and SIG_DFL run no code
                return (f"the solution installed a handler for {_signal_name(number)} during a call "
                        f"(signal.signal): it could run after the timer's end reading (no work outside the call)")
        for number, address in native.items():
            if self._native.get(number, address) != address and address > 1 and not library & (1 << (number - 1)):
                return (f"the solution replaced the native handler of {_signal_name(number)} during a call "
                        f"(sigaction): it could run after the timer's end reading (no work outside the call)")
        if library:  # the library's handlers are the base from now on
            self._native.update({n: a for n, a in native.items() if library & (1 << (n - 1))})
            if "SigCgt" in self._masks:
                self._masks["SigCgt"] = (self._masks["SigCgt"] & ~library) | (masks.get("SigCgt", 0) & library)
        return None

    def _library_handlers(self, native: dict[int, int]) -> int:
        """The signals (a SigCgt-style mask) whose native handler changed since the base to code of an
        installed library: an executable mapping of a file under the interpreter's own folders or the
        system's library folders, outside every folder the solution can write (its working folder,
        the temporary folder, its home). LLVM, which Triton links, installs crash handlers for
        SIGHUP, SIGQUIT, SIGUSR1/2, SIGTERM, SIGXCPU, SIGXFSZ and SIGSYS the first time a kernel
        compiles, inside an honest first call. A handler in anonymous memory (a ctypes callback) or
        in a file the solution could have written is not one; Python's own handler (signal.signal)
        is judged by `signal.getsignal` above."""
        changed = {n: a for n, a in native.items() if self._native.get(n, a) != a and a > 1}
        if not changed:
            return 0
        spans = _library_spans()
        mask = 0
        for number, address in changed.items():
            if any(low <= address < high for low, high in spans):
                mask |= 1 << (number - 1)
        return mask

    def _pending_in_status(self) -> str | None:
        masks = _status_masks(self._status.read())
        pending = (masks.get("SigPnd", 0) | masks.get("ShdPnd", 0)) & ~_LIBC_OWN
        if pending:
            return (f"the solution left signals pending ({_names(pending)}): their handlers would run after the "
                    f"timer's end reading (no work outside the call)")
        return None

    def _python_handlers(self) -> dict[int, object]:
        """Python's handler of every signal it can name (`signal.getsignal`; outside the timed region)."""
        found: dict[int, object] = {}
        for number in signal.valid_signals():
            try:
                found[int(number)] = self._getsignal(number)
            except (OSError, ValueError):
                continue
        return found

    def _native_handlers(self) -> dict[int, int]:
        """Every signal's native handler address (libc's sigaction, queried with no new action)."""
        found: dict[int, int] = {}
        if self._sigaction is None:
            return found
        for number in _SIGNALS:
            if number in (32, 33):
                continue
            if self._sigaction(number, None, self._action) == 0:
                found[number] = int.from_bytes(self._action.raw[:ctypes.sizeof(ctypes.c_void_p)], "little")
        return found


def _library_spans() -> list[tuple[int, int]]:
    """Address ranges of executable, not writable mappings of installed libraries' files
    (/proc/self/maps; see `SignalWatch._library_handlers`)."""
    import sys
    import sysconfig
    import tempfile

    roots = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                           *(sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib",
                                                                                   "purelib", "platlib")),
                                           "/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/local/lib") if p}
    writable = {os.path.realpath(p) for p in (os.getcwd(), tempfile.gettempdir(), os.path.expanduser("~"))}

    def under(path: str, folders: set[str]) -> bool:
        return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)

    spans = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                parts = line.split(None, 5)
                if len(parts) < 6 or "x" not in parts[1] or "w" in parts[1]:
                    continue
                path = os.path.realpath(parts[5].strip())
                if not path.startswith("/") or not under(path, roots) or under(path, writable):
                    continue
                low, high = (int(x, 16) for x in parts[0].split("-"))
                spans.append((low, high))
    except OSError:
        return []
    return spans


_TAMPERED = ("the solution closed or replaced the descriptors the guard reads this process's signal state "
             "through (/proc/self/status, /proc/self/timers)")
