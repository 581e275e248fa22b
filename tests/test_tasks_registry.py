"""The generator registry: names, options, errors."""

from __future__ import annotations

import pytest

from workbench.tasks import (
    Task,
    TaskOptionError,
    UnknownGeneratorError,
    generate,
    generator_options,
    list_generators,
    register_generator,
)


def test_builtins_registered():
    assert {"arithmetic", "multihop", "masbench"} <= set(list_generators())
    assert "level" in generator_options("arithmetic")
    assert {"axis", "values", "split"} <= set(generator_options("masbench"))


def test_unknown_generator_lists_known_ones():
    with pytest.raises(
        UnknownGeneratorError, match="unknown task generator 'gsm9k'; choose one of: .*arithmetic"
    ):
        generate("gsm9k", 3)


def test_unknown_option_and_bad_n():
    with pytest.raises(TaskOptionError, match="has no option 'levle'; its options are: level"):
        generate("arithmetic", 3, seed=0, levle=2)
    with pytest.raises(TaskOptionError, match="n must be a non-negative int"):
        generate("arithmetic", -1)
    with pytest.raises(TaskOptionError, match="seed must be an int"):
        generate("arithmetic", 1, seed="x")
    assert generate("masbench", 0) == []


def test_custom_generator(monkeypatch):
    from workbench.tasks import registry

    monkeypatch.setattr(registry, "_GENERATORS", dict(registry._GENERATORS))  # undone after the test

    @register_generator("echo-test")
    def echo(n: int, seed: int, *, word: str = "hi") -> list[Task]:
        return [Task(f"echo-{seed}-{i}", word, word, "exact") for i in range(n)]

    assert "echo-test" in list_generators()
    assert [t.question for t in generate("echo-test", 2, seed=1, word="yo")] == ["yo", "yo"]


def test_verifier_names_exist_in_rewards_and_accept_the_reference():
    """Each built-in task names a verifier ``workbench.rewards`` knows, and a boxed reference scores 1."""
    from workbench.rewards import VERIFIERS, verify

    tasks = (
        generate("arithmetic", 10, seed=0)
        + generate("arithmetic", 5, seed=0, format="plain")
        + generate("multihop", 8, seed=0)
        + generate("multihop", 4, seed=0, verifier="f1")
        + generate("masbench", 10, seed=0, axis=["depth", "breadth"])
    )
    for task in tasks:
        assert task.verifier in VERIFIERS, task.verifier
        assert verify(task.verifier, f"So the answer is \\boxed{{{task.answer}}}.", task.answer) == 1.0
        assert verify(task.verifier, "\\boxed{Nobody 999}", task.answer) == 0.0
    multi = {
        t.verifier
        for t in generate("masbench", 3, seed=0, axis=["horizon", "parallel", "robustness"], values=2)
    }
    assert multi <= set(VERIFIERS)


def test_multi_answer_masbench_tasks_score_all_or_nothing():
    """Horizon, Parallel and Robustness tasks are right only when every sub-answer is right, in order."""
    from workbench.rewards import verify

    tasks = generate("masbench", 6, seed=3, axis=["horizon", "parallel", "robustness"], values=3)
    assert {t.metadata["axis"] for t in tasks} == {"horizon", "parallel", "robustness"}
    for task in tasks:
        answers = task.metadata["answers"]
        assert len(answers) == 3 and task.answer == "<<horizon>>".join(str(a) for a in answers)
        boxed = " ".join(f"\\boxed{{{a}}}" for a in answers)
        assert verify(task.verifier, f"Answers: {boxed}", task.answer) == 1.0
        wrong = list(answers)
        wrong[1] = str((int(wrong[1]) + 1) % 23) if str(wrong[1]).lstrip("-").isdigit() else "nonsense"
        assert verify(task.verifier, " ".join(f"\\boxed{{{a}}}" for a in wrong), task.answer) == 0.0
        assert verify(task.verifier, " ".join(f"\\boxed{{{a}}}" for a in answers[:-1]), task.answer) == 0.0
        if task.verifier == "mod23_list":
            lines = "\n".join(f"Problem {k + 1}: the answer is {a}" for k, a in enumerate(answers))
            assert verify(task.verifier, lines, task.answer) == 1.0
