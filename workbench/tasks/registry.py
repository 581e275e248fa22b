"""Registry of task generators by name: ``generate("arithmetic", n=8, seed=0, level=2)``.

A generator is a function ``fn(n: int, seed: int, **options) -> list[Task]`` that is deterministic
in ``(seed, options)`` and uses only its own ``random.Random``. Register one with
``@register_generator("name")``; the built-ins (``arithmetic``, ``multihop``, ``masbench``,
``masbench_small``) register themselves when ``workbench.tasks`` is imported.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from workbench.tasks.errors import TaskOptionError, UnknownGeneratorError
from workbench.tasks.task import Task

GeneratorFn = Callable[..., list[Task]]

_GENERATORS: dict[str, GeneratorFn] = {}


def register_generator(name: str) -> Callable[[GeneratorFn], GeneratorFn]:
    """Decorator registering ``fn`` under ``name`` (re-registering a name replaces it)."""
    if not isinstance(name, str) or not name:
        raise TaskOptionError(f"generator name must be a non-empty string, got {name!r}")

    def decorate(fn: GeneratorFn) -> GeneratorFn:
        _GENERATORS[name] = fn
        return fn

    return decorate


def list_generators() -> list[str]:
    """Names of the registered generators, sorted."""
    return sorted(_GENERATORS)


def get_generator(name: str) -> GeneratorFn:
    """The generator function registered as ``name``; raises :class:`UnknownGeneratorError`."""
    try:
        return _GENERATORS[name]
    except KeyError:
        known = ", ".join(list_generators()) or "(none registered)"
        raise UnknownGeneratorError(f"unknown task generator {name!r}; choose one of: {known}") from None


def generator_options(name: str) -> dict[str, Any]:
    """The options (keyword arguments) generator ``name`` accepts, with their defaults."""
    params = inspect.signature(get_generator(name)).parameters
    return {
        p.name: (None if p.default is inspect.Parameter.empty else p.default)
        for p in params.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }


def generate(name: str, n: int, seed: int = 0, **options: Any) -> list[Task]:
    """Generate ``n`` tasks with generator ``name``; same ``(name, n, seed, options)`` gives equal tasks."""
    fn = get_generator(name)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise TaskOptionError(f"generate({name!r}): n must be a non-negative int, got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TaskOptionError(f"generate({name!r}): seed must be an int, got {seed!r}")
    accepted = generator_options(name)
    unknown = [k for k in options if k not in accepted]
    if unknown:
        raise TaskOptionError(
            f"generator {name!r} has no option {', '.join(map(repr, unknown))}; "
            f"its options are: {', '.join(accepted) or '(none)'}"
        )
    return fn(n, seed, **options)
