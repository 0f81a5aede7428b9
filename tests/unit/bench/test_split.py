"""Splitting a layout's prompts and request rate across its instances."""

from __future__ import annotations

import math

import pytest

from vsup.bench.split import split_prompts, split_rate, weights_for
from vsup.snapshot import empty_instance


@pytest.mark.parametrize(
    ("total", "weights", "expected"),
    [
        (16, [1, 1], [8, 8]),
        (15, [1, 1], [8, 7]),  # the remainder goes to the earlier instance
        (10, [1, 1, 1], [4, 3, 3]),
        (12, [2, 1], [8, 4]),  # a TP2 instance beside a TP1 takes twice the prompts
        (1000, [3, 1], [750, 250]),
        (7, [5, 5, 5, 5, 5, 5, 5, 5], [1, 1, 1, 1, 1, 1, 1, 0]),
    ],
)
def test_prompts_split_in_proportion_and_sum_to_the_total(total, weights, expected):
    assert split_prompts(total, weights) == expected
    assert sum(split_prompts(total, weights)) == total


def test_every_instance_gets_a_prompt_when_there_are_enough():
    shares = split_prompts(4, [1000, 1, 1, 1])
    assert shares == [1, 1, 1, 1]
    shares = split_prompts(10, [100, 1])
    assert shares == [9, 1]


def test_unusable_weights_split_evenly():
    assert split_prompts(6, [0, 0, 0]) == [2, 2, 2]
    assert split_prompts(6, [math.inf, 1]) == [3, 3]
    assert split_prompts(5, []) == []


def test_rate_follows_the_prompts_and_inf_stays_inf():
    assert split_rate(math.inf, [8, 8]) == [math.inf, math.inf]
    assert split_rate(12.0, [8, 4]) == [8.0, 4.0]


def test_weights_are_kv_capacity_when_every_instance_reports_it():
    insts = [
        empty_instance("a", gpus=(0,), kv_capacity_tokens=300_000),
        empty_instance("b", gpus=(1,), kv_capacity_tokens=100_000),
    ]
    assert weights_for(insts) == ([300_000.0, 100_000.0], "kv_capacity_tokens")
    insts[1] = empty_instance("b", gpus=(1,), kv_capacity_tokens=None)
    assert weights_for(insts) == ([1.0, 1.0], "gpus")
    tp = [empty_instance("a", gpus=(0, 1)), empty_instance("b", gpus=())]
    assert weights_for(tp) == ([2.0, 1.0], "gpus")
