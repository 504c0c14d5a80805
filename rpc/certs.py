"""Make certificates: a private CA and the service certificates it signs, as PEM (the ``cryptography`` package).

What ``tandem serve`` (``rpc.stack``) makes for itself in a private temporary directory on every start, what
``tandem certs`` writes for a cluster without cert-manager, and what the tests make to play a stranger. Keys are
ECDSA P-256. A certificate says what it may be used for (extended key usage): a ``server`` certificate lets a
service prove itself to its callers, a ``client`` certificate lets a caller prove itself to a service that
requires client certificates (the verifier and the drafter accept only callers holding one their CA signed).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# where ``tandem serve``'s services live: every certificate it makes names this machine
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class Issued:
    cert: bytes  # PEM
    key: bytes   # PEM (PKCS#8, unencrypted)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "tandem"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _san(hosts: Iterable[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


class CertificateAuthority:
    """A CA that exists for one purpose (one ``tandem serve``, one cluster's services); ``days``: how long what it
    signs (and itself) stays valid."""

    def __init__(self, name: str = "tandem CA", days: float = 365.0) -> None:
        self.days = days
        self._key = _key()
        now = datetime.datetime.now(datetime.timezone.utc)
        self._name = _name(name)
        self.certificate = (
            x509.CertificateBuilder().subject_name(self._name).issuer_name(self._name)
            .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256()))

    @property
    def cert(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def issue(self, name: str, hosts: Iterable[str] = (), *, server: bool = True, client: bool = False) -> Issued:
        """A certificate for ``name`` valid for ``hosts`` (DNS names or IP addresses the callers dial), usable as a
        server certificate, a client certificate, or both."""
        if not (server or client):
            raise ValueError("issue: a certificate must be usable by a server, a client or both")
        key = _key()
        now = datetime.datetime.now(datetime.timezone.utc)
        usages = [oid for wanted, oid in ((server, ExtendedKeyUsageOID.SERVER_AUTH),
                                          (client, ExtendedKeyUsageOID.CLIENT_AUTH)) if wanted]
        builder = (
            x509.CertificateBuilder().subject_name(_name(name)).issuer_name(self._name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=self.days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                           critical=False))
        hosts = list(hosts)
        if hosts:
            builder = builder.add_extension(_san(hosts), critical=False)
        return Issued(builder.sign(self._key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM), _key_pem(key))


def write_private(path: Path, data: bytes) -> Path:
    """Write ``data`` readable by this user alone (0600 from the start, never wider)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


@dataclass(frozen=True)
class CertFiles:
    """Where one identity's PEM files are."""
    cert_file: Path
    key_file: Path


def write_identities(directory: Path, identities: dict[str, tuple[Iterable[str], bool, bool]],
                     ca: CertificateAuthority) -> tuple[Path, dict[str, CertFiles]]:
    """``ca.crt`` and, for each ``name: (hosts, server, client)``, ``NAME.crt`` and ``NAME.key`` in ``directory``
    (which must exist); returns the CA file and each identity's files."""
    ca_file = directory / "ca.crt"
    ca_file.write_bytes(ca.cert)
    out = {}
    for name, (hosts, server, client) in identities.items():
        issued = ca.issue(f"tandem-{name}", hosts, server=server, client=client)
        cert_file = directory / f"{name}.crt"
        cert_file.write_bytes(issued.cert)
        out[name] = CertFiles(cert_file, write_private(directory / f"{name}.key", issued.key))
    return ca_file, out
