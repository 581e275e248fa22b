"""Exceptions raised by ``workbench.tasks``: one clear class per kind of bad input.

Every message is one line that names the thing at fault and says what to do about it.
All of them derive from :class:`TaskError`, so ``except TaskError`` catches any of them.
"""

from __future__ import annotations


class TaskError(ValueError):
    """Base class for every error raised by ``workbench.tasks``."""


class TaskFileNotFoundError(TaskError, FileNotFoundError):
    """A task or corpus file does not exist."""


class MalformedTaskFileError(TaskError):
    """A task file cannot be parsed (bad JSON line, unreadable Parquet, wrong extension)."""


class EmptyTaskFileError(TaskError):
    """A task file holds no records."""


class MissingFieldError(TaskError):
    """A record lacks a field the loader needs (question, answer, ...)."""


class UnknownGeneratorError(TaskError):
    """``generate`` was asked for a generator name that is not registered."""


class TaskOptionError(TaskError):
    """A generator was given an option it does not have, or an invalid value for one."""


class TaskGenerationError(TaskError):
    """A generator could not build the requested tasks (e.g. too few entities for n unique questions)."""
