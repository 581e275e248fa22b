"""Token ids as text for the token view: one call's stored tokens with each token's text.

    call_tokens(reader, call_id)            # the call's ``StoredCall`` (call_detail) plus its tokens' texts

Token text comes from the run's tokenizer (the config's ``model``, resolved through
``workbench.models``, loaded once per model); where none can be loaded, a token shows as ``⟨id⟩``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from workbench.store import RunReader
from workbench.store.queries import StoredCall, call_detail


@dataclass(kw_only=True)
class CallTokens(StoredCall):
    """A call's ``StoredCall`` (from ``call_detail``) with the text of each prompt and completion token; ``decoded`` says whether
    the texts come from the run's tokenizer (else they are ``⟨id⟩``)."""

    prompt_tokens: list[str]
    completion_tokens: list[str]
    decoded: bool


def call_tokens(reader: RunReader, call_id: int, model: str | None = None) -> CallTokens:
    """The full token detail of one call; ``model`` (default: the run config's) names the tokenizer."""
    detail = call_detail(reader, call_id)
    decoder = token_decoder(run_model(reader) if model is None else model)
    return CallTokens(
        **vars(detail),
        prompt_tokens=decoder.texts(detail.prompt_ids),
        completion_tokens=decoder.texts(detail.completion_ids),
        decoded=decoder.tokenizer is not None,
    )


def run_model(reader: RunReader) -> str:
    """The model a run names in its config (``""`` when it names none)."""
    model = reader.config.get("model")
    return model if isinstance(model, str) else ""


class TokenDecoder:
    """Token ids to their text with one tokenizer, remembering each id's text; ``⟨id⟩`` without one."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._texts: dict[int, str] = {}
        self._lock = threading.Lock()

    def texts(self, ids: Sequence[int]) -> list[str]:
        if self.tokenizer is None:
            return [f"⟨{i}⟩" for i in ids]
        with self._lock:
            missing = sorted({i for i in ids if i not in self._texts})
            if missing:
                self._texts.update(zip(missing, self._decode(missing), strict=True))
            return [self._texts[i] for i in ids]

    def _decode(self, ids: list[int]) -> list[str]:
        tokenizer = self.tokenizer
        try:
            texts = tokenizer.batch_decode([[i] for i in ids], clean_up_tokenization_spaces=False)
            pieces = tokenizer.convert_ids_to_tokens(ids)
        except Exception:  # noqa: BLE001 - an id outside the vocabulary: show ids rather than fail
            return [f"⟨{i}⟩" for i in ids]
        # SentencePiece tokenizers drop a word's leading space when a token is decoded alone.
        return [
            " " + text
            if isinstance(piece, str) and piece.startswith("▁") and not text.startswith(" ")
            else text
            for text, piece in zip(texts, pieces, strict=True)
        ]


@lru_cache(maxsize=8)
def token_decoder(model: str) -> TokenDecoder:
    """The decoder of ``model``'s tokenizer, loaded once per model name (never builds a model that is
    not already prepared, except the instant ``tiny``); a decoder showing ids where none loads."""
    return TokenDecoder(_load_tokenizer(model) if model else None)


def _load_tokenizer(model: str) -> Any:
    try:
        from transformers import AutoTokenizer

        from workbench.models import list_models, resolve

        built_in = {info.name: info for info in list_models()}
        if model in built_in and not built_in[model].cached and not model.startswith("tiny"):
            return None  # preparing it means a download and a conversion: not a dashboard's job
        return AutoTokenizer.from_pretrained(resolve(model))
    except Exception:  # noqa: BLE001 - a model that cannot be found only costs the token texts
        return None
