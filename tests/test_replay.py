"""Counterfactual replay: the prefix kept token for token, tools never re-run, the estimate, the stored run."""

import math

import pandas as pd
import pytest
from transformers import AutoTokenizer

import workbench as wb
from tests.scripted import ScriptedBackend, mars_script, matpo_script
from workbench.analysis import CallEstimate, Mean
from workbench.analysis.estimate import means
from workbench.backends.hf import HFBackend
from workbench.engine.forcing import Forcing, ReplayDivergence, ReplayUnsupported
from workbench.models import resolve
from workbench.store.records import CallRecord, EpisodeRecord
from workbench.tools import TOOL_KINDS, Tool, ToolResult, register_tool_kind

SEED = 7


@pytest.fixture(scope="module")
def tiny():
    backend = HFBackend("tiny")
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def source(tiny, tmp_path_factory):
    """A debate (5 calls: two openings, two rebuttals side by side, a judge) of the tiny model, seeded per call."""
    tasks = wb.generate_tasks("arithmetic", n=3, seed=1, level=1)
    result = wb.rollout(
        wb.load_topology("debate"),
        tasks,
        backend=tiny,
        max_tokens=6,
        runs_dir=tmp_path_factory.mktemp("runs"),
        seed=SEED,
        per_call_seeds=True,
    )
    with wb.RunReader(result.run_dir) as reader:
        calls = reader.calls(arrays="list")
    episode = int(calls["episode_id"].iloc[0])
    return result.run_dir, calls[calls["episode_id"] == episode].sort_values("position")


def _call_id(calls, position):
    return int(calls[calls["position"] == position]["id"].iloc[0])


def test_a_replay_from_the_first_call_reproduces_the_stored_episode(tiny, source):
    run_dir, calls = source
    result = wb.replay(run_dir, _call_id(calls, 0), n=1, arms=["resample"], backend=tiny)
    (episode,) = result.arms["resample"]
    assert not any("replayed_from" in c.timings for c in episode.calls)  # nothing forced: all sampled again
    assert [c.position for c in episode.calls] == list(calls["position"])
    for call, (_, stored) in zip(episode.calls, calls.iterrows(), strict=True):
        assert call.role == stored["role"]
        assert call.prompt_ids == list(stored["prompt_ids"])
        assert call.completion_ids == list(stored["completion_ids"])
        assert call.completion_text == stored["completion_text"]
        assert call.logprobs == pytest.approx(list(stored["logprobs"]), abs=1e-4)  # other batch shapes
    with wb.RunReader(run_dir) as reader:
        assert episode.reward == reader.episodes()["reward"].iloc[0]


def test_the_prefix_is_kept_token_for_token_and_the_replay_is_a_run_linked_to_its_source(tiny, source):
    run_dir, calls = source
    judge = _call_id(calls, 4)
    result = wb.replay(run_dir, judge, n=2, backend=tiny)
    assert set(result.arms) == {"keep", "resample"}
    for episodes in result.arms.values():
        for episode in episodes:
            for call in episode.calls:
                stored = calls[calls["position"] == call.position].iloc[0]
                if call.position < 4:
                    assert call.timings["replayed_from"] == int(stored["id"])
                    assert call.prompt_ids == list(stored["prompt_ids"])
                    assert call.completion_ids == list(stored["completion_ids"])
                    assert call.completion_text == stored["completion_text"]
                else:  # the judge: same prompt, sampled again (resample) or kept
                    assert call.prompt_ids == list(stored["prompt_ids"])
    kept = [e.calls[-1].completion_ids for e in result.arms["keep"]]
    assert kept == [list(calls["completion_ids"].iloc[4])] * 2
    with wb.RunReader(result.run_dir) as reader:
        config = reader.config
        assert config["kind"] == "replay"
        assert config["source"]["call_id"] == judge and config["source"]["position"] == 4
        assert config["source"]["run_dir"] == str(run_dir)
        assert list(reader.steps()["episodes"]) == [2, 2]  # one step per arm
        assert list(reader.events(kind="replay_arm")["payload"].map(lambda p: p["arm"])) == [
            "keep",
            "resample",
        ]
        assert len(reader.calls(step=0)) == 2 * 5
    assert isinstance(result.estimate, CallEstimate)
    frame = result.estimate.frame()
    assert {"q", "v", "advantage", "advantage_se", "grpo_advantage"} <= set(frame.columns)
    assert frame.loc["episode", "n_q"] == 2


def test_a_replacement_text_is_the_calls_completion_and_what_follows_reads_it(tiny, source):
    run_dir, calls = source
    text = "The answer is 42 because I say so."
    result = wb.replay(run_dir, _call_id(calls, 1), n=2, arms=["replace"], replacement=text, backend=tiny)
    for episode in result.arms["replace"]:
        debater_b = episode.calls[1]
        assert debater_b.role == "debater_b" and debater_b.completion_text == text
        assert debater_b.timings.get("replaced") == 1.0
        rebuttals = [c for c in episode.calls if c.role == "rebuttal"]
        assert len(rebuttals) == 2 and all(text in c.prompt_text for c in rebuttals)
        assert episode.calls[0].completion_ids == list(calls["completion_ids"].iloc[0])


def test_a_changed_spec_is_refused_as_a_divergence(tiny, source, monkeypatch):
    import workbench.analysis.replay as replay_module
    from workbench.analysis.replay_source import load_source
    from workbench.engine.spec_checks import from_dict

    run_dir, calls = source
    changed = load_source(run_dir, _call_id(calls, 2))
    spec = changed.config["topology"]
    spec["roles"]["debater_a"]["messages"][0]["content"] = "Changed: {{ question }}"
    changed.topology = from_dict(spec)
    monkeypatch.setattr(replay_module, "load_source", lambda *args: changed)
    with pytest.raises(ReplayDivergence, match=r"call 0 \(debater_a\)"):
        wb.replay(run_dir, _call_id(calls, 2), n=1, arms=["resample"], backend=tiny)


def test_a_batch_replays_a_roles_calls_and_reads_back_the_estimates_it_computed(tiny, source):
    from workbench.analysis.replay_runs import stored_estimate

    run_dir, _ = source
    with pytest.raises(ValueError, match="its roles there: debater_a, debater_b, judge, rebuttal"):
        wb.replay_calls(run_dir, role="critic", backend=tiny)
    batch = wb.replay_calls(run_dir, role="judge", sample=2, n=2, backend=tiny)
    with wb.RunReader(run_dir) as reader:
        judges = set(reader.calls(columns=["role"]).query("role == 'judge'")["id"])
    frame = batch.frame()
    assert len(frame) == 2 and set(frame["call_id"]) <= judges and list(frame["status"]) == ["finished"] * 2
    for result, (_, row) in zip(batch.results, frame.iterrows(), strict=True):
        stored = stored_estimate(result.run_dir)  # read back from the store: what the replay computed
        assert stored.q.keys() == result.estimate.q.keys() and stored.v.keys() == result.estimate.v.keys()
        for name, q in result.estimate.q.items():
            assert (
                stored.q[name].mean == pytest.approx(q.mean) and stored.v[name].n == result.estimate.v[name].n
            )
        assert row["advantage"] == pytest.approx(result.estimate.advantage_of(row["outcome"]).mean)


def test_a_background_batch_replays_each_call_in_a_run_that_exists_at_once(source, tmp_path):
    run_dir, calls = source
    ids = [_call_id(calls, 0), _call_id(calls, 4)]
    with pytest.raises(ValueError, match="by name"):
        wb.replay_calls(run_dir, calls=ids, policies={"base": HFBackend}, background=True)
    job = wb.replay_calls(
        run_dir, calls=ids, n=1, policies={"base": "tiny"}, max_tokens=6, runs_dir=tmp_path, background=True
    )
    assert [p.parent for p in job.runs] == [tmp_path, tmp_path] and job.status in ("running", "finished")
    assert job.wait(timeout=300) == "finished", job.log()
    frame = job.frame()
    assert list(frame["call_id"]) == ids and frame["q"].notna().all() and frame["v"].notna().all()
    with wb.RunReader(job.runs[1]) as reader:
        assert reader.config["policies"] == {"base": "tiny"} and len(reader.calls(step=0)) == 5


def _scripted_run(topology: str, script_of, marker: str, tmp_path):
    """One scripted episode of ``topology`` on a multihop task, stored; its answers become ``marker`` wherever
    a prompt holds it (so a replay's new text shows downstream). The tokenizer, task, backend, run, calls."""
    tokenizer = AutoTokenizer.from_pretrained(resolve("tiny"))
    task = wb.generate_tasks("multihop", n=1, seed=5, hops=1)[0]
    backend = ScriptedBackend(
        tokenizer, script_of(task, lambda prompt: marker if marker in prompt else task.answer)
    )
    run = wb.rollout(topology, [task], backend=backend, runs_dir=tmp_path)
    with wb.RunReader(run.run_dir) as reader:
        return tokenizer, task, backend, run.run_dir, reader.calls(arrays="list").set_index("position")


def test_a_nested_call_replays_with_its_parents_later_turns_sampled_again(tmp_path):
    """MATPO's worker runs inside the planner (an agent used as a tool). A replay from the worker keeps the
    planner's turn that delegated to it; the planner's turn after the worker returns reads the new worker."""
    tokenizer, task, backend, run_dir, calls = _scripted_run("matpo", matpo_script, "999", tmp_path)
    assert list(calls["role"]) == ["planner", "worker"] and calls.loc[1, "parent_id"] == calls.loc[0, "id"]
    worker = int(calls.loc[1, "id"])
    result = wb.replay(
        run_dir, worker, n=1, arms=["keep", "replace"], replacement="Maybe 999.", backend=backend
    )
    assert result.source.ancestors == {0}
    kept, replaced = result.arms["keep"][0], result.arms["replace"][0]
    delegation = list(calls.loc[0, "completion_ids"])[: len(tokenizer("Delegate.")["input_ids"])]
    for episode in (kept, replaced):
        planner = episode.calls[0]
        assert planner.timings["replayed_from"] == int(calls.loc[0, "id"])  # its first turn kept
        assert planner.completion_ids[: len(delegation)] == delegation
    assert kept.calls[1].completion_ids == list(calls.loc[1, "completion_ids"])  # the worker kept whole
    assert kept.answer == task.answer and kept.calls[0].completion_ids == list(calls.loc[0, "completion_ids"])
    assert tokenizer.decode(replaced.calls[1].completion_ids).startswith("Maybe 999.")  # its first turn
    read_afresh = tokenizer.decode(replaced.calls[0].completion_ids)  # the planner's turns, the worker's text
    assert replaced.answer == "999" and "The answer is 999" in read_afresh
    assert result.estimate is None and set(means([replaced], 1, {0})) == {
        "episode",
        "role/planner",
        "role/worker",
    }


def test_a_routed_tools_output_is_distilled_again_from_the_store_and_never_fetched(monkeypatch, tmp_path):
    """MARS routes search results through System 1 (nested calls). A replay from a System 1 call distils the
    stored documents again (the search never runs), and System 2's later turns read the new summary."""

    import workbench.tools as tools

    tokenizer, task, backend, run_dir, calls = _scripted_run("mars", mars_script, "777", tmp_path)
    system1 = calls[calls["role"] == "system1"]
    assert len(system1) >= 1 and calls.loc[0, "tool_results"][0]["documents"]  # the raw output is kept
    ran = []
    real = tools.run_tool
    monkeypatch.setattr(
        tools, "run_tool", lambda tool, arguments, **kw: ran.append(arguments) or real(tool, arguments, **kw)
    )
    result = wb.replay(run_dir, int(system1["id"].iloc[0]), n=1, arms=["replace"], replacement="Fact: 777.",
                       backend=backend)  # fmt: skip
    (replayed,) = result.arms["replace"]
    assert replayed.answer == "777" and [a for a in ran if "queries" in a] == []  # search not run; python was
    assert [a for a in ran if "code" in a] and replayed.calls[0].tool_results[0]["documents"] == list(
        calls.loc[0, "tool_results"][0]["documents"]
    )
    older = [{k: v for k, v in r.items() if k != "documents"} for r in calls.loc[0, "tool_results"]]
    source = result.source
    source.calls[0].tool_results = older  # as a run stored before documents were kept
    with pytest.raises(ReplayUnsupported, match="raw output was not stored"):
        Forcing(source.calls, source.position).tool_result(0, 0, "search")


class Counting(Tool):
    """Returns a long text (longer than the store keeps in ``tool_results``) and counts its runs."""

    name = "count"
    description = "Counts."
    parameters = {"type": "object", "properties": {}}
    runs = 0

    async def __call__(self, **arguments):
        Counting.runs += 1
        return ToolResult(ok=True, content="start " + " ".join(f"w{i}" for i in range(900)) + " end")


AGENT_SPEC = {
    "name": "counted",
    "tools": {"count": {"kind": "counting", "description": "Counts."}},
    "roles": {
        "solver": {"messages": [{"role": "user", "content": "{{ question }}"}]},
        "checker": {"messages": [{"role": "user", "content": "Check: {{ reply }}"}]},
    },
    "flow": {
        "start": "solve",
        "nodes": {
            "solve": {
                "agent": "solver",
                "tools": ["count"],
                "bind": {"reply": "text"},
                "next": [{"goto": "check"}],
            },
            "check": {"call": "checker", "bind": {"checked": "text"}},
        },
        "answer": "{{ reply }}",
    },
}


def test_a_grouped_episode_replays_the_branch_of_its_call(tiny, tmp_path):
    """marsrl_cpu fans out (4 Solvers, each solution checked once and judged 4 times): a replay from one
    verdict keeps that verdict's Solver and check, and re-runs one branch of the group."""
    tasks = wb.generate_tasks("arithmetic", n=1, seed=2, level=1, format="plain")
    run = wb.rollout(
        "marsrl_cpu", tasks, backend=tiny, group_size=4, max_tokens=6, runs_dir=tmp_path, seed=SEED
    )
    with wb.RunReader(run.run_dir) as reader:
        calls = reader.calls(arrays="list")
    episode = calls[calls["episode_id"] == calls["episode_id"].iloc[0]].set_index("id")
    assert list(episode["role"].value_counts().sort_index()) == [1, 1, 4]  # checker, solver, verifier1
    verdict = episode[episode["role"] == "verifier1"].index[-1]
    path = [verdict]
    while not pd.isna(episode.loc[path[-1], "previous_id"]):
        path.append(int(episode.loc[path[-1], "previous_id"]))
    assert list(episode.loc[path[::-1], "role"]) == ["solver", "checker", "verifier1"]

    result = wb.replay(run.run_dir, int(verdict), n=2, backend=tiny)
    assert result.source.position == 2 and result.source.call_id == verdict
    for arm, episodes in result.arms.items():
        for replayed in episodes:
            assert [c.role for c in replayed.calls] == ["solver", "checker", "verifier1"]
            for call, stored_id in zip(replayed.calls, path[::-1], strict=True):
                stored = episode.loc[stored_id]
                if call.role != "verifier1" or arm == "keep":
                    assert call.timings["replayed_from"] == stored_id
                    assert call.completion_ids == list(stored["completion_ids"])
                assert call.prompt_ids == list(stored["prompt_ids"])  # the verdict's prompt too
    assert set(result.estimate.q) == {"episode", "role/verifier1"}  # the verdict is the last call
    first_solver = int(episode[episode["role"] == "solver"].index[0])
    assert [c.role for c in wb.replay(run.run_dir, first_solver, n=1, arms=["resample"], backend=tiny)
            .arms["resample"][0].calls] == ["solver", "checker", "verifier1"]  # fmt: skip


def test_a_replay_from_each_sample_of_a_grouped_call_reproduces_that_sample(tiny, tmp_path):
    """marsrl_cpu with G = 2 judges each solution twice (``select``): two sibling verdicts on one branch. With
    per-call seeds, the resampled verdict of a replay from either one is that verdict again, token for token
    (its own stored seed, not its sibling's)."""
    tasks = wb.generate_tasks("arithmetic", n=1, seed=2, level=1, format="plain")
    run = wb.rollout("marsrl_cpu", tasks, backend=tiny, group_size=2, max_tokens=6, runs_dir=tmp_path, seed=SEED,
                     per_call_seeds=True)  # fmt: skip
    with wb.RunReader(run.run_dir) as reader:
        calls = reader.calls(arrays="list")
    episode = calls[calls["episode_id"] == calls["episode_id"].max()]  # the group's second episode (sample 1)
    verdicts = episode[episode["role"] == "verifier1"].sort_values("position")
    assert len(verdicts) == 2 and verdicts["previous_id"].nunique() == 1, "two samples of one call"
    stored = [list(ids) for ids in verdicts["completion_ids"]]
    assert stored[0] != stored[1], "the siblings' verdicts differ (else the test could not tell them apart)"
    for k, (call_id, completion) in enumerate(zip(verdicts["id"], stored, strict=True)):
        result = wb.replay(run.run_dir, int(call_id), n=1, arms=["resample"], backend=tiny)
        replayed = result.arms["resample"][0].calls[-1]
        assert replayed.role == "verifier1" and replayed.completion_ids == completion, f"sample {k}"


def test_tools_are_replayed_from_the_store_never_run_again(tmp_path):
    register_tool_kind("counting", Counting, replace=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(resolve("tiny"))

        def script(prompt: str) -> str:
            if "Check:" in prompt:
                return "fine"
            if prompt.count("<tool_response>") == 0:
                return '<tool_call>{"name": "count", "arguments": {}}</tool_call>'
            return "<answer>7</answer>"

        backend = ScriptedBackend(tokenizer, script)
        task = wb.generate_tasks("arithmetic", n=1, seed=2, level=1)
        topology = wb.topology_from_dict(AGENT_SPEC)
        source = wb.rollout(
            topology, task, backend=backend, runs_dir=tmp_path, seed=SEED, per_call_seeds=True
        )
        assert Counting.runs == 1
        with wb.RunReader(source.run_dir) as reader:
            calls = reader.calls(arrays="list").sort_values("position")
        solver = calls.iloc[0]
        assert solver["tool_results"][0]["text"].endswith("more]")  # the store capped it
        result = wb.replay(source.run_dir, int(calls.iloc[1]["id"]), n=3, backend=backend)
        assert Counting.runs == 1, "a replay ran a tool of its prefix again"
        for episodes in result.arms.values():
            for episode in episodes:
                replayed = episode.calls[0]
                assert replayed.completion_ids == list(solver["completion_ids"])
                assert replayed.tool_results[0]["text"] == solver["tool_results"][0]["text"]
        # replaying the agent call itself (resample) runs its tool again, as it should
        wb.replay(source.run_dir, int(solver["id"]), n=1, arms=["resample"], backend=backend)
        assert Counting.runs == 2
    finally:
        TOOL_KINDS.pop("counting", None)


def _episode(reward, roles):
    calls = [
        CallRecord(role=r, node="", position=p, finish_reason="stop", trainable=True, rewards={"reward": v})
        for p, (r, v) in enumerate(roles)
    ]
    return EpisodeRecord("t", "t", 0, reward=reward, calls=calls)


def test_the_estimate_is_q_minus_v_with_the_standard_error_of_a_difference():
    keep = [_episode(r, [("a", 9.0), ("b", r)]) for r in (1.0, 1.0, 0.0, 1.0)]
    resample = [_episode(r, [("a", 9.0), ("b", r / 2)]) for r in (0.0, 1.0, 0.0, 0.0)]
    q, v = means(keep, point=0), means(resample, point=0)
    assert set(q) == {"episode", "role/a", "role/b"}  # role a's call is the replayed one (position 0)
    assert q["role/a"].mean == v["role/a"].mean == 9.0
    assert q["episode"].mean == 0.75 and v["episode"].mean == 0.25
    se_q = math.sqrt(0.25 / 4)  # sample variance of (1, 1, 0, 1) is 0.25
    assert q["episode"].stderr == pytest.approx(se_q)
    estimate = CallEstimate(3, "a", q, v, grpo_advantage=0.4)
    assert estimate.advantage.mean == pytest.approx(0.5)
    assert estimate.advantage.stderr == pytest.approx(math.hypot(se_q, se_q))
    frame = estimate.frame()
    assert frame.loc["role/b", "v"] == pytest.approx(0.125)
    assert frame.loc["episode", "grpo_advantage"] == 0.4
    assert math.isnan(Mean.of([1.0]).stderr) and Mean.of([]).n == 0


def test_a_training_runs_checkpoint_plays_a_policy(tmp_path):
    from workbench.rl import checkpoint
    from workbench.rl.config import TrainConfig
    from workbench.training import create, run_training

    config = TrainConfig(
        model="tiny", topology="debate", tasks="arithmetic", task_options={"level": 1},
        n_tasks=4, steps=1, batch_size=2, group_size=2, max_tokens=6, learning_rate=1e-2, eval_tasks=0,
        checkpoint_every=1, runs_dir=str(tmp_path),
        entropy_coef=0.01,  # the tiny model earns no reward here: the bonus alone moves the weights
    )  # fmt: skip
    run_dir = create(config)
    assert run_training(config, run_dir, log=lambda _: None) == "finished"
    (kept,) = [int(p.name.split("-")[1]) for p in checkpoint.complete(run_dir)]
    with wb.RunReader(run_dir) as reader:
        first = reader.calls(columns=["id", "role", "position"]).query("position == 0")
    call_id, role = int(first["id"].iloc[0]), first["role"].iloc[0]

    def resampled(**policies):
        result = wb.replay(run_dir, call_id, n=1, arms=["resample"], seed=SEED, policies=policies)
        (episode,) = result.arms["resample"]
        return next(c for c in episode.calls if c.role == role), result.run_dir

    base, _ = resampled()
    trained, replay_dir = resampled(base=f"step:{kept}")
    assert trained.prompt_ids == base.prompt_ids  # the same state, the same seeds
    assert trained.logprobs[0] != pytest.approx(base.logprobs[0], abs=1e-6), "the checkpoint's weights played"
    with wb.RunReader(replay_dir) as reader:
        assert f"step:{kept}" in str(reader.config["policies"])
