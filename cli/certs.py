"""``tandem certs``: a CA and the certificates of the three services, and an API key, as files for Kubernetes
secrets (or ``tandem gateway | verifier | drafter`` run by hand), where cert-manager is not at hand.

Each certificate names the hosts its callers dial: the Services of deploy/ (``tandem-verifier``,
``tandem-verifier-headless``, ...), their namespace-qualified names with ``--namespace``, and localhost. The
gateway's is both a client certificate (towards the verifiers and drafters) and a server certificate (its client
API, with ``--gateway-host`` for the names clients use); the verifier's and drafter's are server certificates only,
so neither can call the other, unless ``--direct-draft``: then the verifier's is a client certificate too, for the
split mode where it calls its drafter (deploy/overlays/split-direct). The CA's key is not kept: to rotate or add a
service, make a new set.
"""

from __future__ import annotations

import argparse
import secrets
from pathlib import Path

SECRETS = {"gateway": "tandem-gateway-tls", "verifier": "tandem-verifier-tls", "drafter": "tandem-drafter-tls"}
API_KEYS_SECRET = "tandem-api-keys"


def add_parser(sub) -> None:
    p = sub.add_parser("certs", help="make a CA, the services' certificates and an API key (Kubernetes secrets)",
                       description="Write ca.crt, gateway.crt/.key, verifier.crt/.key, drafter.crt/.key and api-keys "
                                   "(one new API key) into --out, and print the kubectl commands that turn them into "
                                   "the secrets deploy/ mounts. For a cluster without cert-manager "
                                   "(deploy/README.md, Security).")
    p.add_argument("--out", type=Path, required=True, help="directory to write into (made if missing; existing "
                                                           "files are not overwritten)")
    p.add_argument("--namespace", help="also name the Services as NAME.NAMESPACE.svc and "
                                       "NAME.NAMESPACE.svc.cluster.local")
    p.add_argument("--gateway-host", action="append", default=[],
                   help="another name or address clients reach the gateway by (repeatable)")
    p.add_argument("--days", type=float, default=365.0, help="how long the certificates are valid (default 365)")
    p.add_argument("--direct-draft", action="store_true",
                   help="the verifier's certificate is a client certificate too: split mode with the verifier calling "
                        "its drafter (deploy/overlays/split-direct); without it the verifier cannot call the drafter")
    p.set_defaults(run=run)


def hosts(service: str, namespace: str | None, extra: list[str]) -> list[str]:
    names = [f"tandem-{service}"] + ([f"tandem-{service}-headless"] if service != "gateway" else [])
    qualified = [f"{n}.{namespace}.{suffix}" for n in names for suffix in ("svc", "svc.cluster.local")] \
        if namespace else []
    return [*names, *qualified, *extra, "localhost", "127.0.0.1"]


def run(args: argparse.Namespace) -> int:
    from rpc.certs import CertificateAuthority, write_identities, write_private

    if args.days <= 0:
        raise ValueError(f"--days: must be > 0, got {args.days}")
    out: Path = args.out
    names = ["ca.crt", "api-keys", *(f"{s}.{ext}" for s in SECRETS for ext in ("crt", "key"))]
    existing = [n for n in names if (out / n).exists()]
    if existing:
        raise ValueError(f"--out: {out} already holds {', '.join(existing)}; choose an empty directory")
    out.mkdir(parents=True, exist_ok=True)
    ca = CertificateAuthority("tandem CA", days=args.days)
    write_identities(out, {"gateway": (hosts("gateway", args.namespace, args.gateway_host), True, True),
                           "verifier": (hosts("verifier", args.namespace, []), True, args.direct_draft),
                           "drafter": (hosts("drafter", args.namespace, []), True, False)}, ca)
    write_private(out / "api-keys", f"{secrets.token_urlsafe(32)}\n".encode())
    ns = f" -n {args.namespace}" if args.namespace else ""
    print(f"wrote {', '.join(names)} to {out} (the keys are readable by you alone). The secrets deploy/ mounts:")
    for service, secret in SECRETS.items():
        print(f"  kubectl{ns} create secret generic {secret} --from-file=tls.crt={out}/{service}.crt "
              f"--from-file=tls.key={out}/{service}.key --from-file=ca.crt={out}/ca.crt")
    print(f"  kubectl{ns} create secret generic {API_KEYS_SECRET} --from-file=keys={out}/api-keys")
    print(f"Clients send 'authorization: Bearer <a line of {out}/api-keys>' and check the gateway's certificate "
          f"against {out}/ca.crt.")
    return 0
