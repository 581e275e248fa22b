"""The engine's agent mechanics on scripted outputs: tool loops, System 1 routing, agents as tools, masks."""

import asyncio
import json

import pytest
from transformers import AutoTokenizer

import workbench as wb
from tests.scripted import ScriptedBackend, mars_script, matpo_script
from workbench.engine import Rollout
from workbench.models import resolve
from workbench.store.codec import TokenOwner


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve("tiny"))


@pytest.fixture(scope="module")
def task():
    return wb.generate_tasks("multihop", n=1, seed=5, hops=1)[0]  # its own knowledge base, not the default


def _owned(call, owner):
    return [t for t, m in zip(call.completion_ids, call.mask, strict=True) if m == owner]


def test_mars_routes_search_through_system1_and_passes_python_straight_back(tokenizer, task):
    backend = ScriptedBackend(tokenizer, mars_script(task))
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
    # the whole interleaved completion as text, by owner; each tool result's text beside its summary
    transcript = system2.parsed["transcript"]
    assert "".join(s["text"] for s in transcript) == tokenizer.decode(system2.completion_ids)
    assert transcript[0]["owner"] == "trainable" and {"tool", "other_role"} <= {
        s["owner"] for s in transcript
    }
    assert system2.completion_text in transcript[-1]["text"]  # completion_text: the last turn only
    assert "Distilled" in system2.tool_results[0]["text"] and "42" in system2.tool_results[1]["text"]
    # the search ran over the task's own corpus: a supporting document reached System 1
    supporting = {f"kb://{doc}" for hop in task.metadata["supporting_docs"] for doc in hop}
    assert any(url in call.prompt_text for call in system1 for url in supporting)


def test_a_rollout_makes_every_tool_of_its_tasks_before_the_first_generation(tokenizer, monkeypatch):
    """Made on an episode's first call, a tool's thread hop let the hf backend's micro-batcher close a batch
    before some episodes' next requests came, a different batch each run: a seeded training run with tools
    drew other tokens every time. Made before the episodes start, nothing waits on a thread mid-rollout."""
    import workbench.tools

    events = []
    make_tool = workbench.tools.make_tool

    def recording(kind, **options):
        events.append(("made", kind, options.get("kb_seed")))
        return make_tool(kind, **options)

    class Recording(ScriptedBackend):
        async def generate(self, request):
            events.append(("generate",))
            return await super().generate(request)

    monkeypatch.setattr(workbench.tools, "make_tool", recording)
    tasks = [wb.generate_tasks("multihop", n=1, seed=seed, hops=1)[0] for seed in (5, 6)]
    engine = Rollout(wb.load_topology("mars"), Recording(tokenizer, mars_script(tasks[0])))
    episodes = asyncio.run(engine.run(tasks, group_size=2))
    assert [e.status for e in episodes] == ["complete"] * 4
    first = events.index(("generate",))
    # search and scholar over each task's own knowledge base, and the python tool: all before any generation
    assert sorted(events[:first], key=str) == sorted(
        [("made", "bm25", kb) for kb in (5, 6) for _ in ("search", "scholar")] + [("made", "python", None)],
        key=str,
    )
    assert all(event == ("generate",) for event in events[first:])


def test_mars_cpu_continues_a_prefilled_transcript_and_routes_one_document_through_system1(tokenizer, task):
    entity = task.metadata["start"]

    def script(prompt: str) -> str:
        if prompt.rstrip().endswith("Sentence:"):
            return f" The sentence about {entity}.\n"  # a real backend stops at the newline
        if "<information>" in prompt.split("Question: " + task.question)[-1]:
            return f"<answer>{task.answer}</answer>"
        return f"<search>{entity}</search>"

    backend = ScriptedBackend(tokenizer, script)
    episode = asyncio.run(Rollout(wb.load_topology("mars_cpu"), backend).episode(task))
    assert episode.status == "complete", episode.error
    assert episode.answer == task.answer
    system2, system1 = (next(c for c in episode.calls if c.role == r) for r in ("system2", "system1"))
    # the prefill is the end of the prompt, not part of the trained completion
    assert system2.prompt_text.endswith(f"Question: {task.question}\n")
    assert system1.prompt_text.rstrip().endswith(f"Question: {task.question}\nSentence:")
    assert system1.completion_text == f" The sentence about {entity}.\n"
    assert system2.tool_calls == [{"name": "search", "arguments": {"query": entity}}]
    # one document (top_k 1) of the task's own corpus reached System 1; its sentence came back in tags
    assert system1.prompt_text.count("URL: kb://") == 2  # the few-shot example's and the result's
    completion = tokenizer.decode(system2.completion_ids)
    assert f"\n<information> The sentence about {entity}.\n</information>\n<answer>" in completion
    assert "The sentence about" in tokenizer.decode(_owned(system2, TokenOwner.OTHER_ROLE))
    assert system2.rewards["reward"] == 1.0 == system1.rewards["reward"]  # the outcome, broadcast


def test_matpo_worker_runs_as_a_nested_agent_with_a_fresh_context(tokenizer, task):

    episode = asyncio.run(
        Rollout(wb.load_topology("matpo"), ScriptedBackend(tokenizer, matpo_script(task))).episode(task)
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
        "text": "Error: unknown tool 'teleport'; available: search, scholar, python",
    }
    assert "unknown tool 'teleport'" in tokenizer.decode(_owned(system2, TokenOwner.TOOL))


def test_hira_delegates_through_router_expert_and_distiller_and_refuses_duplicates(tokenizer, task):
    def script(prompt: str) -> str:
        if "agent selection system" in prompt:
            return '```json\n{"reason": "facts", "selected_agent_name": "Search-Agent"}\n```'
        if "Summarization Agent" in prompt:
            return json.dumps(
                {
                    "conclusion": {"reasoning_process": "searched", "final_conclusion": task.answer},
                    "memory": {
                        "fact_memory": [f"the answer is {task.answer} [Source: kb]"],
                        "resource_memory": {},
                    },
                }
            )
        if "Solve the task by searching" in prompt:
            if prompt.count("<|begin_search_result|>") > 1:  # one is in the instructions
                return f"Found it. \\boxed{{{task.answer}}}"
            return f"<|begin_search_query|>{task.question}<|end_search_query|>"
        results = prompt.count("<|begin_subtask_result|>") - 1  # one is in the instructions
        if results < 2:  # the second call repeats the first and must be refused
            return "Plan.<|begin_call_subtask|>find the answer<|end_call_subtask|>"
        return f"So the answer is \\boxed{{{task.answer}}}."

    episode = asyncio.run(Rollout(wb.load_topology("hira"), ScriptedBackend(tokenizer, script)).episode(task))
    assert episode.status == "complete", episode.error
    assert episode.answer == task.answer
    planner = next(c for c in episode.calls if c.role == "meta_planner")
    assert [r["error"] for r in planner.tool_results] == [None, "duplicate call"]
    assert [c.role for c in episode.calls if c.parent == planner.position] == [
        "router",
        "search_expert",
        "distiller",
    ]
    assert episode.variables["memory"][0].startswith("the answer is")
    seen = tokenizer.decode(_owned(planner, TokenOwner.OTHER_ROLE))
    assert "Result from Search-Agent:" in seen and "Final Conclusion:" in seen
    assert "You have already called this sub-task" in tokenizer.decode(_owned(planner, TokenOwner.TOOL))


GRAPH = """<thinking>split it</thinking>
<agent><agent_id>A1</agent_id><agent_name>CoTAgent</agent_name><agent_description>solve</agent_description>
<required_arguments><agent_input>first part</agent_input></required_arguments></agent>
<agent><agent_id>A2</agent_id><agent_name>CoTAgent</agent_name><agent_description>more</agent_description>
<required_arguments><agent_input>second part</agent_input></required_arguments></agent>
<agent><agent_id>SINK</agent_id><agent_name>SCAgent</agent_name><agent_description>combine</agent_description>
<required_arguments><agent_input>combine ${A1} and ${A2}</agent_input></required_arguments></agent>
<edge><from>A1</from><to>SINK</to><from>A2</from><to>SINK</to></edge>"""


def test_mas_orchestra_runs_the_emitted_graph_in_topological_order(tokenizer):
    task = wb.generate_tasks("masbench", n=1, seed=0, axis="depth", values=2)[0]

    def script(prompt: str) -> str:
        if "orchestrator of a multi-agent system" in prompt:
            return GRAPH
        if "Current Sub-task: first part" in prompt:
            return "A1 says \\boxed{3}"
        if "Current Sub-task: second part" in prompt:
            return "A2 says \\boxed{4}"
        assert "combine A1 says \\boxed{3} and A2 says \\boxed{4}" in prompt  # ${ID} substitution
        return "\\boxed{7}"

    episode = asyncio.run(
        Rollout(wb.load_topology("mas_orchestra"), ScriptedBackend(tokenizer, script)).episode(task)
    )
    assert episode.status == "complete", episode.error
    assert episode.answer == "Answer: \\boxed{7}"
    roles = [c.role for c in episode.calls]
    assert (
        roles[0] == "orchestrator" and roles.count("cot_agent") == 2 + 5
    )  # two CoT agents, SC's five samples
    assert episode.calls[0].parsed["sink"] == "SINK" and episode.calls[0].parsed["order"] == [
        ["A1", "A2"],
        ["SINK"],
    ]


# A1 -> A2 <-> A3 -> SINK: one start, one sink, and a cycle in between.
CYCLE = GRAPH.replace(
    "<edge><from>A1</from><to>SINK</to><from>A2</from><to>SINK</to></edge>",
    "<agent><agent_id>A3</agent_id><agent_name>CoTAgent</agent_name><required_arguments><agent_input>x"
    "</agent_input></required_arguments></agent><edge><from>A1</from><to>A2</to><from>A2</from><to>A3</to>"
    "<from>A3</from><to>A2</to><from>A3</from><to>SINK</to></edge>",
)


@pytest.mark.parametrize(
    ("graph", "error"),
    [
        (GRAPH.replace("<from>A2</from><to>SINK</to>", ""), "exactly one sink"),
        (CYCLE, "cycle"),
        (
            GRAPH.replace("<edge><from>A1</from><to>SINK</to><from>A2</from><to>SINK</to></edge>", ""),
            "require edges",
        ),
        (
            GRAPH.replace(
                "<to>SINK</to><from>A2</from><to>SINK</to>", "<to>SINK</to><from>A2</from><to>NOPE</to>"
            ),
            "NOPE",
        ),
    ],
)
def test_an_invalid_graph_is_a_format_failure_and_scores_nothing(tokenizer, graph, error):
    task = wb.generate_tasks("masbench", n=1, seed=0, axis="depth", values=2)[0]
    engine = Rollout(wb.load_topology("mas_orchestra"), ScriptedBackend(tokenizer, lambda prompt: graph))
    episode = asyncio.run(engine.episode(task))
    assert episode.status == "complete" and episode.answer == ""
    assert len(episode.calls) == 1 and error in episode.calls[0].format_error


@pytest.mark.parametrize(
    ("verdicts", "answer", "calls"),
    [
        # wrong once, corrected, then four passes in a row: accepted
        (
            ["Wrong", "Correct", "Correct", "Correct", "Correct"],
            "fixed",
            ["solver", "verifier", "corrector"] + ["verifier"] * 4,
        ),
        # never four in a row within ten rounds: the most often verified candidate wins
        (["Correct", "Wrong"] + ["Correct", "Correct", "Correct", "Wrong"] * 5, "fixed", None),
    ],
)
def test_marsrl_inference_accepts_after_four_passes_or_falls_back(tokenizer, verdicts, answer, calls):
    task = wb.generate_tasks("arithmetic", n=1, seed=0, level=1)[0]
    said = iter(verdicts)

    def script(prompt: str) -> str:
        if "meticulous grader" in prompt:
            return f"**Final Verdict** ok\n**Correctness**: {next(said)}"
        if "bug report" in prompt:
            return "fixed"
        return "first"

    episode = asyncio.run(
        Rollout(wb.load_topology("marsrl_inference"), ScriptedBackend(tokenizer, script)).episode(task)
    )
    assert episode.status == "complete", episode.error
    assert episode.answer == answer
    if calls:
        assert [c.role for c in episode.calls] == calls
    else:
        assert episode.variables["rounds"] == 11 and episode.variables["streak"] < 4
        assert episode.variables["passes"][0] == 1 and max(episode.variables["passes"]) == 3


def test_hira_keeps_a_fact_two_experts_report_once_in_memory(tokenizer, task):
    fact = f"the answer is {task.answer} [Source: kb]"

    def script(prompt: str) -> str:
        if "agent selection system" in prompt:
            return '{"reason": "facts", "selected_agent_name": "Search-Agent"}'
        if "Summarization Agent" in prompt:
            conclusion = {"reasoning_process": "searched", "final_conclusion": task.answer}
            return json.dumps(
                {"conclusion": conclusion, "memory": {"fact_memory": [fact], "resource_memory": {}}}
            )
        if "Solve the task by searching" in prompt:
            return f"Found it. \\boxed{{{task.answer}}}"
        results = prompt.count("<|begin_subtask_result|>") - 1  # one is in the instructions
        if results < 2:  # two different subtasks, whose experts report the same fact
            return f"Plan.<|begin_call_subtask|>subtask {results}<|end_call_subtask|>"
        return f"So the answer is \\boxed{{{task.answer}}}."

    episode = asyncio.run(Rollout(wb.load_topology("hira"), ScriptedBackend(tokenizer, script)).episode(task))
    assert episode.status == "complete", episode.error
    memory = episode.variables["memory"]
    assert memory.count(fact) == 1
    assert [m for m in memory if m.startswith("Result for")] == [
        f"Result for subtask {i}: {task.answer}" for i in range(2)
    ]


def test_the_store_keeps_an_agent_calls_transcript_and_tool_result_texts(tokenizer, task, tmp_path):
    def script(prompt: str) -> str:
        if prompt.count("<tool_response>") == 0:
            return '<tool_call>{"name": "python", "arguments": {"code": "print(6*7)"}}</tool_call>'
        return "<answer>42</answer>"

    result = wb.rollout(
        wb.load_topology("mars"), [task], backend=ScriptedBackend(tokenizer, script), runs_dir=tmp_path
    )
    reader = wb.RunReader(result.run_dir)
    calls = reader.calls()
    system2 = calls[calls["role"] == "system2"].iloc[0]
    assert "42" in system2["tool_results"][0]["text"]
    transcript = reader.transcript(int(system2["id"]))
    assert [s["owner"] for s in transcript][:2] == ["trainable", "tool"] and "42" in transcript[1]["text"]
    assert "<answer>42</answer>" in transcript[-1]["text"] and transcript[-1]["owner"] == "trainable"
