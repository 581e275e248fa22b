"""First-Fit-Decreasing bin packing: invariants on random instances, equality with the plain loops, texts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.engine.binpack import (
    BinPackingError,
    ffd_pack,
    ffd_pack_naive,
    pack_texts,
    truncate_to_tokens,
)

instances = st.integers(1, 60).flatmap(
    lambda capacity: st.tuples(st.lists(st.integers(0, 2 * capacity), max_size=120), st.just(capacity))
)


@settings(max_examples=400, deadline=None)
@given(instances)
def test_every_item_in_exactly_one_bin_and_no_bin_over_capacity(instance):
    sizes, capacity = instance
    packing = ffd_pack(sizes, capacity)
    placed = sorted(i for items in packing.bins for i in items)
    assert placed == list(range(len(sizes)))
    assert all(load <= capacity for load in packing.loads)
    for items, load in zip(packing.bins, packing.loads, strict=True):
        assert load == sum(min(sizes[i], capacity) for i in items)
        assert items  # no empty bins


@settings(max_examples=400, deadline=None)
@given(instances)
def test_oversize_items_are_truncated_into_isolated_bins_first(instance):
    sizes, capacity = instance
    packing = ffd_pack(sizes, capacity)
    oversize = [i for i, s in enumerate(sizes) if s > capacity]
    assert packing.truncated == oversize
    assert packing.bins[: len(oversize)] == [[i] for i in oversize]
    assert packing.loads[: len(oversize)] == [capacity] * len(oversize)
    assert all(sizes[i] <= capacity for items in packing.bins[len(oversize) :] for i in items)


@settings(max_examples=400, deadline=None)
@given(instances)
def test_first_fit_no_item_would_have_fitted_an_earlier_bin(instance):
    # An item went to bin j because every earlier bin was too full for it then, and bins only fill up,
    # so at the end: load(i) + size > capacity for every earlier bin i.
    sizes, capacity = instance
    packing = ffd_pack(sizes, capacity)
    start = len(packing.truncated)
    regular = list(zip(packing.bins[start:], packing.loads[start:], strict=True))
    for j, (items, _) in enumerate(regular):
        smallest = min(sizes[i] for i in items)
        assert all(load + smallest > capacity for _, load in regular[:j])
    # and so at most one bin is half empty: the count stays below 2 * total / capacity + 1
    total = sum(load for _, load in regular)
    assert len(regular) <= 2 * total // capacity + 1


@settings(max_examples=400, deadline=None)
@given(instances)
def test_the_fast_packing_equals_the_plain_two_loop_version(instance):
    sizes, capacity = instance
    fast, naive = ffd_pack(sizes, capacity), ffd_pack_naive(sizes, capacity)
    assert fast.bins == naive.bins and fast.loads == naive.loads and fast.truncated == naive.truncated


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 23_552), min_size=300, max_size=1500), st.sampled_from([2048, 8192, 23_552]))
def test_equal_to_the_plain_version_on_realistic_token_counts(sizes, capacity):
    assert ffd_pack(sizes, capacity).bins == ffd_pack_naive(sizes, capacity).bins


def test_a_worked_example_and_ties_keep_input_order():
    #        0  1  2  3  4  5  6
    sizes = [5, 4, 3, 3, 2, 2, 1]
    packing = ffd_pack(sizes, 10)
    assert packing.bins == [[0, 1, 6], [2, 3, 4, 5]] and packing.loads == [10, 10]
    assert packing.lower_bound == 2 and packing.truncated == []
    assert ffd_pack([3, 7, 3, 3], 6).bins == [[1], [0, 2], [3]]  # 7 > 6: truncated, isolated, first
    assert ffd_pack([2, 2, 2], 4).bin_of() == {0: 0, 1: 0, 2: 1}


def test_edge_cases():
    assert ffd_pack([], 10).bins == []
    assert ffd_pack([0, 0, 0], 1).bins == [[0, 1, 2]]
    assert ffd_pack([1, 0], 1).bins == [[0, 1]]
    assert ffd_pack([10, 10], 10).bins == [[0], [1]]
    assert ffd_pack([5, 5, 5, 5, 5], 10).bins == [[0, 1], [2, 3], [4]]


@pytest.mark.parametrize(
    ("sizes", "capacity", "message"),
    [
        ([1], 0, "bin capacity must be a positive int"),
        ([1], True, "bin capacity must be a positive int"),
        ([1], 2.5, "bin capacity must be a positive int"),
        ([3, -1], 5, "item 1 has negative size -1"),
    ],
)
def test_bad_input_is_refused_with_the_fix(sizes, capacity, message):
    with pytest.raises(BinPackingError, match=message):
        ffd_pack(sizes, capacity)


def words(text: str) -> int:
    return len(text.split())


def test_truncate_to_tokens_keeps_the_longest_prefix_within_the_limit():
    text = "one two three four five six"
    cut = truncate_to_tokens(text, 3, words)
    assert cut == "one two three " and words(cut) == 3
    assert words(text[: len(cut) + 1]) == 4
    assert truncate_to_tokens(text, 10, words) == text


def test_pack_texts_fills_bins_keeps_rank_order_and_truncates_long_documents():
    docs = [
        "alpha " * 6,  # 6 words
        "beta " * 3,
        "gamma " * 25,  # longer than a bin: truncated, alone
        "delta " * 4,
        "epsilon " * 2,
    ]
    bins = pack_texts([d.strip() for d in docs], capacity=12, count_tokens=words, separator="\n\n")
    assert len(bins) == 3
    assert bins[0] == "gamma " * 12  # truncated to the longest prefix of 12 tokens
    assert all(words(b) <= 12 for b in bins)
    # the rest are packed by size: 6 (alpha) and 4 (delta) open bin 1, 3 (beta) does not fit and opens
    # bin 2, 2 (epsilon) fills bin 1; each bin lists its documents in input order
    assert bins[1] == "\n\n".join([docs[0].strip(), docs[3].strip(), docs[4].strip()])
    assert bins[2] == docs[1].strip()
    assert pack_texts([], 10, words) == []


def test_pack_texts_with_a_real_tokenizer_stays_within_capacity(tiny_model_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    from workbench.tasks import build_knowledge_base

    documents = [f"Title: {d.title}\n{d.text}" for d in build_knowledge_base(0, 60).documents[:60]]
    capacity = 256
    bins = pack_texts(documents, capacity, count)
    # Counts add up per document (plus one separator each); BPE merges at the seams can move a
    # joined bin's count by a token or so, never past the separator allowance here.
    assert all(count(b) <= capacity for b in bins)
    assert sum(count(d) for d in documents) / capacity <= len(bins)
    joined = "\n\n".join(bins)
    assert all(d in joined for d in documents if count(d) + count("\n\n") <= capacity)
