"""The main job behind ``make demo``: a short MarsRL rollout on the local SmolLM2-135M, then a summary.

It simplifies on purpose: a handful of easy arithmetic problems and short completions, so it
finishes in about a minute on two CPU cores while still exercising every part a real run uses
(local model, topology, engine, verifiers, run store).
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
    return 0
