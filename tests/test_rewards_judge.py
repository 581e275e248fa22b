"""LLM-as-judge rewards: the papers' prompts and parsers on a scripted backend, and one real-model run."""

from __future__ import annotations

import asyncio
import time

import pytest
from transformers import AutoTokenizer

from tests.scripted import ScriptedBackend
from workbench.models import resolve
from workbench.rewards import JUDGE_PROMPTS, Judgement, JudgePrompt, LLMJudge

QUESTION = "Which river flows through the city of Qarvell? {not a field}"
RESPONSE = "After searching, the river is the Lune {x}. \\boxed{Lune}"
REFERENCE = "the River Lune"


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve("tiny"))


class RecordingBackend(ScriptedBackend):
    """A scripted judge that also keeps the requests it was sent."""

    def __init__(self, tokenizer, script):
        super().__init__(tokenizer, script)
        self.requests = []

    async def generate(self, request):
        self.requests.append(request)
        return await super().generate(request)


def run(coroutine):
    return asyncio.run(coroutine)


def test_the_papers_prompts_are_there():
    assert {"hle", "simpleqa", "hira_qa", "hira_webwalker", "mas_orchestra"} <= set(JUDGE_PROMPTS)
    assert "[correct_answer]: {correct_answer}" in JUDGE_PROMPTS["hle"].template
    assert 'Just return the letters "A", "B", or "C"' in JUDGE_PROMPTS["simpleqa"].template
    assert "Labeled Answer: {labeled_answer}" in JUDGE_PROMPTS["hira_qa"].template
    assert "in terms of core content" in JUDGE_PROMPTS["hira_webwalker"].template


@pytest.mark.parametrize("name", sorted(JUDGE_PROMPTS))
def test_prompt_sent_holds_question_response_reference(tokenizer, name):
    backend = RecordingBackend(tokenizer, lambda prompt: "")
    judge = LLMJudge(backend, prompt=name, temperature=0.0)
    run(judge.judge(QUESTION, RESPONSE, REFERENCE))
    (sent,) = backend.prompts
    assert RESPONSE in sent and REFERENCE in sent  # values go in verbatim, braces included
    if "{question}" in JUDGE_PROMPTS[name].template:
        assert QUESTION in sent
    assert sent.startswith("<|im_start|>user\n") and sent.endswith("<|im_start|>assistant\n")
    for field in ("{question}", "{response}", "{correct_answer}", "{labeled_answer}", "{pred_answer}"):
        assert field not in sent
    (request,) = backend.requests
    assert request.max_tokens == JUDGE_PROMPTS[name].max_tokens and request.temperature == 0.0


READABLE = [
    (
        "hle",
        "extracted_final_answer: Lune\nreasoning: same river.\ncorrect: yes\nconfidence: 90%",
        1.0,
        "yes",
    ),
    (
        "hle",
        "extracted_final_answer: Tees\nreasoning: a different river.\ncorrect: no\nconfidence: 80",
        0.0,
        "no",
    ),
    ("hle", "**extracted_final_answer:** Lune\n**correct:** Yes", 1.0, "yes"),
    ("hle", "correct: yes\n...on reflection...\ncorrect: no", 0.0, "no"),
    ("simpleqa", "A", 1.0, "CORRECT"),
    ("simpleqa", "B", 0.0, "INCORRECT"),
    ("simpleqa", "C", 0.0, "NOT_ATTEMPTED"),
    ("simpleqa", ' "A".', 1.0, "CORRECT"),
    ("simpleqa", "C: NOT_ATTEMPTED", 0.0, "NOT_ATTEMPTED"),
    ("simpleqa", "NOT ATTEMPTED", 0.0, "NOT_ATTEMPTED"),
    ("simpleqa", "The grade is CORRECT", 1.0, "CORRECT"),
    ("hira_qa", "Correct", 1.0, "Correct"),
    ("hira_qa", "Incorrect", 0.0, "Incorrect"),
    ("hira_qa", "correct.", 1.0, "Correct"),
    ("hira_qa", "The model output is not correct.", 0.0, "Incorrect"),
    ("hira_webwalker", "Correct", 1.0, "Correct"),
    ("hira_webwalker", "That is wrong", 0.0, "Incorrect"),
    ("mas_orchestra", "The answers match.\n<correct>yes</correct>", 1.0, "yes"),
    ("mas_orchestra", "<correct> NO </correct>", 0.0, "no"),
]


@pytest.mark.parametrize("name, reply, score, verdict", READABLE)
def test_readable_judgements(tokenizer, name, reply, score, verdict):
    judge = LLMJudge(ScriptedBackend(tokenizer, lambda prompt: reply), prompt=name)
    judgement = run(judge.judge(QUESTION, RESPONSE, REFERENCE))
    assert judgement == Judgement(score, verdict, reply, None)


UNREADABLE = [
    ("hle", "The response looks right to me."),
    ("hle", "correct: maybe"),
    ("simpleqa", "D"),
    ("simpleqa", "CORRECT or INCORRECT, hard to say"),
    ("simpleqa", ""),
    ("hira_qa", "I cannot tell."),
    ("hira_webwalker", "Equivalent"),
    ("mas_orchestra", "correct: yes"),
]


@pytest.mark.parametrize("name, reply", UNREADABLE)
def test_unreadable_judgements_score_zero_with_a_reason(tokenizer, name, reply):
    judge = LLMJudge(ScriptedBackend(tokenizer, lambda prompt: reply), prompt=name)
    judgement = run(judge.judge(QUESTION, RESPONSE, REFERENCE))
    assert judgement.score == 0.0 and judgement.verdict is None
    assert judgement.text == reply
    assert judgement.error.startswith("unreadable judgement")


def _items(n: int) -> list[tuple[str, str, str]]:
    return [(f"question {k}?", f"answer {k}", f"gold {k}") for k in range(n)]


def test_one_failing_item_does_not_stop_the_others(tokenizer):
    def script(prompt: str) -> str:
        if "question 2?" in prompt:
            raise ConnectionError("judge server went away")
        return "correct: yes" if "question 1?" in prompt else "correct: no"

    judge = LLMJudge(ScriptedBackend(tokenizer, script), prompt="hle")
    judgements = run(judge.judge_many(_items(4)))
    assert [j.score for j in judgements] == [0.0, 1.0, 0.0, 0.0]
    assert [j.verdict for j in judgements] == ["no", "yes", None, "no"]
    assert [j.error is None for j in judgements] == [True, True, False, True]
    assert "ConnectionError" in judgements[2].error and "went away" in judgements[2].error


def test_judge_many_sends_every_item_before_any_answer(tokenizer):
    """A batching backend only batches what is pending at once: all items must be in flight together."""

    class Gate(ScriptedBackend):
        def __init__(self, tokenizer, n):
            super().__init__(tokenizer, lambda prompt: "A" if "question 0?" in prompt else "B")
            self.n, self.waiting, self.peak = n, 0, 0
            self.all_in = asyncio.Event()

        async def generate(self, request):
            self.waiting += 1
            self.peak = max(self.peak, self.waiting)
            if self.waiting == self.n:
                self.all_in.set()
            await asyncio.wait_for(self.all_in.wait(), timeout=5)
            return await super().generate(request)

    backend = Gate(tokenizer, 5)
    judgements = run(LLMJudge(backend, prompt="simpleqa").judge_many(_items(5)))
    assert backend.peak == 5
    assert [j.verdict for j in judgements] == ["CORRECT"] + ["INCORRECT"] * 4  # in the items' order


def test_retries_after_a_failure(tokenizer):
    calls = []

    def flaky(prompt: str) -> str:
        calls.append(prompt)
        if len(calls) % 2 == 1:
            raise TimeoutError("slow judge")
        return "Correct"

    once = run(LLMJudge(ScriptedBackend(tokenizer, flaky), prompt="hira_qa").judge("q", "r", "g"))
    assert once.score == 0.0 and "TimeoutError" in once.error
    calls.clear()
    retried = run(LLMJudge(ScriptedBackend(tokenizer, flaky), "hira_qa", retries=1).judge("q", "r", "g"))
    assert retried == Judgement(1.0, "Correct", "Correct", None) and len(calls) == 2


def test_judge_sync_from_plain_code_and_inside_a_running_loop(tokenizer):
    judge = LLMJudge(ScriptedBackend(tokenizer, lambda p: "correct: yes" if "gold 0" in p else "no"), "hle")
    assert judge.judge_sync("question 0?", "answer 0", "gold 0").score == 1.0

    async def notebook_cell() -> list[Judgement]:
        return judge.judge_many_sync(_items(2))  # a running loop here, as in Jupyter

    judgements = asyncio.run(notebook_cell())
    assert [j.score for j in judgements] == [1.0, 0.0]
    assert judgements[1].error.startswith("unreadable judgement")


def test_options_and_custom_prompts(tokenizer):
    with pytest.raises(ValueError, match="unknown judge prompt 'nope'.*hle"):
        LLMJudge(ScriptedBackend(tokenizer, str), prompt="nope")
    custom = JudgePrompt(
        "Q={question} R={response} G={correct_answer}", lambda t: (0.5, t.strip()), 4, "mine"
    )
    backend = RecordingBackend(tokenizer, lambda prompt: " half ")
    judgement = run(LLMJudge(backend, custom, max_tokens=9, temperature=0.7).judge("q1", "r1", "g1"))
    assert judgement == Judgement(0.5, "half", " half ", None)
    assert "Q=q1 R=r1 G=g1" in backend.prompts[0]
    assert (backend.requests[0].max_tokens, backend.requests[0].temperature) == (9, 0.7)


def test_real_model_judges_with_the_hle_prompt():
    """SmolLM2-135M as the judge: whatever it writes, every item gets a score in {0, 1} and its raw text."""
    from workbench.backends.hf import HFBackend

    backend = HFBackend("smollm2-135m")
    try:
        judge = LLMJudge(backend, prompt="hle", max_tokens=32)
        items = [
            ("What is 2+3?", "2 + 3 = 5, so the answer is 5.", "5"),
            ("What is the capital of France?", "The capital of France is Berlin.", "Paris"),
            ("How many legs does a spider have?", "Spiders have 8 legs.", "8"),
        ]
        start = time.perf_counter()
        judgements = judge.judge_many_sync(items)
        elapsed = time.perf_counter() - start
    finally:
        backend.close()
    assert len(judgements) == 3
    for judgement in judgements:
        assert judgement.score in (0.0, 1.0)
        assert judgement.text.strip()
        if judgement.error is None:
            assert judgement.verdict in ("yes", "no") and judgement.score == float(judgement.verdict == "yes")
        else:
            assert judgement.error.startswith("unreadable judgement") and judgement.score == 0.0
    print(
        f"3 judgements in {elapsed:.1f}s:", [(j.score, j.verdict, j.error, j.text[:60]) for j in judgements]
    )


# ---------------------------------------------------------------- a role's reward rule names a judge

JUDGED_SPEC = {
    "name": "judged",
    "roles": {
        "answerer": {
            "messages": [{"role": "user", "content": "{{ question }}"}],
            "parser": "boxed",
            "reward": {"kind": "answer", "judge": "simpleqa"},
        },
        "reviewer": {
            "messages": [{"role": "user", "content": "Review: {{ draft }}"}],
            "reward": {"kind": "outcome", "judge": "hle", "format_weight": 0.1},
        },
    },
    "flow": {
        "start": "draft",
        "answer": "{{ draft }}",
        "nodes": {
            "draft": {"call": "answerer", "bind": {"draft": "parsed.answer"}, "next": [{"goto": "review"}]},
            "review": {"call": "reviewer"},
        },
    },
}


def _judged_rollout(tokenizer, answers, judge_script, judge=True):
    from workbench.engine import Rollout
    from workbench.tasks import Task
    from workbench.topology import from_dict

    replies = iter(answers)
    policy = ScriptedBackend(tokenizer, lambda prompt: "fine" if "Review:" in prompt else next(replies))
    judge_backend = RecordingBackend(tokenizer, judge_script) if judge else None
    engine = Rollout(from_dict(JUDGED_SPEC), policy, judge=judge_backend)
    task = Task("q0", "Which river flows through Qarvell?", "Lune", "exact")
    episodes = run(engine.run([task], group_size=len(answers)))
    return episodes, judge_backend


def _judge_says(prompt: str) -> str:
    """A judge that accepts any response naming the Lune, in the reply format of the prompt it was sent."""
    if "[response]:" in prompt:  # HLE
        response = prompt.split("[response]:")[-1].split("Your judgement")[0]
        return f"extracted_final_answer: x\nreasoning: r\ncorrect: {'yes' if 'Lune' in response else 'no'}"
    response = prompt.split("Predicted answer:")[-1].split("```")[0]  # SimpleQA
    return "A" if "Lune" in response else "B"


def test_a_reward_rule_can_name_an_llm_judge(tokenizer):
    episodes, judge = _judged_rollout(
        tokenizer, ["\\boxed{Lune, of course}", "\\boxed{the Thames}"], _judge_says
    )
    by_sample = {e.sample: {c.role: c.rewards for c in e.calls} for e in episodes}
    # the answerer's own answer is judged; the reviewer gets the judged outcome of the episode's answer
    assert by_sample[0]["answerer"]["reward"] == 1.0 and by_sample[1]["answerer"]["reward"] == 0.0
    assert by_sample[0]["reviewer"]["accuracy"] == 1.0 and by_sample[1]["reviewer"]["accuracy"] == 0.0
    assert by_sample[0]["reviewer"]["reward"] == pytest.approx(0.9 * 1.0 + 0.1 * 1.0)
    assert all(r["judge_error"] == 0.0 for s in by_sample.values() for r in s.values())
    # 2 answers + 2 outcomes, each judged once; exact match (the episode reward) scores "Lune, of course" 0
    assert len(judge.requests) == 4
    assert {e.reward for e in episodes} == {0.0}


def test_an_unreadable_judgement_scores_zero_and_is_flagged(tokenizer):
    episodes, _ = _judged_rollout(tokenizer, ["\\boxed{the Lune}"], lambda prompt: "I cannot say.")
    rewards = {c.role: c.rewards for c in episodes[0].calls}
    assert rewards["answerer"] == {"reward": 0.0, "accuracy": 0.0, "format": 1.0, "judge_error": 1.0}
    assert episodes[0].status == "complete"


def test_a_judged_rule_without_a_judge_backend_is_refused(tokenizer):
    with pytest.raises(ValueError, match="answerer, reviewer name an LLM judge"):
        _judged_rollout(tokenizer, ["x"], _judge_says, judge=False)


def test_judge_names_are_validated():
    from workbench.engine.spec_checks import from_dict
    from workbench.topology import TopologyError

    spec = {**JUDGED_SPEC, "roles": {**JUDGED_SPEC["roles"]}}
    spec["roles"]["answerer"] = {**spec["roles"]["answerer"], "reward": {"kind": "answer", "judge": "gpt"}}
    with pytest.raises(TopologyError, match=r"roles\.answerer\.reward\.judge.*unknown judge prompt 'gpt'"):
        from_dict(spec)
    spec["roles"]["answerer"]["reward"] = {"kind": "parent", "judge": "hle"}
    with pytest.raises(TopologyError, match="needs kind outcome or answer"):
        from_dict(spec)


def test_a_real_model_judges_a_training_rollout(tmp_path):
    """The tiny model on transformers as the judge of a real rollout: every call is judged, none crashes."""
    import workbench as wb
    from workbench.tasks import Task
    from workbench.topology import from_dict

    tasks = [Task(f"q{i}", f"What is {i} + 1?", str(i + 1), "exact") for i in range(3)]
    result = wb.rollout(
        from_dict(JUDGED_SPEC), tasks, model="tiny", max_tokens=8, runs_dir=tmp_path, judge="tiny"
    )
    calls = wb.RunReader(result.run_dir).calls()
    assert len(calls) == 6
    for rewards in calls["rewards"]:
        assert set(rewards) == {"reward", "accuracy", "format", "judge_error"}
        assert 0.0 <= rewards["reward"] <= 1.0
