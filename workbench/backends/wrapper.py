"""A backend that wraps another: forwards everything it does not change, ``policy_version`` included.

Schedulers put wrappers around the rollout backends (segmenting long generations, metering busy
time); the engine and the weight sync see the wrapped backend as if it were the inner one.
"""

from __future__ import annotations

from typing import Any

from workbench.backends.base import Generation, GenerationRequest


class BackendWrapper:
    """Delegates every attribute to ``inner``; subclasses override ``generate``."""

    def __init__(self, inner: Any):
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def policy_version(self) -> int:
        return self.inner.policy_version

    @policy_version.setter
    def policy_version(self, value: int) -> None:
        self.inner.policy_version = value

    async def generate(self, request: GenerationRequest) -> list[Generation]:
        return await self.inner.generate(request)

    def close(self) -> None:
        self.inner.close()


def unwrap(backend: Any) -> Any:
    """The innermost backend under any wrappers."""
    while isinstance(backend, BackendWrapper):
        backend = backend.inner
    return backend
