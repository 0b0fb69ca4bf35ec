"""A candidate's private view of the file systems (`confine.confine` takes it, between fork and
exec, where the evaluator can give it a mount namespace; `isolation.candidate_view` says what it holds).

In a mount namespace of its own, /tmp and /dev/shm are empty tmpfs of its own (where the scratch
folders of every attempt and spare live), the swarm's own data (`hidden`: the evaluator's home
with the DB, the store and the logs) under empty ones too, the folders it is given are bound back
in, /proc is mounted afresh where the child has a PID namespace of its own (it lists only that
namespace's processes), and every mount is made read-only but its own folders: so it can write
neither the code it runs, nor the evaluator's files, nor another attempt's folder, which it does
not even see, and reads neither the DB, the store nor the logs. `private_view` and what it calls
run in the forked child before exec: no imports, no locks.
"""

from __future__ import annotations

import ctypes
import os

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x1, 0x2, 0x4, 0x8, 0x20, 0x1000, 0x4000, 0x40000
SCRATCH_MOUNTS = (b"/tmp", b"/dev/shm")  # shared scratch space: private and empty in a candidate's view
PROC = b"/proc"
MOUNT_SETATTR_SYSCALL = 442  # Linux 5.12 and later; the same number on x86_64 and aarch64
AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = -100, 0x8000, 0x1
# A bind mount's flags a read-only remount must keep (in a user namespace the kernel refuses to
# clear them): statvfs's ST_* bit -> mount's MS_* bit.
KEPT_MOUNT_FLAGS = {0x2: 0x2, 0x4: 0x4, 0x8: 0x8, 0x400: 0x400, 0x800: 0x800, 0x1000: 0x200000}


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


def encoded_view(view) -> tuple[tuple[bytes, bool | None], ...]:
    """`isolation.candidate_view`'s entries with their paths as bytes, as `private_view` takes them
    (True: writable, False: read-only, None: hidden)."""
    return tuple((os.fsencode(path), None if writable is None else bool(writable)) for path, writable in view)


def private_view(view: tuple[tuple[bytes, bool | None], ...], lib: ctypes.CDLL, fresh_proc: bool = False) -> bool:
    """In a mount namespace of its own (changes stay in it): /tmp and /dev/shm empty tmpfs of its
    own (where the scratch folders of every attempt and spare live), the folders `view` hides
    (None: the swarm's own data) covered with empty ones (a file with /dev/null), then `view`'s
    other folders bound back in at their paths, in order (a scratch mount `view` names writable
    is not covered: it stays the real one, shared); with `fresh_proc` (the caller is the init of a
    PID namespace of its own) a new /proc that shows only that namespace's processes; then every
    mount read-only, recursively (`mount_setattr`), but the private /tmp and /dev/shm themselves
    and the folders of `view` marked writable (with what lies below them, but the read-only ones,
    which are made so again; /proc marked writable: only the entries of processes,
    `_per_process_proc`). So it can write neither the code it runs, nor the evaluator's files, nor
    another attempt's folder (which it does not even see), and reads neither the DB, the store nor
    the logs; device nodes it still can write (a read-only mount does not stop writes to them: the
    GPU works)."""
    if lib.unshare(CLONE_NEWNS) != 0 or lib.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return False
    shared = {path for path, writable in view if writable and path in (*SCRATCH_MOUNTS, PROC)}  # kept as they are
    try:  # held before anything covers them
        kept = [(path, writable, os.open(path, os.O_PATH | os.O_DIRECTORY)) for path, writable in view
                if path not in shared and writable is not None]
    except OSError:
        return False
    scratch = [p for p in SCRATCH_MOUNTS if os.path.isdir(p) and p not in shared]
    for path in scratch:
        if lib.mount(b"tmpfs", path, b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=1777") != 0:
            return False
    if not all(_cover(path, lib) for path, writable in view if writable is None):
        return False
    for path, _writable, fd in kept:
        os.makedirs(path, exist_ok=True)  # inside a private tmpfs; elsewhere it is there already
        bound = lib.mount(b"/proc/self/fd/%d" % fd, path, None, MS_BIND | MS_REC, None)
        os.close(fd)
        if bound != 0:
            return False
    if fresh_proc and lib.mount(b"proc", PROC, b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) != 0:
        os.write(2, b"kernelswarm sandbox: no fresh /proc here; it lists the processes outside its namespace\n")
    if not (_set_read_only(b"/", True, lib) and all(_set_read_only(p, False, lib, recursive=False) for p in scratch)
            and all(_set_read_only(p, False, lib) for p, writable in view if writable and p != PROC)
            and all(_set_read_only(p, True, lib, recursive=False) for p, writable in view if writable is False)
            and (PROC not in shared or _per_process_proc(lib))):
        return False
    # Its working directory (entered before this, by Popen or the fork server) is still the folder
    # under the bind: entered again by name, it is the one bound on top. A working directory that
    # the view does not hold (a caller's under /tmp, now an empty tmpfs) becomes the root.
    try:
        os.chdir(os.getcwd())
    except OSError:
        os.chdir(b"/")
    return True


def _cover(path: bytes, lib: ctypes.CDLL) -> bool:
    """`path` hidden: a folder under an empty tmpfs (read-only with the rest), a file under /dev/null;
    nothing to do where it is not there (below a scratch mount already covered, say)."""
    if os.path.isdir(path):
        return lib.mount(b"tmpfs", path, b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, b"mode=0755,size=64k") == 0
    if os.path.isfile(path):
        return lib.mount(b"/dev/null", path, None, MS_BIND, None) == 0
    return True


def _per_process_proc(lib: ctypes.CDLL) -> bool:
    """/proc's own mount writable again, for the entries of processes (/proc/<pid>, where the
    kernel's per-process rules decide who may write what: CUDA's driver writes to its own at
    cuInit), but every other entry (/proc/sys, /proc/sysrq-trigger, /proc/driver, ...) bound onto
    itself read-only. Symbolic links (self, mounts, net, ...) lead into a process's entries."""
    if not _set_read_only(PROC, False, lib, recursive=False):
        return False
    for name in os.listdir(PROC):
        path = PROC + b"/" + name
        if name.isdigit() or os.path.islink(path):
            continue
        if lib.mount(path, path, None, MS_BIND | MS_REC, None) != 0 or not _set_read_only(path, True, lib):
            return False
    return True


def _set_read_only(path: bytes, read_only: bool, lib: ctypes.CDLL, recursive: bool = True) -> bool:
    """`path`'s mount (and every mount below it, `recursive`) made read-only, or writable again: in
    one call (`mount_setattr`, Linux 5.12), else (an older kernel, or a seccomp filter that does
    not know the call) one remount per mount."""
    attr = _MountAttr(MOUNT_ATTR_RDONLY if read_only else 0, 0 if read_only else MOUNT_ATTR_RDONLY, 0, 0)
    flags = AT_RECURSIVE if recursive else 0
    if lib.syscall(ctypes.c_long(MOUNT_SETATTR_SYSCALL), ctypes.c_int(AT_FDCWD), path, ctypes.c_uint(flags),
                   ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr))) == 0:
        return True
    below = path.rstrip(b"/") + b"/"
    mounts = [m for m in _mount_points() if m == path or (recursive and m.startswith(below))]
    change = MS_BIND | MS_REMOUNT | (MS_RDONLY if read_only else 0)
    return bool(mounts) and all(lib.mount(None, m, None, change | _kept_flags(m), None) == 0 for m in mounts)


def _mount_points() -> list[bytes]:
    """This mount namespace's mount points, from /proc/self/mountinfo (read without imports: it
    runs between fork and exec)."""
    fd = os.open(b"/proc/self/mountinfo", os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    points = []
    for line in b"".join(chunks).split(b"\n"):
        fields = line.split(b" ")
        if len(fields) > 4:
            points.append(_unescaped(fields[4]))
    return points


def _unescaped(field: bytes) -> bytes:
    """A mountinfo path with its octal escapes (\\040 for a space, ...) turned back into bytes."""
    out, k = bytearray(), 0
    while k < len(field):
        if field[k] == 0x5C and k + 3 < len(field) and field[k + 1:k + 4].isdigit():
            out.append(int(field[k + 1:k + 4], 8))
            k += 4
        else:
            out.append(field[k])
            k += 1
    return bytes(out)


def _kept_flags(path: bytes) -> int:
    """The mount flags of `path`'s mount that a remount must keep (`KEPT_MOUNT_FLAGS`)."""
    try:
        have = os.statvfs(path).f_flag
    except OSError:
        return 0
    return sum(ms for st, ms in KEPT_MOUNT_FLAGS.items() if have & st)
