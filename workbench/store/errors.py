"""Errors raised by the run store.

Every error is a `StoreError`, carries a one-line message that names the path or the field at fault
and says what to do, and is raised before anything half-written is left behind.
"""

from __future__ import annotations


class StoreError(Exception):
    """Base class of every run-store error."""


class RunsDirError(StoreError):
    """The runs directory cannot hold a new run (not a directory, not writable)."""


class StorageError(StoreError):
    """The file system refused a write to a run (disk full, read-only, I/O error); what was stored before is kept.

    `reason` is the cause alone (e.g. "the disk is full (...)"), for callers that word their own message.
    """

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message


class RunExistsError(StoreError):
    """A run with the requested id already exists."""


class RunNotFoundError(StoreError):
    """The run directory (or its database) does not exist."""


class NotARunStoreError(StoreError):
    """The file is not a SQLite database, or not one written by the run store."""


class CorruptStoreError(StoreError):
    """SQLite reports the database as damaged."""


class WriterLockedError(StoreError):
    """Another writer holds the run open."""


class SchemaVersionError(StoreError):
    """The database's schema version is not one this code can read."""


class ReadOnlyStoreError(StoreError):
    """A write was attempted through a read-only reader."""


class StepError(StoreError):
    """A step was used out of order: nested, reused, closed, or pointing at another step's rows."""


class InvalidRecordError(StoreError, ValueError):
    """A value handed to the writer has the wrong type, shape or length."""
