"""argparse flags generated from a pydantic-settings class: one flag per field, same names as TANDEM_* vars."""

from __future__ import annotations

import argparse
import typing

from rpc.settings import TandemSettings, load


def add_settings_args(p: argparse.ArgumentParser, cls: type[TandemSettings], title: str) -> None:
    g = p.add_argument_group(title, "each flag overrides the TANDEM_<NAME> environment variable")
    for name, f in cls.model_fields.items():
        flag = "--" + name.replace("_", "-")
        env = f"TANDEM_{name.upper()}"
        default = f.default if f.default is not None else "unset"
        help_ = f"{f.description or name} ({env}; default {default})"
        if f.annotation is bool:
            g.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_)
        else:
            g.add_argument(flag, dest=name, default=None, metavar=name.upper(), choices=_choices(f.annotation),
                           help=help_)


def _choices(annotation) -> list[str] | None:
    """The values of a Literal[...] (also inside Optional), else None."""
    if typing.get_origin(annotation) is typing.Literal:
        return list(typing.get_args(annotation))
    for arg in typing.get_args(annotation):
        if typing.get_origin(arg) is typing.Literal:
            return list(typing.get_args(arg))
    return None


def settings_from(args: argparse.Namespace, cls: type[TandemSettings]):
    return load(cls, **{name: getattr(args, name, None) for name in cls.model_fields})
