"""The ``tiny`` model: a random-init Qwen2-architecture checkpoint for fast unit tests.

It has the shape of a real chat model at a fraction of the size: a byte-level BPE tokenizer
trained here on :mod:`workbench.models.corpus` (ChatML control tokens and the agents' tags as
single tokens, a ChatML chat template), and a two-layer Qwen2 decoder with head_dim 32, the
smallest head size vLLM's CPU attention accepts. Everything is deterministic: the same seed gives
byte-identical weights, and every seed has the same tokenizer. Its outputs are random text, by design.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workbench.models.corpus import SPECIAL_TOKENS, TAG_TOKENS, corpus

RECIPE = "tiny-qwen2-v1"
"""Changes whenever the built files would change, so older cache entries are rebuilt."""

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

VOCAB_SIZE = 1024
"""Upper bound for the BPE trainer; the corpus is small, so the vocabulary ends up near 600."""

SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 2048,
}


def build_tokenizer(corpus_seed: int = 0) -> Any:
    """Train the byte-level BPE tokenizer on the corpus of ``corpus_seed``: a ``PreTrainedTokenizerFast``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(corpus_seed), trainer=trainer)
    tok.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in TAG_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
        model_max_length=SHAPE["max_position_embeddings"],
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def build_tiny(out_dir: Path, seed: int = 0) -> dict[str, Any]:
    """Write the ``tiny`` checkpoint (fp32 safetensors, config, tokenizer) into ``out_dir``.

    ``seed`` initialises the weights; the tokenizer is the same for every seed, so models of
    different seeds can share prompts and token ids. Returns a description of what was built,
    recorded in the cache manifest.
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_tokenizer()
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        **SHAPE,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=[eos_id, pad_id], pad_token_id=pad_id)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return {
        "seed": seed,
        "vocab_size": len(tokenizer),
        "parameters": sum(p.numel() for p in model.parameters()),
    }
