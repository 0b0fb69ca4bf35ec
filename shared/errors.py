"""Infrastructure errors. A bad kernel is data (a status), never one of these."""

from __future__ import annotations


class KernelSwarmError(Exception):
    """Base of every error the project raises on purpose."""

    http_status = 500


class UserError(KernelSwarmError):
    """Bad input from a user: shown to them as is, HTTP 400."""

    http_status = 400


class FormatError(UserError):
    """A problem, workload, solution or trace file that does not follow the schema."""


class NotFoundError(UserError):
    http_status = 404


class RetryableError(KernelSwarmError):
    """A fault that may pass (Redis, object store, LLM rate limit): tasks retry with backoff."""

    http_status = 503


class StoreError(RetryableError):
    """The object store failed to read or write."""


class EvaluatorFault(RetryableError):
    """The evaluator could not judge an attempt for a fault of its own machine (a full disk, a file
    size limit, no file descriptors left): retried later or elsewhere, never a verdict charged to
    the solution, its writer or the problem."""


class DatabaseFault(RetryableError):
    """The DB refused a read or a write for a fault of its own (a disk I/O error, a lost connection,
    a lock held too long): the task is retried, the attempt never lost (issue 40, H3)."""


class EndpointError(KernelSwarmError):
    """The LLM endpoint refuses the writer for good, whatever is retried: `kind` is `auth` (401,
    403: a wrong key), `model` (404: no such model), `quota` (429 insufficient_quota: the account
    is out of credit), `request` (another 400: the request itself is wrong) or `context` (the
    protocol, brief and last turn alone exceed the model's context). A setting has to change."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class EndpointUnavailable(RetryableError):
    """The LLM endpoint is there but cannot answer now: `kind` is `rate_limit` (429), `server`
    (5xx), `unreachable` (no connection) or `timeout` (no byte within the read timeout)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
