"""`protocol.send_with_fds` / `receive_with_fds`: a line and the descriptors it announces, more
than one `sendmsg` carries (the checker's output files of a workload with many timed sets)."""

from __future__ import annotations

import json
import os
import socket

from services.evaluator.protocol import FDS_PER_MESSAGE, receive_with_fds, send_with_fds


def test_a_line_brings_every_descriptor_it_announces_in_order(tmp_path):
    count = 2 * FDS_PER_MESSAGE + 7
    paths = [tmp_path / f"f{i}" for i in range(count)]
    for i, path in enumerate(paths):
        path.write_bytes(str(i).encode())
    fds = [os.open(path, os.O_RDONLY) for path in paths]
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        send_with_fds(ours, {"op": "check", "files": list(range(count))}, fds)
        send_with_fds(ours, {"op": "quit"}, [])
        line, got = receive_with_fds(theirs, 1 << 20, lambda text: len(json.loads(text)["files"]))
        assert line.endswith(b"\n") and len(got) == count
        assert [os.pread(fd, 16, 0).decode() for fd in got] == [str(i) for i in range(count)]
        for fd in got:
            os.close(fd)
        line, got = receive_with_fds(theirs, 1 << 20, lambda text: 0)
        assert line == b'{"op": "quit"}\n' and got == []
        ours.close()
        assert receive_with_fds(theirs, 1 << 20, lambda text: 0) == (b"", [])
    finally:
        for fd in fds:
            os.close(fd)
        theirs.close()
