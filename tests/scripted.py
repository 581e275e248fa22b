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


def mars_script(task, answer: Callable[[str], str] | None = None) -> Callable[[str], str]:
    """MARS's System 2 on a script: a search (routed through System 1, which distils it), then python, then
    ``answer(prompt)`` (default: the task's answer)."""
    import json

    def script(prompt: str) -> str:
        if "expert information extractor" in prompt:
            return "Distilled: the fact you need."
        turns = prompt.count("<tool_response>")
        if turns == 0:
            call = {"name": "search", "arguments": {"queries": [task.question], "purpose": "find it"}}
            return f"<think>search first</think><tool_call>{json.dumps(call)}</tool_call>"
        if turns == 1:
            return '<think>compute</think><tool_call>{"name": "python", "arguments": {"code": "print(6*7)"}}</tool_call>'
        return f"<think>done</think><answer>{answer(prompt) if answer else task.answer}</answer>"

    return script


def matpo_script(task, answer: Callable[[str], str] | None = None) -> Callable[[str], str]:
    """MATPO on a script: the planner delegates to the worker (an agent used as a tool), which searches and
    reports, then the planner answers; both report ``answer(prompt)`` (default: the task's answer)."""

    def script(prompt: str) -> str:
        found = answer(prompt) if answer else task.answer
        if "sub-agent working on a specific part" in prompt:
            if "This is your final turn" in prompt:
                return "# Final Response: found\n## Conclusion\nThe answer is " + found
            if "<use_mcp_tool>" not in prompt.split("YOUR ASSIGNED SUBTASK")[1]:
                return (
                    "<use_mcp_tool>\n<server_name>search_and_scrape_webpage</server_name>\n<tool_name>google_search"
                    f'</tool_name>\n<arguments>\n{{"q": "{task.question}"}}\n</arguments>\n</use_mcp_tool>'
                )
            return "I have what I need."
        if "Final Response" in prompt:
            return f"The answer is \\boxed{{{found}}}."
        return (
            "Delegate.\n<use_mcp_tool>\n<server_name>browsing_agent</server_name>\n<tool_name>search_and_browse"
            '</tool_name>\n<arguments>\n{"subtask": "look it up"}\n</arguments>\n</use_mcp_tool>'
        )

    return script
