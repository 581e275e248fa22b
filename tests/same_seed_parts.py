"""The parts the same-seed tests share: a verifier of their own, the topologies they train, a training run of
the tiny model and what a run stored (its calls' token ids and its untimed metrics).

A module of its own (not a test module) so that one module object registers ``same_seed_digit``: pytest
imports a test file as ``test_x`` and another test importing it as ``tests.test_x`` makes a second; the
registry then held the one Ray workers cannot import (``test_x``), and the runs on Ray failed with the
verifier unknown there.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import workbench as wb
from workbench.rewards import register
from workbench.rl.config import TrainConfig
from workbench.tasks import generate
from workbench.topology import from_dict
from workbench.training import create, run_training


@register("same_seed_digit")
def _has_digit(prediction: str, reference: str) -> float:
    return float(any(ch.isdigit() for ch in prediction))


#: Two roles one after the other: the second's prompt holds the first's completion.
CHAIN = from_dict(
    {
        "name": "chain",
        "roles": {
            "first": {
                "messages": [{"role": "user", "content": "{{ question }}"}],
                "reward": {"kind": "answer", "verifier": "same_seed_digit"},
            },
            "second": {
                "messages": [{"role": "user", "content": "Check: {{ question }} {{ draft }}"}],
                "reward": {"kind": "answer", "verifier": "same_seed_digit"},
            },
        },
        "flow": {
            "start": "a",
            "nodes": {
                "a": {"call": "first", "bind": {"draft": "text"}, "next": [{"goto": "b"}]},
                "b": {"call": "second", "bind": {"answer": "text"}},
            },
            "answer": "{{ answer }}",
        },
    }
)


def tool_agent(kind: str, argument: str, options: dict[str, Any]) -> Any:
    """An agent with one tool of ``kind``, given the text between the tags as ``argument``. The tiny model writes random text, so the protocol's tags are a space
    and a letter it writes often: many turns call the tool (with arguments that make no sense, whose answer is
    a result like any other)."""
    return from_dict(
        {
            "name": f"{kind}_agent",
            "roles": {
                "coder": {
                    "messages": [{"role": "user", "content": "{{ question }}"}],
                    "reward": {"kind": "answer", "verifier": "same_seed_digit"},
                    "sampling": {"max_tokens": 8},
                }
            },
            "tools": {"tool": {"kind": kind, "options": options}},
            "flow": {
                "start": "work",
                "answer": "{{ answer }}",
                "nodes": {
                    "work": {
                        "bind": {"answer": "text"},
                        "agent": "coder",
                        "tools": ["tool"],
                        "protocol": "tags",
                        "protocol_options": {
                            "begin": " ",
                            "end": "e",
                            "tool": "tool",
                            "argument": argument,
                            "result_begin": "<o>",
                            "result_end": "</o>",
                        },
                        "max_turns": 3,
                    }
                },
            },
        }
    )


#: Its tool runs in another process (the python sandbox): each episode's next turn waits on a subprocess.
SANDBOXED = tool_agent("python", "code", {"timeout": 10})

#: Metrics that measure time (or its share), not what the run did.
_TIMED = ("time/", "bubble/", "throughput/", "perf/")


def _train(root: Path, name: str, topology: Any, seed: int = 0, **overrides: Any) -> Path:
    fields = dict(
        model="tiny",
        steps=2,
        batch_size=2,
        group_size=2,
        max_tokens=6,
        runs_dir=str(root / name),
        checkpoint_every=100,
        learning_rate=1e-2,
        n_tasks=8,
        task_options={"level": 1},
        seed=seed,
    )
    config = TrainConfig(**{**fields, **overrides})
    run_dir = create(config)
    tasks = None if isinstance(topology, str) else generate("arithmetic", n=8, seed=0, level=1)
    if isinstance(topology, str):
        config.topology, topology = topology, None
    status = run_training(config, run_dir, topology=topology, tasks=tasks, log=lambda line: None)
    assert status == "finished"
    return run_dir


def _stored(run_dir: Path) -> tuple[dict, dict]:
    """The run's calls (token ids, by step, task, sample and position) and its metrics but the timings."""
    reader = wb.RunReader(run_dir)
    episodes = reader.episodes().set_index("id")
    assert (episodes["status"] == "complete").all(), episodes["error"].dropna().head(1).tolist()
    where = {i: (e.task_id, e.task_meta["sample"]) for i, e in episodes.iterrows()}
    calls = reader.calls()
    assert len(calls), "the run stored calls"
    keyed = {
        (row.step, *where[row.episode_id], row.position): (
            row.role,
            list(row.prompt_ids),
            list(row.completion_ids),
        )
        for row in calls.itertuples()
    }
    assert len(keyed) == len(calls), "one call per key"
    wide = reader.metrics_wide()
    metrics = {
        (int(step), name): value
        for step, row in wide.iterrows()
        for name, value in row.items()
        if not name.startswith(_TIMED) and not name.endswith("_s") and not _missing(value)
    }
    return keyed, metrics


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _same(first: Path, second: Path) -> tuple[dict, dict]:
    calls, metrics = _stored(first)
    again, metrics_again = _stored(second)
    assert calls.keys() == again.keys()
    differ = [key for key in calls if calls[key] != again[key]]
    assert not differ, f"{len(differ)} of {len(calls)} calls drew other tokens, the first {differ[0]}"
    changed = {k: (v, metrics_again.get(k)) for k, v in metrics.items() if metrics_again.get(k) != v}
    assert metrics.keys() == metrics_again.keys() and not changed, changed
    return calls, metrics
