"""Bucket selection: the smallest ``n_positions`` bucket that holds the context."""

from __future__ import annotations

import pytest

from neuroncore.generation import (
    BucketError,
    decode_contexts,
    normalize_buckets,
    select_bucket,
    steps_per_bucket,
)


def test_smallest_bucket_that_holds_the_context():
    buckets = normalize_buckets([512, 128, 256, 128])
    assert buckets == (128, 256, 512)
    assert select_bucket(buckets, 1) == 128
    assert select_bucket(buckets, 128) == 128
    assert select_bucket(buckets, 129) == 256
    assert select_bucket(buckets, 512) == 512
    with pytest.raises(BucketError, match="513 positions is larger than every bucket"):
        select_bucket(buckets, 513)


def test_steps_per_bucket_over_a_generation():
    # a 100-token prompt and 300 new tokens: steps have contexts 101..399
    assert list(decode_contexts(100, 300)) == list(range(101, 400))
    assert steps_per_bucket((128, 256, 512), 100, 300) == {128: 28, 256: 128, 512: 143}
    assert sum(steps_per_bucket((128, 256, 512), 100, 300).values()) == 299
    assert steps_per_bucket((128,), 5, 1) == {}


@pytest.mark.parametrize("bad", [[], [0], [128, -1], [1.5], [True]])
def test_bad_buckets_are_one_line(bad):
    with pytest.raises(BucketError):
        normalize_buckets(bad)


@pytest.mark.parametrize(("bad", "shown"), [("128", "'128'"), (128.0, "128.0"), (None, "None")])
def test_a_bucket_that_is_not_a_list_is_named_whole(bad, shown):
    """n_positions="128" was read character by character ("not '1'"); 128.0 was a TypeError
    traceback ('float' object is not iterable)."""
    with pytest.raises(BucketError, match=f"not {shown}$"):
        normalize_buckets(bad)
