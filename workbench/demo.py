"""The main job behind ``make demo``: MarsRL's Solver and Verifier on the local SmolLM2-135M, learning.

1. A rollout of ``marsrl_cpu`` (MarsRL's Solver -> Verifier at the scale of a 135M model: single-digit
   addition, the Solver answering with the number, the Verifier checking the sum in a few-shot transcript
   and answering Yes or No), summarised per role: calls, tokens, reward, format failures.
2. Multi-agent GRPO on the same topology for ``train_steps`` steps, with a greedy held-out evaluation
   before the first update and after the last, printed per role as base -> trained with the paired
   standard error of the rise; then one held-out problem answered greedily by the base model and by the
   trained one, side by side (the first whose final answer training turned from wrong to right, where
   one did).
3. ``workbench reproduce marsrl`` on that run: MarsRL's figures and tables under ``reports_out``.
4. The next commands: the notebooks in JupyterLab, the dashboard on the run.

It simplifies on purpose (easy problems, short completions, a few minutes of training on two CPU cores)
while exercising every part a real run uses: local model, topology, engine, verifiers, run store,
trainer, report notebooks. The full ``marsrl`` topology needs a model that follows MarsRL's prompts
(7B and up in the paper); a 135M model does not, and would show a system that does nothing.
"""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: The demo's problems: single-digit addition asked for "just the number", where SmolLM2-135M is partly right.
TASK_OPTIONS = {"level": 1, "format": "plain"}
#: Characters of a completion shown in a column of the side-by-side comparison.
COLUMN = 38

Scores = Mapping[str, Mapping[str, float]]


def main(
    model: str = "smollm2-135m",
    topology: str = "marsrl_cpu",
    n_tasks: int = 4,
    group_size: int = 4,
    runs_dir: str | Path = "runs",
    seed: int = 0,
    train_steps: int = 12,
    eval_tasks: int = 64,
    learning_rate: float = 3e-5,
    reports_out: str | Path = "reports-out",
) -> int:
    """Roll out, train, evaluate and report; returns the exit code."""
    rollout_dir = _roll_out(model, topology, n_tasks, group_size, runs_dir, seed)
    if train_steps <= 0:
        _print_next(runs_dir, rollout_dir)
        return 0
    run_dir = _train(model, topology, train_steps, group_size, eval_tasks, learning_rate, runs_dir, seed)
    scores = _held_out_scores(run_dir)
    if scores is not None:
        _print_held_out(*scores)
        _print_side_by_side(run_dir, model, topology, *scores)
    code = _report(run_dir, Path(reports_out))
    _print_next(runs_dir, run_dir)
    return code


def _roll_out(
    model: str, topology: str, n_tasks: int, group_size: int, runs_dir: str | Path, seed: int
) -> Path:
    from workbench.runs import rollout
    from workbench.tasks import generate

    tasks = generate("arithmetic", n=n_tasks, seed=seed, **TASK_OPTIONS)
    print(
        f"==> rolling out '{topology}' on {model}: {len(tasks)} addition problems, {group_size} samples each"
    )
    result = rollout(topology, tasks, model=model, group_size=group_size, runs_dir=runs_dir, seed=seed)
    print(f"\n{len(result.episodes)} episodes stored in {result.run_dir} ({result.seconds:.1f} s)")
    print(f"final-answer accuracy: {result.accuracy:.2f}\n")
    print(result.summary_text())
    return result.run_dir


def _train(
    model: str,
    topology: str,
    steps: int,
    group_size: int,
    eval_tasks: int,
    learning_rate: float,
    runs_dir: str | Path,
    seed: int,
) -> Path:
    from workbench.reports.sample import train_sample_run

    print(
        f"\n==> training '{topology}' on {model} for {steps} steps (multi-agent GRPO, agent-specific rewards); "
        f"{eval_tasks} held-out problems scored before and after"
    )
    return train_sample_run(
        runs_dir,
        topology=topology,
        task_options=TASK_OPTIONS,
        model=model,
        steps=steps,
        batch_size=4,
        group_size=group_size,
        max_tokens=None,
        eval_tasks=eval_tasks,
        eval_every=0,
        n_tasks=200,
        learning_rate=learning_rate,
        seed=seed,
    )


def _held_out_scores(run_dir: Path) -> tuple[Scores, Scores] | None:
    """The held-out scores per task before training and after it (None: fewer than two evaluations)."""
    from workbench.store import RunReader

    with RunReader(run_dir) as reader:
        events = reader.events(kind="eval")
    if len(events) < 2:
        return None
    return events["payload"].iloc[0]["tasks"], events["payload"].iloc[-1]["tasks"]


def _print_held_out(before: Scores, after: Scores) -> None:
    """Per role, the greedy held-out score before training and after it, with the paired standard error."""
    from workbench.rl.evaluation import OUTCOME, paired_rise

    keys = sorted({k for scores in before.values() for k in scores} - {OUTCOME}) + [OUTCOME]
    print(
        f"\nheld-out problems ({len(before)}, greedy): base -> trained, rise in paired standard errors "
        "(a Verifier is scored on its verdicts about the Solver's own answers)"
    )
    for key in keys:
        mean_before = sum(s[key] for s in before.values() if key in s) / len(before)
        rise, se, _ = paired_rise(before, after, key)
        label = "system (final answer)" if key == OUTCOME else key
        print(
            f"  {label:22} {mean_before:.2f} -> {mean_before + rise:.2f}  ({rise:+.2f} ± {se:.2f}: {rise / max(se, 1e-9):+.1f} SE)"
        )


def pick_problem(tasks: list[Any], before: Scores, after: Scores) -> tuple[Any, str]:
    """The held-out problem to show before and after training, and why it was chosen: the first whose final
    answer training turned from wrong to right, else the first whose scores changed, else the first."""
    from workbench.rl.evaluation import OUTCOME

    def scores(table: Scores, task: Any) -> Mapping[str, float]:
        return table.get(str(task.id), {})

    for task in tasks:
        if scores(before, task).get(OUTCOME, 0.0) < 1.0 <= scores(after, task).get(OUTCOME, 0.0):
            return task, "the first turned from wrong to right"
    for task in tasks:
        if scores(before, task) != scores(after, task):
            return task, "none turned from wrong to right: the first whose scores changed"
    return tasks[0], "training changed no score: the first"


def _print_side_by_side(run_dir: Path, model: str, topology: str, before: Scores, after: Scores) -> None:
    """One held-out problem answered greedily by the base model and by the trained one, side by side."""
    import tempfile

    from workbench.rl.export import export_model
    from workbench.rl.loop import load_tasks_for
    from workbench.rl.run_files import run_config
    from workbench.runs import rollout

    _, held_out = load_tasks_for(run_config(run_dir))
    if not held_out:
        return
    task, why = pick_problem(held_out, before, after)
    episodes = {}
    with tempfile.TemporaryDirectory(prefix="workbench-demo-") as tmp:
        trained = export_model(run_dir, Path(tmp) / "trained")
        for label, name in (("base model", model), ("trained model", str(trained))):
            result = rollout(
                topology, [task], model=name, runs_dir=Path(tmp) / "runs", sampling={"temperature": 0.0}
            )
            episodes[label] = result.episodes[0]
    print(f"\none held-out problem, greedy, before and after training ({why}):")
    print(f"  {task.question}  (reference {task.answer})")
    print("\n".join(side_by_side(episodes)))


def side_by_side(episodes: Mapping[str, Any]) -> list[str]:
    """Lines that set episodes in columns (one per label): each role's completions (repeats of the same
    text counted, ``×4``), the final answer, right or wrong, and each rewarded role's reward."""
    from workbench.runs import MISSING

    def cell(text: str) -> str:
        return textwrap.shorten(text.replace("\n", " ").strip() or "(empty)", COLUMN, placeholder="…")

    def completions(episode: Any, role: str) -> list[str]:
        texts: list[list[Any]] = []  # [text, count] in order, repeats of the one before counted
        for call in episode.calls:
            if call.role == role:
                text = cell(call.completion_text or "")
                if texts and texts[-1][0] == text:
                    texts[-1][1] += 1
                else:
                    texts.append([text, 1])
        return [text if n == 1 else f"{text} ×{n}" for text, n in texts]

    def answer(episode: Any) -> str:
        if episode.status == "error":
            return cell(f"error: {episode.error}")
        verdict = MISSING if episode.reward is None else "right" if episode.reward >= 1.0 else "wrong"
        return cell(f"{episode.answer or '(none)'}: {verdict}")

    def rewards(episode: Any) -> str:
        by_role: dict[str, list[float]] = {}
        for call in episode.calls:
            if call.rewards and "reward" in call.rewards:
                by_role.setdefault(call.role, []).append(call.rewards["reward"])
        return cell(", ".join(f"{r} {sum(v) / len(v):.2f}" for r, v in by_role.items()) or MISSING)

    shown = list(episodes.values())
    roles = list(dict.fromkeys(call.role for episode in shown for call in episode.calls))
    width = max([len(r) for r in roles] + [len("rewards")]) + 2
    lines = ["  " + " " * width + "".join(f"{label:{COLUMN + 2}}" for label in episodes).rstrip()]
    rows: list[tuple[str, list[str]]] = []
    for role in roles:
        columns = [completions(episode, role) for episode in shown]
        for i in range(max(len(c) for c in columns)):
            rows.append((role if i == 0 else "", [c[i] if i < len(c) else "" for c in columns]))
    rows += [("answer", [answer(e) for e in shown]), ("rewards", [rewards(e) for e in shown])]
    for name, cells in rows:
        lines.append(f"  {name:{width}}" + "".join(f"{c:{COLUMN + 2}}" for c in cells).rstrip())
    return lines


def _report(run_dir: Path, out: Path) -> int:
    from workbench.reports.reproduce import reproduce, summarise

    print(
        f"\n==> regenerating MarsRL's figures and tables from it (workbench reproduce marsrl --runs {run_dir})"
    )
    return summarise(reproduce("marsrl", str(run_dir), out), out)


def _print_next(runs_dir: str | Path, run_dir: Path) -> None:
    bin_dir = Path(sys.executable).parent
    shown = os.path.relpath(bin_dir) if bin_dir.resolve().is_relative_to(Path.cwd()) else str(bin_dir)
    print(
        "\n==> next\n"
        f"  the notebooks:  make lab     (or {shown}/jupyter lab notebooks/)\n"
        f"  the dashboard:  make serve   (or {shown}/workbench serve {runs_dir}), "
        f"this run at http://localhost:5006/?run={run_dir.name}\n"
        f"  inspect it:     {shown}/python -c \"import workbench as wb; print(wb.RunReader('{run_dir}').calls())\""
    )
