"""Generation backends behind one async interface: transformers, an in-process vLLM engine, OpenAI-compatible servers."""

from workbench.backends.base import Backend, BackendError, Generation, GenerationRequest

__all__ = ["BACKEND_KINDS", "Backend", "BackendError", "Generation", "GenerationRequest", "make_backend"]

#: Backend kinds ``make_backend`` starts, with what each one is.
BACKEND_KINDS = {
    "hf": "transformers generate, batched (the small CPU fallback)",
    "vllm": "an in-process vLLM engine (AsyncLLM), continuous batching, multi-LoRA",
    "openai": "any OpenAI-compatible server through /v1/completions (options: base_url, api_key, tokenizer)",
}


def make_backend(kind: str, model: str, **options) -> Backend:
    """Start a backend by kind: ``hf``, ``vllm`` or ``openai`` (which needs ``base_url=``).

    ``model`` is a registry name or checkpoint path (``hf``, ``vllm``) or the served model name
    (``openai``); ``options`` go to the backend's constructor.
    """
    if kind == "hf":
        from workbench.backends.hf import HFBackend

        return HFBackend(model, **options)
    if kind == "vllm":
        from workbench.backends.vllm import VLLMBackend

        return VLLMBackend(model, **options)
    if kind == "openai":
        from workbench.backends.openai import OpenAIBackend

        if "base_url" not in options:
            raise BackendError("the openai backend needs base_url= (e.g. 'http://localhost:8000/v1')")
        return OpenAIBackend(options.pop("base_url"), model, **options)
    raise BackendError(f"unknown backend '{kind}': use one of {', '.join(BACKEND_KINDS)}")
