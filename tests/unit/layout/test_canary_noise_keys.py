"""`[layout] canary_warmup_s` and `canary_confidence` (docs/canary.md, "Noise"): compiled into
the rollout's canary, checked with the file and key named, and read together with `canary_s`."""

from __future__ import annotations

from vsup.layout.compiled import layout_settings

from tests.unit.layout.test_canary_keys import check


def test_the_noise_keys_compile_and_their_defaults_keep_todays_layouts(tmp_path):
    layout, diagnostics = check(
        tmp_path, "canary_s = 120\ncanary_warmup_s = 20\ncanary_confidence = 0.99"
    )
    assert [d for d in diagnostics if "canary" in d] == []
    c = layout_settings(layout).rollout.canary
    assert (c.warmup_s, c.warmup, c.confidence) == (20, 20, 0.99)
    layout, _ = check(tmp_path, "canary_s = 120")
    c = layout_settings(layout).rollout.canary
    assert (c.warmup_s, c.warmup, c.confidence) == (None, 12, 0.999)


def test_bad_values_name_the_file_and_key(tmp_path):
    _, diagnostics = check(tmp_path, "canary_s = 60\ncanary_warmup_s = -1\ncanary_confidence = 1")
    (warmup,) = [d for d in diagnostics if "key 'canary_warmup_s'" in d]
    assert warmup.startswith("l.toml:") and "must be 0 or more (it is -1)" in warmup
    (sure,) = [d for d in diagnostics if "key 'canary_confidence'" in d]
    assert sure.startswith("l.toml:") and "must be from 0.5 up to, not including, 1" in sure


def test_a_warm_up_as_long_as_the_watch_is_an_error_and_without_a_watch_a_warning(tmp_path):
    _, diagnostics = check(tmp_path, "canary_s = 30\ncanary_warmup_s = 30")
    (err,) = [d for d in diagnostics if "canary_warmup_s" in d]
    assert "error" in err and "not shorter than canary_s (30 s)" in err
    _, diagnostics = check(tmp_path, "canary_warmup_s = 5\ncanary_confidence = 0.99")
    warned = [d for d in diagnostics if "has no effect without a canary" in d]
    assert len(warned) == 2 and all("warning" in d for d in warned)
