"""``tandem verifier | drafter | gateway``: run one service (what a Kubernetes pod runs)."""

from __future__ import annotations

import argparse

from cli.settings_args import add_settings_args, settings_from

_SERVICES = {
    "verifier": ("verifier_svc.settings", "VerifierSettings",
                 "Serve the target model (tandem.v1.Verifier): Prefill, Verify and, with --draft, co-located Step."),
    "drafter": ("drafter_svc.settings", "DrafterSettings",
                "Serve a drafter (tandem.v1.Drafter): ngram[:N], layerskip:N or a draft model PATH."),
    "gateway": ("gateway.settings", "GatewaySettings",
                "Serve the client API (tandem.v1.Gateway): continuous batching over a verifier and a drafter."),
}


def _settings_class(name: str):
    import importlib

    module, cls, _ = _SERVICES[name]
    return getattr(importlib.import_module(module), cls)


def add_parser(sub) -> None:
    for name, (_, _, description) in _SERVICES.items():
        p = sub.add_parser(name, help=description.split(":")[0].lower(), description=description)
        add_settings_args(p, _settings_class(name), f"{name} settings")
        p.set_defaults(run=run, service=name)


def run(args: argparse.Namespace) -> int:
    settings = settings_from(args, _settings_class(args.service))
    if args.service == "gateway":
        from gateway.main import main
    elif args.service == "verifier":
        from verifier_svc.main import main
    else:
        from drafter_svc.main import main
    main(settings)
    return 0
