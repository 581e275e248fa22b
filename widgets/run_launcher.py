"""RunLauncher: a form that starts a rollout or a training run in a background process, and stops it.

The form holds model, topology, tasks, group size, steps, batch size, backend and scheduler; Start
calls ``wb.rollout(..., background=True)`` or ``wb.train(...)`` (both return at once, the work runs in
a spawned process that writes to the run store, so the kernel or the server stays responsive); Stop
asks the run to stop after its current step (the run's ``STOP`` file, nothing blocks).

``can_operate`` decides, at the moment Start or Stop is pressed, whether the person may do it: the
team dashboard passes a check of the signed-in user's role, so a viewer's request is refused on the
server whatever the browser sends; in a notebook it is always allowed.

CSS classes a browser test can find: ``wb-launcher`` (the form), ``wb-launch`` and ``wb-stop`` (the
buttons), ``wb-launcher-status`` (the message after each action).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import panel as pn
import param

from workbench.tasks.registry import list_generators
from workbench.topology.io import library

#: The schedulers a run can use; issue 7 adds the pipeline and asynchronous ones.
SCHEDULERS = ("synchronous",)


class PermissionDenied(PermissionError):
    """The signed-in user may not launch or stop runs."""


class RunLauncher(pn.viewable.Viewer):
    """Start and stop rollouts and training runs from a form."""

    mode = param.Selector(default="train", objects=["train", "rollout"], doc="Train, or only roll out.")
    model = param.String(default="smollm2-135m", doc="Model name from the registry, a path or a HF id.")
    topology = param.Selector(default="marsrl", objects=library(), doc="Built-in topology.")
    tasks = param.Selector(default="arithmetic", objects=list_generators(), doc="Task generator.")
    n_tasks = param.Integer(default=16, bounds=(1, None), doc="Tasks to generate.")
    group_size = param.Integer(default=2, bounds=(1, None), doc="Samples per task (GRPO's G).")
    steps = param.Integer(default=2, bounds=(1, None), doc="Training steps (train mode).")
    batch_size = param.Integer(default=2, bounds=(1, None), doc="Tasks per training step (train mode).")
    max_tokens = param.Integer(default=32, bounds=(1, None), doc="Cap on tokens per call.")
    backend = param.Selector(default="hf", objects=["hf", "vllm"], doc="Rollout backend.")
    scheduler = param.Selector(default=SCHEDULERS[0], objects=list(SCHEDULERS), doc="Training scheduler.")
    status = param.String(default="", doc="What the last action did.")

    def __init__(
        self, runs_dir: str | Path = "runs", can_operate: Callable[[], bool] | None = None, **params: Any
    ) -> None:
        super().__init__(**params)
        self.runs_dir = Path(runs_dir)
        self.can_operate = can_operate or (lambda: True)
        self.handle: Any = None

    # ------------------------------------------------------------------ actions
    def _check(self, action: str) -> None:
        if not self.can_operate():
            self.status = f"refused: only operators may {action} runs"
            raise PermissionDenied(self.status)

    def launch(self) -> Any:
        """Start the run the form describes; returns its :class:`~workbench.training.BackgroundRun`."""
        import workbench as wb

        self._check("launch")
        tasks = wb.generate_tasks(self.tasks, n=self.n_tasks, seed=0)
        if self.mode == "rollout":
            self.handle = wb.rollout(
                self.topology,
                tasks,
                model=self.model,
                backend=self.backend,
                group_size=self.group_size,
                max_tokens=self.max_tokens,
                runs_dir=self.runs_dir,
                background=True,
            )
        else:
            config = wb.TrainConfig(
                model=self.model,
                topology=self.topology,
                tasks=self.tasks,
                backend=self.backend,
                steps=self.steps,
                batch_size=self.batch_size,
                group_size=self.group_size,
                max_tokens=self.max_tokens,
                runs_dir=str(self.runs_dir),
            )
            self.handle = wb.train(self.topology, tasks, config)
        self.status = f"started {self.mode} run {self.handle.run_dir.name}"
        return self.handle

    def stop(self, run_dir: str | Path | None = None) -> None:
        """Ask ``run_dir`` (default: the run this form started) to stop after its current step."""
        from workbench.training import BackgroundRun

        self._check("stop")
        target = BackgroundRun(Path(run_dir)) if run_dir is not None else self.handle
        if target is None:
            self.status = "no run to stop"
            return
        target.request_stop()
        self.status = f"asked run {target.run_dir.name} to stop"

    # ------------------------------------------------------------------ view
    def _press(self, action: Callable[[], Any]) -> Callable[[Any], None]:
        def press(_event: Any) -> None:
            try:
                action()
            except PermissionDenied:
                pass  # the status says why
            except Exception as error:  # a bad model name or config: shown, never a dead server callback
                self.status = f"failed: {type(error).__name__}: {error}"

        return press

    def __panel__(self) -> pn.viewable.Viewable:
        start = pn.widgets.Button(name="Start", button_type="primary", css_classes=["wb-launch"])
        stop = pn.widgets.Button(name="Stop", button_type="danger", css_classes=["wb-stop"])
        start.on_click(self._press(self.launch))
        stop.on_click(self._press(self.stop))
        form = pn.Param(
            self.param,
            parameters=[
                "mode",
                "model",
                "topology",
                "tasks",
                "n_tasks",
                "group_size",
                "steps",
                "batch_size",
                "max_tokens",
                "backend",
                "scheduler",
            ],
            show_name=False,
        )
        message = pn.pane.Markdown(self.param.status, css_classes=["wb-launcher-status"])
        return pn.Column(form, pn.Row(start, stop), message, css_classes=["wb-launcher"])
