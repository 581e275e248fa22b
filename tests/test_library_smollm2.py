"""Every built-in topology on the real SmolLM2-135M, with the transformers and the vLLM (CPU build) backends.

The CPU-sized variants (``*_cpu``) run on the transformers backend only: they take the engine paths of the
papers' full specs, which run on both, and on vLLM's CPU build a variant's many short calls cost a minute and
more of the suite's vLLM phase for nothing either backend does differently.
"""

import pytest

import workbench as wb
from tests.test_library import TASKS, RecordingBackend, _check_masks
from workbench.backends import make_backend

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["hf", "vllm"])
def backend(request):
    inner = make_backend(request.param, "smollm2-135m")
    yield inner
    inner.close()


@pytest.mark.parametrize("name", sorted(TASKS))
def test_topology_runs_on_smollm2_and_masks_match(name, backend, tmp_path):
    if name.endswith("_cpu") and backend.name == "vllm":
        pytest.skip("a CPU-sized variant: the engine paths of its full spec, which runs on vLLM too")
    generator, options = TASKS[name]
    tasks = wb.generate_tasks(generator, n=1, seed=1, **options)
    recording = RecordingBackend(backend)
    result = wb.rollout(name, tasks, backend=recording, max_tokens=16, runs_dir=tmp_path)
    (episode,) = result.episodes
    assert episode.status in {"complete", "call_limit"}, episode.error
    calls = wb.RunReader(result.run_dir).calls()
    assert len(calls) == len(episode.calls) > 0
    _check_masks(calls, recording.served)
