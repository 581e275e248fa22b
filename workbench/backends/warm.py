"""``wb.start_engine``: a generation engine a notebook starts once and hands to every rollout after it.

Starting an engine is the slow part of a rollout cell (vLLM's CPU build: about 30-90 s; a model load for
transformers), and a cell re-run starts it again. An engine made here stays warm across cells:

    engine = wb.start_engine("smollm2-135m", backend="vllm")
    wb.rollout(topology, tasks, backend=engine)                              # the engine's model
    wb.rollout(topology, held_out, backend=engine, sampling={"temperature": 0.0})   # a greedy evaluation
    engine.close()       # or: with wb.start_engine(...) as engine: ...; also at kernel exit

A rollout or replay given an engine never closes it. ``close()`` is safe to repeat and also runs when the
interpreter exits: vLLM's engine core and worker processes are stopped and reaped (no ``<defunct>`` process
is left in the kernel) and their memory goes back; a closed engine refuses new requests. vLLM logs only its
warnings and errors (``verbose=True``, or ``log_level="INFO"``, shows its INFO lines). Training
(``wb.train``) runs in a process of its own and starts its own engine: it cannot take one made here.

Not ``wb.engine``: that name is the rollout engine's package (``workbench.engine``), which Python binds on
``workbench`` as soon as anything imports it.
"""

from __future__ import annotations

from typing import Any

from workbench.backends import Backend, make_backend


def start_engine(
    model: str = "smollm2-135m",
    backend: str = "hf",
    *,
    device: str = "auto",
    dtype: str = "auto",
    verbose: bool = False,
    **options: Any,
) -> Backend:
    """Start a ``backend`` (``hf``, ``vllm`` or ``openai``) serving ``model``, to pass as ``backend=`` to
    ``wb.rollout`` and ``wb.replay`` cell after cell; close it with ``close()`` or a ``with`` block.

    ``device``/``dtype`` as for ``wb.rollout`` (``auto``: a GPU in bf16 where one exists, else the CPU in fp32);
    vLLM takes ``dtype`` and places itself (its CUDA build on the GPU, its CPU build on the CPU).
    ``verbose=True`` lets vLLM log its INFO lines (``log_level=`` chooses the level). Other ``options`` go
    to the backend (``workbench.backends.make_backend``): ``max_model_len``, ``enable_lora``, ``base_url``...
    """
    from workbench.models.placement import device_problem, dtype_problem

    problems = [p for p in (device_problem(device), dtype_problem(dtype)) if p]
    if problems:
        raise ValueError("; ".join(problems))
    if backend == "hf":
        options = {"device": device, "dtype": dtype, **options}
    elif backend == "vllm":
        if device != "auto":
            raise ValueError(
                f"device={device!r}: vLLM places its engine itself (its CUDA build on the GPU, its CPU build "
                "on the CPU); leave device='auto'"
            )
        options = {"dtype": None if dtype == "auto" else dtype, **options}
        options.setdefault("log_level", "INFO" if verbose else None)
    elif (device, dtype) != ("auto", "auto"):
        raise ValueError(f"the {backend} backend serves from another process: device and dtype do not apply")
    made = make_backend(backend, model, **options)
    made.model_name = model  # what wb.rollout records as the run's model (replays serve it again)
    return made
