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
