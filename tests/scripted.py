"""A test double of a policy: answers each prompt with a scripted text, tokenised by a real tokenizer.

The engine's mechanics (tool loops, routing, nesting, masks) need outputs that follow a protocol
exactly, which a small random or 135M model will not write on demand. This backend implements the
real ``Backend`` interface; the real-model runs are in tests/test_library.py.
"""

from __future__ import annotations

from collections.abc import Callable

from workbench.backends.base import Generation, GenerationRequest


class ScriptedBackend:
    name = "scripted"

    def __init__(self, tokenizer, script: Callable[[str], str]):
        self.tokenizer = tokenizer
        self.script = script
        self.policy_version = 0
        self.prompts: list[str] = []

    async def generate(self, request: GenerationRequest) -> list[Generation]:
        prompt = self.tokenizer.decode(list(request.prompt_ids), skip_special_tokens=False)
        self.prompts.append(prompt)
        text = self.script(prompt)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        return [
            Generation(ids, [-0.25] * len(ids), text, "stop", policy_version=self.policy_version)
            for _ in range(request.n)
        ]

    def close(self) -> None:
        pass
