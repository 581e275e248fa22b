"""Same seed, same run on Ray (issue 49): rollout workers on a local cluster store what one process stores.

A call's seed is the run's, the step's, the task's, the sample's and the call's place, never the worker's, and a
worker loads new weights between two of its batches, so where a call runs changes nothing it draws. Each test
trains the tiny model with one seed in this process and with ``cluster: local`` (two rollout workers, each
rolling out its shard of a step; under ``pipeline``, advancing its own groups a level a step) and compares the
stores: every call's prompt and completion token ids, and every metric but the timings and the cluster's own.
``tests/test_same_seed.py`` shows the in-process run repeats itself, so a Ray run that stores the same calls
repeats too, and it is cheaper than a second run on Ray. One Ray cluster serves the module
(``tests/test_cluster.py``'s fixture).
"""

from __future__ import annotations

import math

import pytest

import workbench as wb
from tests.same_seed_parts import SANDBOXED, _stored, _train, tool_agent
from tests.test_cluster import ray_cluster  # noqa: F401 (the module's cluster)

#: Its tool answers in the worker's own process: BM25 over a small generated knowledge base.
SEARCHING = tool_agent("bm25", "query", {"n_entities": 12, "top_k": 1, "snippet_chars": 40})


@pytest.mark.slow
@pytest.mark.parametrize(
    ("scheduler", "topology", "overrides"),
    [
        ("sync", SEARCHING, {"max_tokens": 10}),
        ("async", SANDBOXED, {"max_staleness": 1, "max_tokens": 10}),
        ("pipeline", "marsrl", {"max_staleness": 1, "max_tokens": 4}),
    ],
    ids=["sync-search", "async-sandbox", "pipeline"],
)
def test_a_run_on_ray_workers_stores_the_calls_and_metrics_of_the_run_in_one_process(
    ray_cluster,  # noqa: F811
    tmp_path,
    scheduler,
    topology,
    overrides,
):
    here = _train(tmp_path, "here", topology, scheduler=scheduler, **overrides)
    there = _train(
        tmp_path, "there", topology, scheduler=scheduler, cluster="local", cluster_workers=2, **overrides
    )
    calls, metrics = _stored(here)
    calls_there, metrics_there = _stored(there)
    assert calls.keys() == calls_there.keys()
    differ = [key for key in calls if calls[key] != calls_there[key]]
    assert not differ, f"{len(differ)} of {len(calls)} calls drew other tokens on Ray, the first {differ[0]}"
    assert {v for (_, name), v in metrics_there.items() if name == "cluster/workers"} == {2.0}
    metrics_there = {key: v for key, v in metrics_there.items() if not key[1].startswith("cluster/")}
    assert metrics.keys() == metrics_there.keys()
    # the pipeline trains a step's calls worker by worker, in another order than one process: sums over them
    # (the entropy) may differ in the last bits
    rel = 1e-6 if scheduler == "pipeline" else 0.0
    changed = {
        k: (v, metrics_there[k])
        for k, v in metrics.items()
        if metrics_there[k] != v and not (rel and math.isclose(metrics_there[k], v, rel_tol=rel))
    }
    assert not changed, changed
    if not isinstance(topology, str):
        tools = wb.RunReader(there).calls()["tool_results"].dropna()
        assert sum(len(results) for results in tools) >= 4, "the tool answered calls"
