"""Flag groups shared by subcommands, and their conversion into validated configuration."""

from __future__ import annotations

import argparse

from cli.settings_args import add_settings_args, settings_from
from engine.config import SamplingParams
from rpc.settings import EngineSettings


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's "(default: X)" after a flag's help, only where it says something: not for a required flag, a
    default of None (the help says what happens then), an on/off switch, or help that names its default already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (action.required or action.default is None or action.default is argparse.SUPPRESS
                or isinstance(action.default, bool) or "default" in text):
            return text
        return super()._get_help_string(action)


def add_engine_args(p: argparse.ArgumentParser, draft: bool = True, k: bool = True) -> None:
    """The engine's flags, generated from ``rpc.settings.EngineSettings`` as the services' are (same names,
    defaults and TANDEM_* variables); ``draft``/``k`` False: the caller defines its own --draft / --k."""
    exclude = tuple(name for name, keep in (("draft", draft), ("k", k)) if not keep)
    p.set_defaults(engine_fields=add_settings_args(p, EngineSettings, "model and engine", exclude))


def engine_settings(args: argparse.Namespace, **overrides) -> EngineSettings:
    """The engine settings of a command: TANDEM_* variables, then its flags, then ``overrides`` (validated once)."""
    return settings_from(args, EngineSettings, args.engine_fields, **overrides)


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default 0)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus mass in (0, 1] (default 1: off)")
    g.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (default 0: off)")
    g.add_argument("--seed", type=int, help="seed for sampled output (default: random)")
    g.add_argument("--max-tokens", type=int, default=256, help="new tokens at most (default 256)")
    g.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop when this text appears (repeatable); it is not part of the output")
    g.add_argument("--ignore-eos", action="store_true", help="keep going past the end-of-sequence token")


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                          max_tokens=args.max_tokens, stop=tuple(args.stop), ignore_eos=args.ignore_eos)
