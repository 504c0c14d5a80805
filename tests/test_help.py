"""Every subcommand's --help says something real about every flag: no flag without help, no help that only repeats
its name or metavar, no "default: None" on a flag (a required one least of all), no default said twice."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import pytest

from cli.main import build_parser

PARSER = build_parser()
SUBCOMMANDS = next(a for a in PARSER._actions if isinstance(a, argparse._SubParsersAction)).choices


def _rendered(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """A flag's help as --help prints it (with what the formatter appends, e.g. "(default: X)")."""
    formatter = parser._get_formatter()
    return " ".join(formatter._expand_help(action).split()) if action.help else ""


def _problems(parser: argparse.ArgumentParser) -> list[str]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        flag = "/".join(action.option_strings) or action.dest
        text = _rendered(parser, action)
        placeholders = {action.dest.lower(), action.dest.replace("_", " ").lower(), flag.lstrip("-").lower()}
        if isinstance(action.metavar, str):
            placeholders.add(action.metavar.lower())
        if not text:
            out.append(f"{flag}: no help")
        elif action.help.strip().lower() in placeholders:
            out.append(f"{flag}: placeholder help {action.help!r}")
        if re.search(r"default:? None\b", text):
            out.append(f"{flag}: says 'default: None'{' on a required flag' if action.required else ''}: {text!r}")
        if len(re.findall(r"\bdefault\b", text, re.IGNORECASE)) > 1:
            out.append(f"{flag}: says its default twice: {text!r}")
    return out


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_every_flag_has_real_help(command):
    assert _problems(SUBCOMMANDS[command]) == []


def test_the_walk_finds_what_the_issue_found():
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", help="dtype")
    p.add_argument("--max-batch-size", metavar="MAX_BATCH_SIZE", help="max_batch_size")
    p.add_argument("--seed", type=int, default=0)
    assert _problems(p) == ["--dtype: placeholder help 'dtype'", "--max-batch-size: placeholder help 'max_batch_size'",
                            "--seed: no help"]
    p = argparse.ArgumentParser(formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--model", default="smollm2", help="target (default: SmolLM2)")
    assert _problems(p) == [
        "--out: says 'default: None' on a required flag: 'output directory (default: None)'",
        "--model: says its default twice: 'target (default: SmolLM2) (default: smollm2)'"]


def test_top_level_help_keeps_service_names():
    out = subprocess.run([sys.executable, "-m", "cli.main", "--help"], capture_output=True, text=True,
                         check=True).stdout
    for name in ("tandem.v1.Verifier", "tandem.v1.Drafter", "tandem.v1.Gateway"):
        assert name in out
    assert "tandem.v1.verifier" not in out
