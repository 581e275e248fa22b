"""Tool faults in real rollouts: each fault is recorded on its call, and the episode, the batch and the run go on.

One batch of 14 episodes runs through ``wb.rollout`` into a run store. Every episode's agent calls three
tools, each with a fault picked for that episode:

- a search backend (a tool kind registered here, as a user would add one) that hangs past the tool's
  timeout, raises (plain, multi-line, unprintable), calls ``sys.exit``, cancels itself, or returns
  garbage: ``None``, a ``ToolResult`` with fields of the wrong types, one failing without a reason,
  records that are neither dicts nor JSON, raw bytes, 3 MB of text, 200,000 records (14 kinds);
- the Python sandbox, whose process segfaults (``faulthandler._sigsegv``, and a NULL read through
  ``ctypes`` with the audit guard off), aborts, is killed by SIGKILL, leaves by ``os._exit(7)`` or runs
  out of memory (7 kinds, each twice);
- ``WebSearchTool`` against a local HTTP server playing Serper: HTTP 500, a body that is not JSON, JSON
  that is not an object, results that are not a list, a request that hangs past the client's timeout,
  and one that hangs past the tool's timeout (7 kinds, each twice).

The agent is a scripted policy (``tests/scripted.py``): it makes the calls whatever it reads. Two more
tests: a timed-out tool whose clean-up after cancellation hangs does not hold up its episode, and a
three-step training run of the tiny model whose tool fails on two calls in three finishes every step.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

import workbench as wb
from tests.reliability.servers import SearchAPI
from tests.scripted import ScriptedBackend
from workbench.engine import Rollout
from workbench.models import resolve
from workbench.rl.config import TrainConfig
from workbench.rl.loop import run_training
from workbench.store import TokenOwner
from workbench.tasks import Task
from workbench.tools import TOOL_KINDS, Tool, ToolResult, register_tool_kind
from workbench.tools.base import MAX_RECORDS, MAX_RESULT_CHARS
from workbench.tools.search import SEARCH_PARAMETERS, queries_of
from workbench.topology import from_dict
from workbench.training import create

KIND = "fault_injecting_search"
TOOL_TIMEOUT_S = 0.5


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this exception cannot be printed")


async def _hang(query: str):
    await asyncio.sleep(3600)


async def _raise(query: str):
    raise ConnectionError("search backend refused the connection (127.0.0.1:9200)")


async def _raise_multiline(query: str):
    raise RuntimeError("\n\n  index corrupt: shard 3 unreadable\n  at segment 17\n")


async def _raise_unprintable(query: str):
    raise Unprintable()


async def _sys_exit(query: str):
    sys.exit(2)  # what argparse does with arguments it cannot parse


async def _cancel_self(query: str):
    raise asyncio.CancelledError()  # e.g. a client library cancelling its own request


async def _none(query: str):
    return None  # a wrapper that forgot its return


async def _wrong_types(query: str):
    return ToolResult(ok="yes", content=12345, error=object(), truncated="no", metadata=[1, 2])  # type: ignore[arg-type]


async def _failure_without_reason(query: str):
    return ToolResult(ok=False)


async def _unserialisable(query: str):
    return [{"title": object(), "url": b"kb://raw", "snippet": {1, 2}}, 42, None, "a bare string"]


async def _bytes(query: str):
    return b"\xff\xfe\x00binary junk \x80 from a broken backend"


async def _huge_text(query: str):
    return "word " * 600_000  # 3 MB


async def _huge_records(query: str):
    return [{"title": f"r{i}", "url": f"kb://{i}", "snippet": "y" * 40} for i in range(200_000)]


async def _ok(query: str):
    return ToolResult(ok=True, content=[{"title": "Found", "url": "kb://1", "snippet": "The fact you need."}])


SEARCH_BEHAVIOURS = {
    "ok": _ok,
    "hang": _hang,
    "raise": _raise,
    "raise_multiline": _raise_multiline,
    "raise_unprintable": _raise_unprintable,
    "sys_exit": _sys_exit,
    "cancel_self": _cancel_self,
    "none": _none,
    "wrong_types": _wrong_types,
    "failure_without_reason": _failure_without_reason,
    "unserialisable": _unserialisable,
    "bytes": _bytes,
    "huge_text": _huge_text,
    "huge_records": _huge_records,
}
# the recorded error of each search fault (None: the call succeeds, its content coerced or cut)
SEARCH_ERRORS = {
    "ok": None,
    "hang": f"search: timed out after {TOOL_TIMEOUT_S:g} s",
    "raise": "search: ConnectionError: search backend refused the connection (127.0.0.1:9200)",
    "raise_multiline": "search: RuntimeError: index corrupt: shard 3 unreadable",
    "raise_unprintable": "search: Unprintable: (its message could not be read)",
    "sys_exit": "search: ToolExitError: the tool called sys.exit(2)",
    "cancel_self": "search: ToolCancelledError: the tool was cancelled from inside",
    "none": "search: returned nothing (None) instead of a result",
    "wrong_types": "search: returned a malformed result (its ok is a str, not a bool)",
    "failure_without_reason": "search: failed without giving a reason",
    "unserialisable": None,
    "bytes": None,
    "huge_text": None,
    "huge_records": None,
}

SANDBOX_FAULTS = {  # code, tool, recorded error, recorded exit code
    "segfault": (
        "import faulthandler\nprint('before the crash', flush=True)\nfaulthandler._sigsegv()",
        "python",
        "python: died from signal SIGSEGV",
        -11,
    ),
    "ctypes_null_read": ("import ctypes\nctypes.string_at(0)", "python_unguarded", None, -11),
    "abort": ("import os\nos.abort()", "python", "python: died from signal SIGABRT", -6),
    "sigkill": ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "python", None, -9),
    "exit_7": ("import os\nprint('leaving', flush=True)\nos._exit(7)", "python", None, 7),
    "memory": ("blob = bytearray(8 * 1024**3)", "python", "python: ran out of memory (limit 256 MB)", 1),
    "fine": ("print(6 * 7)", "python", None, None),
}
SANDBOX_ERRORS = {
    "ctypes_null_read": "python: died from signal SIGSEGV",  # errors name the tool kind's instance
    "sigkill": "python: died from signal SIGKILL",
}

WEB_FAULTS = {  # query marker, tool, recorded error
    "500": ("web", "web_search: serper answered HTTP 500: the service failed; try again later"),
    "badjson": ("web", "web_search: serper answered something that is not JSON"),
    "list": ("web", "web_search: serper answered JSON that is not an object"),
    "organicstring": ("web", "web_search: serper answered 'organic' as a str, not a list"),
    "hang": ("web", "web_search: serper request failed (ReadTimeout)"),
    "hang_past_tool_timeout": ("web_slow_client", f"web_search: timed out after {TOOL_TIMEOUT_S:g} s"),
    "ok": ("web", None),
}


class FaultInjectingSearch(Tool):
    """A search backend whose behaviour the query's prefix picks: ``fault=<name>; <question>``."""

    description = "Search; misbehaves as its query asks."
    parameters = SEARCH_PARAMETERS

    def __init__(self, name: str = "search"):
        self.name = name

    async def __call__(self, **arguments):
        query = queries_of(arguments)[0]
        fault = query.split(";")[0].removeprefix("fault=")
        return await SEARCH_BEHAVIOURS[fault](query)


@pytest.fixture(scope="module", autouse=True)
def fault_kind():
    register_tool_kind(KIND, FaultInjectingSearch, replace=True)
    yield
    TOOL_KINDS.pop(KIND, None)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve("tiny"))


def topology(web_url: str, cache_dir: Path, tools: dict | None = None, max_turns: int = 6):
    web = {"backend": "serper", "mode": "auto", "cache_dir": str(cache_dir), "base_url": web_url}
    return from_dict(
        {
            "name": "tool_faults",
            "roles": {
                "researcher": {
                    "messages": [
                        {"role": "system", "content": "Use the tools, then answer in <answer></answer>."},
                        {"role": "user", "content": "{{ question }}"},
                    ],
                    "sampling": {"max_tokens": 64},
                }
            },
            "tools": tools
            or {
                "search": {"kind": KIND, "timeout": TOOL_TIMEOUT_S},
                "python": {"kind": "python", "options": {"timeout": 20, "memory_mb": 256}, "truncate": 2000},
                "python_unguarded": {"kind": "python", "options": {"timeout": 20, "guard": False}},
                "web": {"kind": "web_search", "options": {**web, "timeout": 1.0}, "timeout": 20},
                "web_slow_client": {"kind": "web_search", "options": web, "timeout": TOOL_TIMEOUT_S},
            },
            "flow": {
                "start": "act",
                "answer": "{{ answer or '' }}",
                "nodes": {
                    "act": {
                        "agent": "researcher",
                        "tools": list(
                            tools or ["search", "python", "python_unguarded", "web", "web_slow_client"]
                        ),
                        "protocol": "json_tool_call",
                        "max_turns": max_turns,
                        "bind": {"answer": "answer"},
                    }
                },
            },
        }
    )


def _tool_call(name: str, arguments: dict) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


class Plan:
    """Which faults each episode meets: episode i calls search, the sandbox and web search, in that order."""

    def __init__(self) -> None:
        sandbox, web = itertools.cycle(SANDBOX_FAULTS), itertools.cycle(WEB_FAULTS)
        self.episodes = [(s, next(sandbox), next(web)) for s in SEARCH_BEHAVIOURS]
        self.tasks = [
            Task(
                id=f"t{i}",
                question=f"[task {i}] What does the fact say?",
                answer=f"answer {i}",
                verifier="exact",
            )
            for i in range(len(self.episodes))
        ]

    def calls(self, i: int) -> list[str]:
        search, sandbox, web = self.episodes[i]
        code, python_tool, _, _ = SANDBOX_FAULTS[sandbox]
        web_tool, _ = WEB_FAULTS[web]
        marker = "hang" if web == "hang_past_tool_timeout" else web
        return [
            _tool_call("search", {"query": f"fault={search}; what does the fact say"}),
            _tool_call(python_tool, {"code": code}),
            _tool_call(web_tool, {"q": f"api={marker} episode {i}"}),
        ]

    def script(self, prompt: str) -> str:
        i = int(re.search(r"\[task (\d+)\]", prompt).group(1))
        done = prompt.count("<tool_response>")
        calls = self.calls(i)
        return calls[done] if done < len(calls) else f"<answer>answer {i}</answer>"


@pytest.fixture(scope="module")
def batch(tmp_path_factory, tokenizer):
    """The 14-episode rollout, stored in a run: (plan, result, reader, the API server, the web cache dir)."""
    root = tmp_path_factory.mktemp("tool_faults")
    plan = Plan()
    with pytest.MonkeyPatch.context() as env, SearchAPI() as api:
        env.setenv("SERPER_API_KEY", "serper-test-key-0123456789")
        result = wb.rollout(
            topology(api.url, root / "web_cache"),
            plan.tasks,
            backend=ScriptedBackend(tokenizer, plan.script),
            model="scripted",
            runs_dir=root / "runs",
        )
        with wb.RunReader(result.run_dir) as reader:
            episodes, calls = reader.episodes(), reader.calls()
        yield plan, result, episodes, calls, api, root / "web_cache"


def _results(result, i: int) -> list[dict]:
    (call,) = result.episodes[i].calls
    return call.tool_results


def test_every_episode_of_the_faulty_batch_completes_with_its_answer_and_is_stored(batch):
    plan, result, episodes, calls, _, _ = batch
    assert len(result.episodes) == len(plan.tasks) == 14
    for i, episode in enumerate(result.episodes):
        assert episode.status == "complete", (plan.episodes[i], episode.error)
        assert episode.answer == f"answer {i}" and episode.reward == 1.0
        assert [r["name"] for r in _results(result, i)] == [
            "search",
            SANDBOX_FAULTS[plan.episodes[i][1]][1],
            WEB_FAULTS[plan.episodes[i][2]][0],
        ]
    assert sorted(episodes["task_id"]) == sorted(t.id for t in plan.tasks)
    assert set(episodes["status"]) == {"complete"} and set(episodes["reward"]) == {1.0}
    assert len(calls) == 14 and wb.RunReader(result.run_dir).info()["status"] == "finished"


def test_a_search_backend_that_hangs_raises_or_exits_is_a_tool_error_with_a_readable_reason(batch):
    plan, result, *_ = batch
    failed = 0
    for i, (search, _, _) in enumerate(plan.episodes):
        recorded = _results(result, i)[0]
        expected = SEARCH_ERRORS[search]
        if expected is None:
            assert recorded["ok"] and recorded["error"] is None, (search, recorded)
            continue
        failed += 1
        assert not recorded["ok"] and recorded["error"] == expected, (search, recorded)
        assert recorded.get("timed_out", False) == (search == "hang")
        assert recorded["results"] == 0
    assert failed == 9


def test_garbage_from_a_search_backend_is_coerced_and_huge_results_are_cut(batch):
    plan, result, *_ = batch
    by_fault = {plan.episodes[i][0]: _results(result, i)[0] for i in range(len(plan.episodes))}
    assert by_fault["unserialisable"]["results"] == 4 and not by_fault["unserialisable"]["truncated"]
    assert by_fault["bytes"]["results"] == 1
    assert by_fault["huge_text"]["truncated"] and by_fault["huge_text"]["results"] == 1
    assert by_fault["huge_records"]["truncated"] and by_fault["huge_records"]["results"] == MAX_RECORDS
    assert by_fault["ok"] == {**by_fault["ok"], "ok": True, "results": 1, "truncated": False}


def test_what_the_agent_read_after_each_fault_is_bounded_and_names_the_reason(batch, tokenizer):
    plan, result, *_ = batch
    for i, (search, _, _) in enumerate(plan.episodes):
        (call,) = result.episodes[i].calls
        seen = tokenizer.decode(
            [t for t, m in zip(call.completion_ids, call.mask, strict=True) if m == TokenOwner.TOOL]
        )
        first = seen.split("</tool_response>")[0]
        if SEARCH_ERRORS[search] is not None:
            assert f"Error: {SEARCH_ERRORS[search]}" in first, (search, first[:300])
        assert len(first) < MAX_RESULT_CHARS * 1.1, (search, len(first))
    by_fault = {plan.episodes[i][0]: i for i in range(len(plan.episodes))}
    (call,) = result.episodes[by_fault["unserialisable"]].calls
    seen = tokenizer.decode(call.completion_ids)
    assert "a bare string" in seen and "42" in seen
    (call,) = result.episodes[by_fault["huge_text"]].calls
    assert "[truncated]" in tokenizer.decode(call.completion_ids)


def test_a_crashing_sandbox_process_is_recorded_with_its_signal_or_exit_code(batch):
    plan, result, *_ = batch
    seen = set()
    for i, (_, fault, _) in enumerate(plan.episodes):
        recorded = _results(result, i)[1]
        _, _, error, exit_code = SANDBOX_FAULTS[fault]
        error = error or SANDBOX_ERRORS.get(fault)
        seen.add(fault)
        if exit_code is not None:
            assert recorded.get("exit_code") == exit_code, (fault, recorded)
        if error is None:
            assert recorded["ok"] and recorded["error"] is None, (fault, recorded)
        else:
            assert not recorded["ok"] and recorded["error"] == error, (fault, recorded)
        if exit_code is not None and exit_code < 0:
            assert recorded["killed"] == recorded["error"].split("died from ")[1], recorded
    assert seen == set(SANDBOX_FAULTS)


def test_a_failing_web_search_api_is_a_tool_error_and_only_good_answers_are_cached(batch):
    plan, result, _, _, api, cache_dir = batch
    for i, (_, _, fault) in enumerate(plan.episodes):
        recorded = _results(result, i)[2]
        expected = WEB_FAULTS[fault][1]
        if expected is None:
            assert recorded["ok"] and recorded["results"] == 2, recorded
        else:
            assert not recorded["ok"] and recorded["error"] == expected, (fault, recorded)
        assert recorded.get("timed_out", False) == (fault == "hang_past_tool_timeout")
    asked = [r["q"] for r in api.requests]
    assert len(asked) == 14 and all(r["key"] == "serper-test-key-0123456789" for r in api.requests)
    cached = [json.loads(p.read_text())["request"]["q"] for p in cache_dir.rglob("*.json")]
    good = [q for q in asked if "api=ok" in q]
    assert sorted(cached) == sorted(good) and len(good) == 2, "a failed answer is never cached"


def test_the_run_store_holds_every_fault_as_recorded(batch, tokenizer):
    plan, result, episodes, calls, _, _ = batch
    stored = {row.episode_id: row for row in calls.itertuples()}
    by_task = dict(zip(episodes["id"], episodes["task_id"], strict=True))
    faults = 0
    for episode_id, row in stored.items():
        i = int(by_task[episode_id].removeprefix("t"))
        assert row.tool_results == _results(result, i), "the stored record is the engine's"
        faults += sum(not r["ok"] or bool(r.get("exit_code")) for r in row.tool_results)
        completion = tokenizer.decode(row.completion_ids)
        for recorded in row.tool_results:
            if recorded["error"] is not None:
                assert f"Error: {recorded['error']}" in completion
    assert faults == 9 + 12 + 12  # search errors, sandbox crashes and exits, web errors
    assert wb.RunReader(result.run_dir).integrity_check() == "ok"


def test_a_timed_out_tool_whose_clean_up_hangs_does_not_hold_up_its_episode(tokenizer):
    """The tool's clean-up (after its cancellation) waits for the episode to end: only a call that returns
    without waiting for it lets the episode end at all."""
    finished = asyncio.Event()
    cleaned = []

    class StuckOnClose(Tool):
        name, description, parameters = "search", "search", SEARCH_PARAMETERS

        async def __call__(self, **arguments):
            try:
                await asyncio.sleep(3600)
            finally:
                await finished.wait()  # a connection close that never completes while the episode waits
                cleaned.append(True)

    tools = {"search": {"kind": KIND, "timeout": TOOL_TIMEOUT_S}}
    spec = topology("http://127.0.0.1:1", Path("unused"), tools=tools, max_turns=2)
    task = Task(id="t0", question="[task 0] Anything?", answer="answer 0", verifier="exact")

    def script(prompt: str) -> str:
        if "<tool_response>" in prompt:
            return "<answer>answer 0</answer>"
        return _tool_call("search", {"query": "anything"})

    engine = Rollout(spec, ScriptedBackend(tokenizer, script), tools={"search": StuckOnClose()})

    async def run():
        return await asyncio.wait_for(engine.run([task], progress=lambda _: finished.set()), 60)

    (episode,) = asyncio.run(run())
    assert episode.status == "complete" and episode.answer == "answer 0"
    recorded = episode.calls[0].tool_results[0]
    assert recorded["error"] == f"search: timed out after {TOOL_TIMEOUT_S:g} s" and recorded["timed_out"]
    assert cleaned == [True], "the clean-up still ran, once the episode had ended"


class EveryThirdCallWorks(Tool):
    """A search backend that raises on its first call, hangs on its second, answers on its third, and so on."""

    description = "search"
    parameters = SEARCH_PARAMETERS
    calls = 0

    def __init__(self, name: str = "search"):
        self.name = name

    async def __call__(self, **arguments):
        n = type(self).calls
        type(self).calls += 1
        if n % 3 == 0:
            raise ConnectionError("search backend unreachable")
        if n % 3 == 1:
            await asyncio.sleep(3600)
        return ToolResult(ok=True, content=[{"title": "Found", "url": "kb://1", "snippet": "7"}])


def test_a_training_run_whose_tool_fails_on_two_calls_in_three_finishes_every_step(tmp_path):
    """The tiny model writes random text; with ``a`` opening a call and ``e`` closing it, it calls the tool
    often, with its own random queries."""
    register_tool_kind("flaky_search", EveryThirdCallWorks, replace=True)
    EveryThirdCallWorks.calls = 0
    try:
        spec = from_dict(
            {
                "name": "flaky_tools",
                "roles": {
                    "agent": {
                        "messages": [{"role": "user", "content": "{{ question }}"}],
                        "sampling": {"max_tokens": 8},
                        "reward": {"kind": "outcome", "verifier": "f1"},
                    }
                },
                "tools": {"search": {"kind": "flaky_search", "timeout": 0.3}},
                "flow": {
                    "start": "act",
                    "answer": "{{ answer or '' }}",
                    "nodes": {
                        "act": {
                            "agent": "agent",
                            "tools": ["search"],
                            "protocol": "tags",
                            "protocol_options": {
                                "begin": "a",
                                "end": "e",
                                "tool": "search",
                                "argument": "query",
                                "result_begin": "<r>",
                                "result_end": "</r>",
                            },
                            "max_turns": 3,
                            "bind": {"answer": "answer"},
                        }
                    },
                },
            }
        )
        config = TrainConfig(
            model="tiny",
            steps=3,
            batch_size=2,
            group_size=4,
            max_tokens=8,
            learning_rate=1e-4,
            checkpoint_every=10,
            runs_dir=str(tmp_path),
        )
        run_dir = create(config)
        tasks = wb.generate_tasks("arithmetic", n=8, seed=0, level=1)
        assert run_training(config, run_dir, topology=spec, tasks=tasks, log=lambda m: None) == "finished"
    finally:
        TOOL_KINDS.pop("flaky_search", None)
    with wb.RunReader(run_dir) as reader:
        assert list(reader.steps()["step"]) == [0, 1, 2] and set(reader.steps()["status"]) == {"complete"}
        calls = reader.calls(columns=["step", "tool_results"])
        assert reader.integrity_check() == "ok"
    recorded = [r for results in calls["tool_results"] for r in results or []]
    errors = [r["error"] for r in recorded if not r["ok"]]
    assert "search: ConnectionError: search backend unreachable" in errors
    assert "search: timed out after 0.3 s" in errors
    assert len(recorded) >= 3, "the model called the tool often enough to meet every fault"
    assert sum(r["ok"] for r in recorded) == len(recorded) // 3 == len(recorded) - len(errors)
    assert len(calls) == 3 * 2 * 4, "every episode of every step is stored"
