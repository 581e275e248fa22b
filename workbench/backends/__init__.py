"""Generation backends behind one async interface: transformers now; vLLM and OpenAI-compatible next."""

from workbench.backends.base import Backend, BackendError, Generation, GenerationRequest

__all__ = ["Backend", "BackendError", "Generation", "GenerationRequest", "make_backend"]


def make_backend(kind: str, model: str, **options) -> Backend:
    """Start a backend by name: ``hf`` (transformers)."""
    if kind == "hf":
        from workbench.backends.hf import HFBackend

        return HFBackend(model, **options)
    raise BackendError(f"unknown backend '{kind}': use 'hf'")
