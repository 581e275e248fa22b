"""A role's growing context as exact token ids, with who owns every token after the prompt.

A multi-turn agent is one training sample: its prompt, then its own generated turns (trainable)
interleaved with text others inserted (tool results, other roles' outputs, template glue), which
are masked. Generated tokens are appended exactly as the backend returned them; only inserted
text is tokenised, so the sequence is never re-tokenised.

Chat mode inserts a new message through the tokenizer's chat template (the text the template
adds after the last message); raw mode (HiRA's planner) appends plain text to the running prompt.
"""

from __future__ import annotations

from typing import Any

from workbench.backends.base import Generation, chat_prompt_ids
from workbench.store.codec import TokenOwner


class Conversation:
    def __init__(
        self, tokenizer: Any, messages: list[dict[str, str]], mode: str = "chat", raw_prefix: str = ""
    ):
        self.tokenizer = tokenizer
        self.mode = mode
        self.messages = [dict(m) for m in messages]
        if mode == "chat":
            self.prompt_ids = chat_prompt_ids(tokenizer, self.messages)
        else:
            # raw completion: the prompt is the chat-templated first turn plus any running text
            self.prompt_ids = chat_prompt_ids(tokenizer, self.messages) + self._encode(raw_prefix)
        self.completion_ids: list[int] = []
        self.logprobs: list[float] = []
        self.mask: list[int] = []
        self.turn_texts: list[str] = []

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.completion_ids

    def add_generation(self, generation: Generation, text: str | None = None) -> None:
        """Append a turn the role generated; ``text`` is what other readers see (post-processed)."""
        self.completion_ids += generation.completion_ids
        self.logprobs += generation.logprobs
        self.mask += [int(TokenOwner.TRAINABLE)] * len(generation.completion_ids)
        raw = generation.text
        self.turn_texts.append(raw)
        if self.mode == "chat":
            self.messages.append({"role": "assistant", "content": raw if text is None else text})

    def insert(self, content: str, owner: TokenOwner = TokenOwner.TOOL, role: str = "user") -> None:
        """Insert text that the role did not generate, masked with ``owner``."""
        if self.mode == "chat":
            ids = self._message_delta({"role": role, "content": content})
        else:
            ids = self._encode(content)
        self.completion_ids += ids
        self.logprobs += [0.0] * len(ids)
        self.mask += [int(owner)] * len(ids)
        if self.mode == "chat":
            self.messages.append({"role": role, "content": content})

    def _message_delta(self, message: dict[str, str]) -> list[int]:
        """Tokens that close the last assistant turn (if the model did not) and open ``message``,
        followed by the generation prompt of the next assistant turn."""
        render = self.tokenizer.apply_chat_template
        before = render(self.messages, tokenize=False)
        after = render([*self.messages, message], tokenize=False, add_generation_prompt=True)
        if not after.startswith(before):
            raise ValueError("the chat template re-renders earlier turns; this model needs raw mode")
        glue = after[len(before) :]
        closing = self._closing_text(before)
        return self._encode(closing + glue)

    def _closing_text(self, rendered: str) -> str:
        """What the template writes after the last assistant message that the model did not generate."""
        if not self.messages or self.messages[-1]["role"] != "assistant":
            return ""
        content = self.messages[-1]["content"]
        end = rendered.rfind(content) + len(content) if content else len(rendered)
        terminator = rendered[end:]
        generated = self.tokenizer.decode(self._last_turn_ids(), skip_special_tokens=False)
        for k in range(len(terminator), 0, -1):  # the longest head of the terminator already generated
            if generated.endswith(terminator[:k]):
                return terminator[k:]
        return terminator

    def _last_turn_ids(self) -> list[int]:
        ids = []
        for token, owner in zip(reversed(self.completion_ids), reversed(self.mask), strict=True):
            if owner != TokenOwner.TRAINABLE:
                break
            ids.append(token)
        return ids[::-1]

    def decoded(self) -> str:
        return self.tokenizer.decode(self.completion_ids, skip_special_tokens=False)

    def segments(self) -> list[dict[str, str]]:
        """The whole interleaved completion as text, cut where its owner changes: ``[{"owner": "trainable" |
        "tool" | "other_role" | "masked", "text": ...}, ...]`` in order (what the tokens and mask hold)."""
        out: list[dict[str, str]] = []
        start = 0
        for end in range(1, len(self.mask) + 1):
            if end == len(self.mask) or self.mask[end] != self.mask[start]:
                text = self.tokenizer.decode(self.completion_ids[start:end], skip_special_tokens=False)
                out.append({"owner": TokenOwner(self.mask[start]).name.lower(), "text": text})
                start = end
        return out
