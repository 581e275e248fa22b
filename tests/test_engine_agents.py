"""The engine's agent mechanics on scripted outputs: tool loops, System 1 routing, agents as tools, masks."""

import asyncio
import json

import pytest
from transformers import AutoTokenizer

import workbench as wb
from tests.scripted import ScriptedBackend
from workbench.engine import Rollout
from workbench.models import resolve
from workbench.store.codec import TokenOwner


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve("tiny"))


@pytest.fixture(scope="module")
def task():
    return wb.generate_tasks("multihop", n=1, seed=0, hops=1)[0]


def _owned(call, owner):
    return [t for t, m in zip(call.completion_ids, call.mask, strict=True) if m == owner]


def test_mars_routes_search_through_system1_and_passes_python_straight_back(tokenizer, task):
    def script(prompt: str) -> str:
        if "expert information extractor" in prompt:
            return "Distilled: the fact you need."
        turns = prompt.count("<tool_response>")
        if turns == 0:
            call = {"name": "search", "arguments": {"queries": [task.question], "purpose": "find it"}}
            return f"<think>search first</think><tool_call>{json.dumps(call)}</tool_call>"
        if turns == 1:
            return '<think>compute</think><tool_call>{"name": "python", "arguments": {"code": "print(6*7)"}}</tool_call>'
        return f"<think>done</think><answer>{task.answer}</answer>"

    backend = ScriptedBackend(tokenizer, script)
    episode = asyncio.run(Rollout(wb.load_topology("mars"), backend).episode(task))
    assert episode.status == "complete", episode.error
    assert episode.answer == task.answer
    system2 = next(c for c in episode.calls if c.role == "system2")
    system1 = [c for c in episode.calls if c.role == "system1"]
    assert system1 and all(c.parent == system2.position for c in system1)
    assert [r["name"] for r in system2.tool_results] == ["search", "python"]
    assert system2.tool_results[0]["via"] == "system1" and system2.tool_results[0]["bins"] == len(system1)
    # the distilled text came from System 1 (another role); the python output is tool output
    assert "Distilled" in tokenizer.decode(_owned(system2, TokenOwner.OTHER_ROLE))
    assert "42" in tokenizer.decode(_owned(system2, TokenOwner.TOOL))
    trainable = tokenizer.decode(_owned(system2, TokenOwner.TRAINABLE))
    assert "search first" in trainable and "Distilled" not in trainable and "42" not in trainable
    assert "expert information extractor" not in system2.prompt_text  # System 2 never sees raw pages


def test_matpo_worker_runs_as_a_nested_agent_with_a_fresh_context(tokenizer, task):
    def script(prompt: str) -> str:
        if "sub-agent working on a specific part" in prompt:
            if "This is your final turn" in prompt:
                return "# Final Response: found\n## Conclusion\nThe answer is " + task.answer
            if "<use_mcp_tool>" not in prompt.split("YOUR ASSIGNED SUBTASK")[1]:
                return (
                    "<use_mcp_tool>\n<server_name>search_and_scrape_webpage</server_name>\n<tool_name>google_search"
                    f'</tool_name>\n<arguments>\n{{"q": "{task.question}"}}\n</arguments>\n</use_mcp_tool>'
                )
            return "I have what I need."
        if "Final Response" in prompt:
            return f"The answer is \\boxed{{{task.answer}}}."
        return (
            "Delegate.\n<use_mcp_tool>\n<server_name>browsing_agent</server_name>\n<tool_name>search_and_browse"
            '</tool_name>\n<arguments>\n{"subtask": "look it up"}\n</arguments>\n</use_mcp_tool>'
        )

    episode = asyncio.run(
        Rollout(wb.load_topology("matpo"), ScriptedBackend(tokenizer, script)).episode(task)
    )
    assert episode.status == "complete", episode.error
    assert episode.answer == task.answer
    planner = next(c for c in episode.calls if c.role == "planner")
    worker = next(c for c in episode.calls if c.role == "worker")
    assert worker.parent == planner.position
    assert "look it up" in worker.prompt_text and "Delegate." not in worker.prompt_text  # fresh context
    assert worker.tool_results[0]["name"] == "google_search" and worker.tool_results[0]["ok"]
    # the worker's summary reached the planner as another role's text
    assert "Final Response" in tokenizer.decode(_owned(planner, TokenOwner.OTHER_ROLE))
    assert "This is your final turn" in tokenizer.decode(_owned(worker, TokenOwner.OTHER_ROLE))


def test_a_malformed_call_and_an_unknown_tool_are_recorded_and_the_agent_goes_on(tokenizer, task):
    def script(prompt: str) -> str:
        if prompt.count("<tool_response>") == 0:
            return '<tool_call>{"name": "search", "arguments": </tool_call>'
        if prompt.count("<tool_response>") == 1:
            return '<tool_call>{"name": "teleport", "arguments": {}}</tool_call>'
        return "<answer>unsure</answer>"

    episode = asyncio.run(Rollout(wb.load_topology("mars"), ScriptedBackend(tokenizer, script)).episode(task))
    system2 = episode.calls[0]
    assert episode.status == "complete" and episode.answer == "unsure"
    assert "not valid JSON" in system2.format_error
    assert system2.tool_results[-1] == {
        "name": "teleport",
        "ok": False,
        "error": "unknown tool",
        "seconds": 0.0,
    }
    assert "unknown tool 'teleport'" in tokenizer.decode(_owned(system2, TokenOwner.TOOL))
