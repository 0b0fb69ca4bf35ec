"""Werkzeug's server for the web app when `kernelswarm up` serves it (and the browser tests), with a
`Server` header that names no software version. Its default says `Werkzeug/<version>
Python/<version>`, which tells an attacker what to look up. gunicorn, which serves the app in
docker compose, sends `Server: gunicorn` with no version (since 20.1.0; the image pins 23.0.0).
`flask run` still says Werkzeug and Python: it is for development only."""

from __future__ import annotations

from flask import Flask
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler
from werkzeug.serving import make_server as werkzeug_make_server

SERVER_HEADER = "KernelSwarm"


class RequestHandler(WSGIRequestHandler):
    def version_string(self) -> str:
        return SERVER_HEADER


def make_server(host: str, port: int, app: Flask) -> BaseWSGIServer:
    """A threaded server on (host, port); port 0 takes a free one."""
    return werkzeug_make_server(host, port, app, threaded=True, request_handler=RequestHandler)
