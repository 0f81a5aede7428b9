"""Eviction by memory (docs/sleep.md): sleep-mode instances that share a GPU without a swap
group are counted by what must fit - the largest awake, the others asleep - and validation
still refuses what can never fit."""

from __future__ import annotations

from vsup.engine import sleep as sleep_engine
from vsup.layout import schema
from vsup.layout.model import loads_layout
from vsup.layout.validate import validate

from tests.unit.layout.test_sleep_rules import node


def pool(*utils: float, solo: float | None = None) -> str:
    text = '[layout]\nname = "pool"\n\n[defaults]\nmodel = "org/model"\nhost = "127.0.0.1"\n'
    for i, util in enumerate(utils):
        text += (
            f'\n[[instance]]\nname = "p{i}"\ngpus = [0]\nport = {8000 + i}\n'
            f"gpu_memory_utilization = {util}\nsleep = {{ level = 2 }}\n"
        )
    if solo is not None:
        text += (
            f'\n[[instance]]\nname = "solo"\ngpus = [0]\nport = 8100\n'
            f"gpu_memory_utilization = {solo}\n"
        )
    return text


def errors(text: str) -> list:
    return [d for d in validate(loads_layout(text, "/tmp/pool.toml"), node=node()) if d.is_error]


def test_three_sleepers_at_045_share_a_gpu_two_awake_at_a_time() -> None:
    assert errors(pool(0.45, 0.45, 0.45)) == []


def test_what_can_never_fit_is_still_refused_naming_the_pool() -> None:
    # the largest (0.6) awake with the others asleep, beside a solo 0.4: never fits
    found = errors(pool(0.6, 0.3, 0.3, solo=0.4))
    assert {d.instance for d in found} == {"p0", "p1", "p2", "solo"}, [d.format() for d in found]
    message = found[0].message
    assert "GPU 0 is over-committed" in message, message
    assert "sleep mode without a swap group" in message and "0.6 for the largest awake" in message


def test_the_engine_counts_with_the_validators_limits() -> None:
    assert sleep_engine.MAX_GPU_UTILIZATION_SUM == schema.MAX_GPU_UTILIZATION_SUM
    assert (
        sleep_engine.VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
        == schema.VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
    )
