"""``tandem`` as a user runs it: real subprocesses on the real default model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from engine.assets import default_model_path
from engine.config import SamplingParams
from tests.conftest import make_decoder


def tandem(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=600)


def test_generate_chat_json_matches_engine(smollm):
    prompt = "Give me one tip for learning to cook."
    proc = tandem("generate", "--prompt", prompt, "--chat", "--max-tokens", "12", "--draft", "ngram", "--k", "3",
                  "--device", "cpu", "--json")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.rstrip("\n").split("\n")
    summary = json.loads(lines[-1])
    assert {"text", "token_ids", "rounds", "acceptance_length", "tokens_per_s"} <= set(summary)
    assert "\n".join(lines[:-1]) == summary["text"]  # the streamed text, then the JSON line
    ids = smollm.tokenizer.encode_chat([{"role": "user", "content": prompt}])
    ref = make_decoder(smollm, "none").generate([ids], SamplingParams(max_tokens=12))[0]
    assert summary["token_ids"] == ref.new_token_ids
    assert summary["prompt_tokens"] == len(ids)
    assert summary["rounds"] >= 1 and summary["acceptance_length"] >= 1.0
    assert summary["device"] == "cpu" and summary["dtype"] == "float32" and summary["draft"] == "ngram"
    assert "load SmolLM2" in proc.stderr  # the loading progress bar


def test_generate_raw_prompt_uses_no_template(smollm):
    prompt = "The capital of Italy is"
    proc = tandem("generate", "--prompt", prompt, "--max-tokens", "4", "--draft", "none", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().split("\n")[-1])
    assert summary["prompt_tokens"] == len(smollm.tokenizer.encode(prompt))
    assert summary["rounds"] == len(summary["token_ids"])  # plain decoding: one token per round


@pytest.mark.parametrize("args, message", [
    (["--top-p", "0"], "top_p:"), (["--temperature", "-1"], "temperature:"), (["--k", "99"], "k: must be in"),
    (["--draft", "layerskip:x"], "draft:"), (["--model", "/no/such/model.gguf"], "/no/such/model.gguf"),
])
def test_bad_flags_exit_2_naming_the_field(args, message):
    proc = tandem("generate", "--prompt", "hi", *args)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_smollm2_gguf_env_is_honoured(smollm_path, monkeypatch):
    monkeypatch.setenv("SMOLLM2_GGUF", str(smollm_path))
    assert default_model_path() == smollm_path
    monkeypatch.setenv("SMOLLM2_GGUF", "/nowhere/x.gguf")
    with pytest.raises(FileNotFoundError, match="SMOLLM2_GGUF"):
        default_model_path()


def test_help_explains_commands():
    proc = tandem("generate", "--help")
    assert proc.returncode == 0
    for flag in ("--prompt", "--chat", "--model", "--draft", "--k", "--temperature", "--top-p", "--top-k",
                 "--seed", "--max-tokens", "--device", "--dtype", "--json"):
        assert flag in proc.stdout
