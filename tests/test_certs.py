"""``tandem certs``: the files deploy/'s secrets are made of load as each service's TLS settings, name the hosts the
gateway dials (the Services, namespace-qualified with --namespace), and give only the gateway a client certificate."""

from __future__ import annotations

import os

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from cli.main import main
from rpc.auth import ApiKeys
from rpc.settings import ServerSettings, load
from rpc.tls import certificate_names, internal_identity


@pytest.fixture(autouse=True)
def _no_tandem_env(monkeypatch):
    for key in [k for k in os.environ if k.startswith("TANDEM_")]:
        monkeypatch.delenv(key)


def _usages(path) -> set:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    return set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def test_certs_for_the_cluster(tmp_path, capsys):
    out = tmp_path / "certs"
    assert main(["certs", "--out", str(out), "--namespace", "tandem", "--gateway-host", "tandem.example.com"]) == 0
    printed = capsys.readouterr().out
    for service in ("gateway", "verifier", "drafter"):
        settings = load(ServerSettings, tls_cert_file=str(out / f"{service}.crt"),
                        tls_key_file=str(out / f"{service}.key"), tls_ca_file=str(out / "ca.crt"))
        identity = internal_identity(settings)  # each key belongs to its certificate, all signed by ca.crt
        names = certificate_names(identity.cert)
        assert f"tandem-{service}" in names and f"tandem-{service}.tandem.svc" in names and "localhost" in names
        assert oct((out / f"{service}.key").stat().st_mode & 0o777) == "0o600"
        assert f"create secret generic tandem-{service}-tls --from-file=tls.crt={out}/{service}.crt" in printed
    assert "tandem-verifier-headless" in certificate_names((out / "verifier.crt").read_bytes())
    assert "tandem.example.com" in certificate_names((out / "gateway.crt").read_bytes())
    assert _usages(out / "gateway.crt") == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert _usages(out / "verifier.crt") == _usages(out / "drafter.crt") == {ExtendedKeyUsageOID.SERVER_AUTH}
    assert len(ApiKeys.load(str(out / "api-keys"))) == 1
    assert "create secret generic tandem-api-keys --from-file=keys=" in printed


def test_certs_for_the_split_where_the_verifier_calls_its_drafter(tmp_path, capsys):
    """--direct-draft (deploy/overlays/split-direct): the verifier's certificate serves and calls; the drafter's
    still only serves."""
    assert main(["certs", "--out", str(tmp_path), "--direct-draft"]) == 0
    assert _usages(tmp_path / "verifier.crt") == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert _usages(tmp_path / "drafter.crt") == {ExtendedKeyUsageOID.SERVER_AUTH}


def test_certs_never_overwrite(tmp_path, capsys):
    assert main(["certs", "--out", str(tmp_path)]) == 0
    before = (tmp_path / "ca.crt").read_bytes()
    assert main(["certs", "--out", str(tmp_path)]) == 2
    assert "already holds ca.crt" in capsys.readouterr().err
    assert (tmp_path / "ca.crt").read_bytes() == before
