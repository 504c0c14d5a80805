"""``tandem verifier | drafter | gateway``: run one service (what a Kubernetes pod runs)."""

from __future__ import annotations

import argparse

from cli.settings_args import add_settings_args, settings_from

# name -> (settings module, settings class, one line for `tandem --help`, the description of `tandem NAME --help`)
_SERVICES = {
    "verifier": ("verifier_svc.settings", "VerifierSettings", "serve the target model (tandem.v1.Verifier)",
                 "Serve the target model (tandem.v1.Verifier): Prefill, Verify and, with --draft, co-located Step."),
    "drafter": ("drafter_svc.settings", "DrafterSettings", "serve a drafter (tandem.v1.Drafter)",
                "Serve a drafter (tandem.v1.Drafter) for a gateway in split mode. --draft picks it: auto (the "
                "default: the drafter trained for the model, an EAGLE head for SmolLM2-135M-Instruct, else ngram), "
                "ngram[:N], layerskip:N or a PATH (an EAGLE head or a draft model)."),
    "gateway": ("gateway.settings", "GatewaySettings", "serve the client API (tandem.v1.Gateway)",
                "Serve the client API (tandem.v1.Gateway): continuous batching over verifiers and (split mode) "
                "drafters, one spec.round span per round."),
}


def _settings_class(name: str):
    import importlib

    module, cls, _, _ = _SERVICES[name]
    return getattr(importlib.import_module(module), cls)


def add_parser(sub) -> None:
    for name, (_, _, summary, description) in _SERVICES.items():
        p = sub.add_parser(name, help=summary, description=description)
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
