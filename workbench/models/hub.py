"""Users' own models: a local checkpoint directory, or a Hugging Face repo id via the HF cache.

Repo ids go through ``huggingface_hub.snapshot_download``, which keeps its own cache and honours
Hugging Face's settings (``HF_HOME``, ``HF_HUB_CACHE``, ``HF_HUB_OFFLINE``, tokens): a cached
snapshot is used without touching the network, and a download is tried only when HF is not
offline.
"""

from __future__ import annotations

import re
from pathlib import Path

from workbench.models.errors import ModelNotFoundError

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
"""``owner/name`` as the Hugging Face Hub spells repo ids."""

IGNORED_FILES = ["*.pth", "*.pt", "*.msgpack", "*.h5", "*.ot", "*.onnx", "*.gguf", "original/*"]
"""Weights in formats neither transformers' PyTorch loader nor vLLM reads when safetensors exist."""


def looks_like_path(name: str) -> bool:
    """True when ``name`` is written as a filesystem path rather than a model name or repo id."""
    return name.startswith(("/", "./", "../", "~", ".\\")) or name in (".", "..") or name.count("/") > 1


def local_checkpoint(name: str) -> Path:
    """The checkpoint directory ``name``, checked to hold a ``config.json``."""
    path = Path(name).expanduser()
    if not path.is_dir():
        raise ModelNotFoundError(f"model directory {name} does not exist: check the path")
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(
            f"model directory {name} has no config.json: point at a Hugging Face checkpoint directory "
            f"(config.json, weights, tokenizer files)"
        )
    return path.resolve()


def hub_checkpoint(repo_id: str) -> Path:
    """The local snapshot of Hugging Face repo ``repo_id``: from the HF cache, else downloaded if online."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        path = Path(snapshot_download(repo_id, local_files_only=True, ignore_patterns=IGNORED_FILES))
    except LocalEntryNotFoundError:
        if constants.HF_HUB_OFFLINE:
            raise ModelNotFoundError(
                f"model '{repo_id}' is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and "
                f"HF_HUB_OFFLINE is set: download it where there is network "
                f"('hf download {repo_id}') or pass a local checkpoint directory"
            ) from None
        try:
            path = Path(snapshot_download(repo_id, ignore_patterns=IGNORED_FILES))
        except Exception as exc:
            first_line = (str(exc).strip().splitlines() or [""])[0]
            raise ModelNotFoundError(
                f"could not fetch model '{repo_id}' from the Hugging Face Hub ({type(exc).__name__}: "
                f"{first_line}): check the repo id, your network and token, "
                f"or pass a local checkpoint directory"
            ) from None
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(
            f"Hugging Face repo '{repo_id}' has no config.json: it is not a transformers checkpoint"
        )
    return path
