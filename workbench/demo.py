"""The main job behind ``make demo``: MarsRL on the local SmolLM2-135M, rolled out, trained, reported.

1. A short rollout, summarised per role (the first episode's calls printed).
2. A brief multi-agent GRPO run of the same topology (``train_steps`` steps, a held-out
   evaluation after each), stored like any training run.
3. ``workbench reproduce marsrl`` on that run: MarsRL's figures and tables, written under
   ``reports_out`` with an ``index.html``.

It simplifies on purpose: easy arithmetic problems and short completions, so it finishes in a few
minutes on two CPU cores while exercising every part a real run uses (local model, topology,
engine, verifiers, run store, trainer, report notebooks).
"""

from __future__ import annotations

import textwrap
from pathlib import Path


def main(
    model: str = "smollm2-135m",
    topology: str = "marsrl",
    n_tasks: int = 4,
    max_tokens: int = 64,
    runs_dir: str | Path = "runs",
    seed: int = 0,
    train_steps: int = 2,
    reports_out: str | Path = "reports-out",
) -> int:
    from workbench.runs import rollout
    from workbench.store import RunReader
    from workbench.tasks import generate

    # SmolLM2-135M rarely writes \\boxed{} unprompted: ask for just the number, as DESIGN.md advises.
    tasks = generate("arithmetic", n=n_tasks, seed=seed, level=1, format="plain")
    print(
        f"==> rolling out '{topology}' on {model}: {len(tasks)} arithmetic problems, <= {max_tokens} tokens a call"
    )
    # The paper samples at temperature 1.0 for training; a 135M model reads better a little cooler.
    result = rollout(
        topology,
        tasks,
        model=model,
        max_tokens=max_tokens,
        runs_dir=runs_dir,
        seed=seed,
        sampling={"temperature": 0.3},
    )
    reader = RunReader(result.run_dir)
    calls = reader.calls()
    print(f"\nrun stored in {result.run_dir}  ({len(calls)} calls, {result.seconds:.1f} s)")
    print(f"final-answer accuracy: {result.accuracy:.2f} over {len(result.episodes)} episodes\n")
    print(result.summary().to_string(float_format=lambda x: f"{x:.2f}"))
    first = result.episodes[0]
    print(f"\nfirst episode ({first.task_id}): {tasks[0].question!r} -> reference {tasks[0].answer}")
    for call in first.calls:
        text = textwrap.shorten(call.completion_text.replace("\n", " "), 110)
        print(f"  [{call.role}] {text}")
    print(
        f"\ninspect it: python -c \"import workbench as wb; print(wb.RunReader('{result.run_dir}').calls())\""
    )
    if train_steps <= 0:
        return 0
    return _train_and_report(model, train_steps, min(max_tokens, 32), runs_dir, Path(reports_out))


def _train_and_report(model: str, steps: int, max_tokens: int, runs_dir: str | Path, out: Path) -> int:
    from workbench.reports.reproduce import reproduce, summarise
    from workbench.reports.sample import train_sample_run

    print(f"\n==> training '{model}' on MarsRL for {steps} step(s), held-out evaluation after each")
    run_dir = train_sample_run(runs_dir, model=model, steps=steps, max_tokens=max_tokens)
    print(f"training run stored in {run_dir}")
    print(
        f"\n==> regenerating MarsRL's figures and tables from it (workbench reproduce marsrl --runs {run_dir})"
    )
    return summarise(reproduce("marsrl", str(run_dir), out), out)
