"""Multi-turn contexts stay token-exact: generated ids are kept as they are, inserted text is masked."""

import pytest
from transformers import AutoTokenizer

from workbench.backends.base import Generation
from workbench.engine.conversation import Conversation
from workbench.models import resolve
from workbench.store.codec import TokenOwner


@pytest.fixture(scope="module", params=["tiny", "smollm2-135m"])
def tokenizer(request):
    return AutoTokenizer.from_pretrained(resolve(request.param))


def _generated(tokenizer, text: str, finished: bool = True) -> Generation:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if finished:
        ids = ids + [tokenizer.eos_token_id]
    return Generation(completion_ids=ids, logprobs=[-0.5] * len(ids), text=text, finish_reason="stop")


@pytest.mark.parametrize("finished", [True, False])
def test_chat_turns_render_like_the_chat_template(tokenizer, finished):
    messages = [{"role": "user", "content": "Find the capital of Zarnia."}]
    conversation = Conversation(tokenizer, messages)
    first = _generated(
        tokenizer, '<tool_call>{"name": "search", "arguments": {"query": "Zarnia"}}</tool_call>', finished
    )
    conversation.add_generation(first)
    conversation.insert("<tool_response>\nZarnia's capital is Olvik.\n</tool_response>", TokenOwner.TOOL)
    second = _generated(tokenizer, "<answer>Olvik</answer>")
    conversation.add_generation(second)

    # the generated ids are kept exactly and own their logprobs
    n1 = len(first.completion_ids)
    assert conversation.completion_ids[:n1] == first.completion_ids
    assert conversation.completion_ids[-len(second.completion_ids) :] == second.completion_ids
    trainable = [i for i, m in enumerate(conversation.mask) if m == TokenOwner.TRAINABLE]
    assert len(trainable) == n1 + len(second.completion_ids)
    assert all(conversation.logprobs[i] == -0.5 for i in trainable)
    assert all(
        conversation.logprobs[i] == 0.0 for i in range(len(conversation.mask)) if i not in set(trainable)
    )
    # the whole sequence reads as the chat template would have rendered the conversation
    expected = tokenizer.apply_chat_template(
        [
            *messages,
            {"role": "assistant", "content": first.text},
            {"role": "user", "content": "<tool_response>\nZarnia's capital is Olvik.\n</tool_response>"},
            {"role": "assistant", "content": second.text},
        ],
        tokenize=False,
    )
    decoded = tokenizer.decode(conversation.ids, skip_special_tokens=False)
    assert decoded.rstrip("\n") == expected.rstrip("\n")
    # the inserted tool text is there, masked as tool output
    tool_ids = [
        t for t, m in zip(conversation.completion_ids, conversation.mask, strict=True) if m == TokenOwner.TOOL
    ]
    assert "Olvik" in tokenizer.decode(tool_ids)


def test_raw_mode_appends_text_after_the_prompt(tokenizer):
    conversation = Conversation(tokenizer, [{"role": "user", "content": "Plan the task."}], mode="raw")
    prompt = list(conversation.prompt_ids)
    step = _generated(tokenizer, "<|begin_call_subtask|>find X<|end_call_subtask|>", finished=False)
    conversation.add_generation(step)
    conversation.insert("\n\n<|begin_subtask_result|>X is 4<|end_subtask_result|>\n\n", TokenOwner.OTHER_ROLE)
    assert conversation.prompt_ids == prompt
    assert conversation.mask.count(TokenOwner.OTHER_ROLE) > 0
    text = tokenizer.decode(conversation.completion_ids, skip_special_tokens=False)
    assert text.startswith("<|begin_call_subtask|>find X<|end_call_subtask|>")
    assert text.endswith("<|end_subtask_result|>\n\n")
