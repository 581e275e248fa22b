"""Errors raised by the local model registry; each message is one line that says what to do."""

from __future__ import annotations


class ModelError(RuntimeError):
    """Base class of the model registry's errors."""


class ModelNotFoundError(ModelError, LookupError):
    """A name that is no built-in model, local checkpoint directory or resolvable Hugging Face repo."""


class ModelBuildError(ModelError):
    """A built-in model could not be built or converted into the cache."""
