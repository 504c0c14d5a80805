"""Edge settings: the optional numbers that say "none: off" take none from the environment and the flags."""

from __future__ import annotations

import argparse

import pytest

from cli.settings_args import add_settings_args, settings_from
from rpc.settings import EngineSettings, ServiceEngineSettings, load

OPTIONAL = ["metrics_port", "kv_cache_tokens", "max_round_tokens", "spec_max_batch", "pipeline_max_batch",
            "plain_steps", "spec_rounds"]


@pytest.mark.parametrize("word", ["none", "None", "NONE", ""])
@pytest.mark.parametrize("field", OPTIONAL)
def test_none_from_the_environment_turns_an_optional_number_off(monkeypatch, field, word):
    monkeypatch.setenv(f"TANDEM_{field.upper()}", word)
    assert getattr(load(ServiceEngineSettings), field) is None


def test_a_flag_overrides_the_environment_either_way(monkeypatch):
    p = argparse.ArgumentParser()
    add_settings_args(p, EngineSettings, "engine")
    monkeypatch.setenv("TANDEM_SPEC_MAX_BATCH", "16")
    assert settings_from(p.parse_args([]), EngineSettings).spec_max_batch == 16
    assert settings_from(p.parse_args(["--spec-max-batch", "none"]), EngineSettings).spec_max_batch is None
    monkeypatch.setenv("TANDEM_SPEC_MAX_BATCH", "none")
    assert settings_from(p.parse_args(["--spec-max-batch", "2"]), EngineSettings).spec_max_batch == 2
    assert load(EngineSettings).engine_config().spec_max_batch is None


def test_rounds_a_replay_and_arrivals_gathered_default_by_device(monkeypatch):
    """--spec-rounds none: two greedy rounds a replay where rounds are captured (cuda), one where they run eagerly;
    --admit-group 1 (each arrival as it comes); the flags and the environment set them, and bad values name them."""
    from engine.config import EngineConfig

    assert EngineConfig(device="cuda").spec_round_count == 2 and EngineConfig().spec_round_count == 1
    assert EngineConfig(device="cuda", fused_rounds=False).spec_round_count == 1
    assert EngineConfig(device="cuda", spec_rounds=3).spec_round_count == 3
    p = argparse.ArgumentParser()
    add_settings_args(p, EngineSettings, "engine")
    cfg = settings_from(p.parse_args(["--spec-rounds", "1", "--admit-group", "8"]), EngineSettings).engine_config()
    assert (cfg.spec_rounds, cfg.admit_group, cfg.admit_group_min_batch, cfg.spec_rounds_min_batch) == (1, 8, 16, 16)
    monkeypatch.setenv("TANDEM_ADMIT_GROUP", "0")
    with pytest.raises(ValueError, match=r"^admit_group: .*greater than or equal to 1"):
        load(EngineSettings)
    with pytest.raises(ValueError, match=r"^spec_rounds: must be >= 1"):
        EngineConfig(spec_rounds=0)


def test_a_draft_tree_from_a_flag_or_the_environment(monkeypatch):
    """--spec-tree 2,2,1,1 (or TANDEM_SPEC_TREE) reaches the engine's config as children per depth; none turns it off,
    and text that is not a tree names the field."""
    p = argparse.ArgumentParser()
    add_settings_args(p, EngineSettings, "engine")
    argv = ["--device", "cuda", "--spec-tree", "2,2,1,1"]
    assert settings_from(p.parse_args(argv), EngineSettings).engine_config().spec_tree == (2, 2, 1, 1)
    assert settings_from(p.parse_args(["--device", "cuda"]), EngineSettings).engine_config().spec_tree is None
    monkeypatch.setenv("TANDEM_SPEC_TREE", "none")
    assert load(EngineSettings).spec_tree is None
    monkeypatch.setenv("TANDEM_SPEC_TREE", "2;2")
    with pytest.raises(ValueError, match=r"^spec_tree: .*children per depth"):
        load(EngineSettings)
    monkeypatch.setenv("TANDEM_SPEC_TREE", "3,1")  # no k given: the tree's depth
    assert load(EngineSettings, device="cuda").engine_config().k == 2
    assert settings_from(p.parse_args(["--device", "cuda", "--spec-tree", "2,1,1"]), EngineSettings).k == 3
    monkeypatch.setenv("TANDEM_K", "4")  # a k given: the tree must have its depth
    monkeypatch.setenv("TANDEM_SPEC_TREE", "2,2,1")
    with pytest.raises(ValueError, match=r"^spec_tree: must have k = 4 depths .*set k to 3"):
        load(EngineSettings, device="cuda").engine_config()


@pytest.mark.parametrize("value, message", [("lots", "valid integer"), ("-1", "greater than or equal to 0")])
def test_a_bad_value_names_the_field(monkeypatch, value, message):
    monkeypatch.setenv("TANDEM_SPEC_MAX_BATCH", value)
    with pytest.raises(ValueError, match=rf"^spec_max_batch: .*{message}"):
        load(EngineSettings)


def _parsed(*argv):
    from cli.main import build_parser

    return build_parser().parse_args(list(argv))


def test_cli_and_services_read_the_same_engine_settings(monkeypatch):
    """One settings model for the CLI's in-process commands and the services: same defaults, same k rule."""
    for var in [v for v in __import__("os").environ if v.startswith("TANDEM_")]:
        monkeypatch.delenv(var)
    from cli.options import engine_settings
    from cli.settings_args import settings_from
    from drafter_svc.settings import DrafterSettings
    from verifier_svc.settings import VerifierSettings

    cli = engine_settings(_parsed("generate", "--prompt", "x", "--k", "12"))
    verifier = settings_from(_parsed("verifier", "--k", "12"), VerifierSettings)
    drafter = settings_from(_parsed("drafter", "--k", "12"), DrafterSettings)
    assert cli.engine_config() == verifier.engine_config()  # the verifier's drafter default (none) is not in it
    assert cli.engine_config().k == cli.engine_config().max_k == 12  # max_k follows a k above 8
    for name in EngineSettings.model_fields:
        if name != "draft":  # the verifier embeds no drafter unless asked (split mode)
            assert getattr(cli, name) == getattr(verifier, name) == getattr(drafter, name), name
    # sampled drafts cross the wire as their top 32 from a drafter service; in process the whole distribution
    assert drafter.engine_config(wire=True).draft_top_m == 32 and cli.engine_config().draft_top_m == 0
    assert settings_from(_parsed("generate", "--prompt", "x", "--no-fused-rounds"), EngineSettings,
                         ).engine_config().fused_rounds is False


@pytest.mark.parametrize("argv", [("generate", "--prompt", "x"), ("verifier",), ("gateway",)])
def test_one_k_rule_everywhere(monkeypatch, argv):
    from cli.settings_args import settings_from
    from gateway.settings import GatewaySettings
    from verifier_svc.settings import VerifierSettings

    cls = {"generate": EngineSettings, "verifier": VerifierSettings, "gateway": GatewaySettings}[argv[0]]
    with pytest.raises(ValueError, match=r"^k: must be in \[0, max_k=4\], got 5$"):
        settings_from(_parsed(*argv, "--k", "5", "--max-k", "4"), cls)
    with pytest.raises(ValueError, match=r"^k: must be in \[0, max_k=32\], got 40$"):
        settings_from(_parsed(*argv, "--k", "40"), cls)
    monkeypatch.setenv("TANDEM_K", "10")
    assert settings_from(_parsed(*argv), cls).max_k == 10


def test_a_verifier_takes_an_embedded_drafter_or_a_drafter_service_not_both():
    from verifier_svc.settings import VerifierSettings

    assert VerifierSettings(direct_drafter_address="localhost:50053", insecure=True).draft == "none"
    with pytest.raises(ValueError, match="draft.*direct_drafter_address"):
        VerifierSettings(draft="ngram", direct_drafter_address="localhost:50053", insecure=True)


def test_the_gateways_drafter_address_does_not_reach_a_verifier(monkeypatch):
    """One ConfigMap sets TANDEM_DRAFTER_ADDRESS for the gateway: a verifier reads it not as a drafter of its own."""
    from verifier_svc.settings import VerifierSettings

    monkeypatch.setenv("TANDEM_DRAFTER_ADDRESS", "tandem-drafter:50053")
    assert VerifierSettings(draft="ngram", insecure=True).direct_drafter_address is None
