"""argparse flags generated from a pydantic-settings class: one flag per field, same names as TANDEM_* vars."""

from __future__ import annotations

import argparse
import typing

from rpc.settings import TandemSettings, load


def add_settings_args(p: argparse.ArgumentParser, cls: type[TandemSettings], title: str,
                      exclude: tuple[str, ...] = ()) -> tuple[str, ...]:
    """One flag per field of ``cls`` (but ``exclude``); returns the fields that got one."""
    g = p.add_argument_group(title, "each flag overrides the TANDEM_<NAME> environment variable")
    fields = tuple(name for name in cls.model_fields if name not in exclude)
    for name in fields:
        f = cls.model_fields[name]
        flag = "--" + name.replace("_", "-")
        env = f"TANDEM_{name.upper()}"
        # a field whose default is None says in its description what it means (derived, or off)
        default = "" if f.default is None else f"; default {_word(f.default)}"
        help_ = f"{f.description} ({env}{default})"
        if f.annotation is bool:
            g.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_)
        else:
            g.add_argument(flag, dest=name, default=None, metavar=name.upper(), choices=_choices(f.annotation),
                           help=help_)
    return fields


def _word(value: object) -> str:
    """A default as the help says it: on/off for a switch."""
    return {True: "on", False: "off"}.get(value, str(value)) if isinstance(value, bool) else str(value)


def _choices(annotation) -> list[str] | None:
    """The values of a Literal[...] (also inside Optional), else None."""
    if typing.get_origin(annotation) is typing.Literal:
        return list(typing.get_args(annotation))
    for arg in typing.get_args(annotation):
        if typing.get_origin(arg) is typing.Literal:
            return list(typing.get_args(arg))
    return None


def settings_from(args: argparse.Namespace, cls: type[TandemSettings], fields: tuple[str, ...] | None = None,
                  **overrides):
    """``cls`` from the environment, overridden by the flags of ``fields`` (default: every field) that were given
    and then by ``overrides``."""
    names = cls.model_fields if fields is None else fields
    return load(cls, **{**{name: getattr(args, name, None) for name in names}, **overrides})
