"""Edge settings: the optional numbers that say "none: off" take none from the environment and the flags."""

from __future__ import annotations

import argparse

import pytest

from cli.settings_args import add_settings_args, settings_from
from rpc.settings import EngineSettings, load

OPTIONAL = ["metrics_port", "kv_cache_tokens", "max_round_tokens", "spec_max_batch", "pipeline_max_batch"]


@pytest.mark.parametrize("word", ["none", "None", "NONE", ""])
@pytest.mark.parametrize("field", OPTIONAL)
def test_none_from_the_environment_turns_an_optional_number_off(monkeypatch, field, word):
    monkeypatch.setenv(f"TANDEM_{field.upper()}", word)
    assert getattr(load(EngineSettings), field) is None


def test_a_flag_overrides_the_environment_either_way(monkeypatch):
    p = argparse.ArgumentParser()
    add_settings_args(p, EngineSettings, "engine")
    monkeypatch.setenv("TANDEM_SPEC_MAX_BATCH", "16")
    assert settings_from(p.parse_args([]), EngineSettings).spec_max_batch == 16
    assert settings_from(p.parse_args(["--spec-max-batch", "none"]), EngineSettings).spec_max_batch is None
    monkeypatch.setenv("TANDEM_SPEC_MAX_BATCH", "none")
    assert settings_from(p.parse_args(["--spec-max-batch", "2"]), EngineSettings).spec_max_batch == 2
    assert load(EngineSettings).engine_config().spec_max_batch is None


@pytest.mark.parametrize("value, message", [("lots", "valid integer"), ("-1", "greater than or equal to 0")])
def test_a_bad_value_names_the_field(monkeypatch, value, message):
    monkeypatch.setenv("TANDEM_SPEC_MAX_BATCH", value)
    with pytest.raises(ValueError, match=rf"^spec_max_batch: .*{message}"):
        load(EngineSettings)
