"""TLS of the gRPC ports from PEM files named by settings: mutual TLS between the services, TLS towards clients.

Internal traffic (gateway -> verifier, gateway -> drafter) is mutual TLS: each service has a certificate and key
(``tls_cert_file``, ``tls_key_file``) and the CA that signs its peers' (``tls_ca_file``), the files a Kubernetes
secret or cert-manager mounts (``tls.crt``, ``tls.key``, ``ca.crt``). The verifier and the drafter require a
client certificate their CA signed, for client use (extended key usage ``clientAuth``: a verifier's or drafter's
own server certificate cannot call a peer); the gateway presents its certificate and checks theirs against the
CA. Health and reflection are served on the same port and the same terms. Without the three files a service does
not start, unless ``insecure`` says plaintext on purpose (``internal_identity`` says which setting is missing).

The gateway's client side is separate: TLS with a server certificate (``api_tls_cert_file``, ``api_tls_key_file``;
clients need no certificate) when given, plaintext otherwise; who may call it is ``rpc.auth``'s.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
from dataclasses import dataclass

import grpc

log = logging.getLogger("tandem.rpc")

INTERNAL = ("tls_cert_file", "tls_key_file", "tls_ca_file")
API = ("api_tls_cert_file", "api_tls_key_file")


@dataclass(frozen=True)
class Identity:
    """A service's certificate and key and the CA of its peers, PEM."""
    cert: bytes
    key: bytes
    ca: bytes

    def server_credentials(self) -> grpc.ServerCredentials:
        """A port that requires a client certificate signed by the CA."""
        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.ca,
                                           require_client_auth=True)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """A channel that presents this certificate and accepts only servers the CA signed."""
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                            certificate_chain=self.cert)


def is_loopback(host: str) -> bool:
    """Whether listening on ``host`` reaches this machine alone (``localhost``, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def internal_identity(settings) -> Identity | None:
    """The service's mutual-TLS identity from its settings; None where ``insecure`` asks for plaintext.

    A ValueError names what is wrong: a missing file setting (and how to do without), a file that cannot be read
    or is not what its setting says, a key that does not belong to its certificate, plaintext asked for with
    files given.
    """
    given = {name: getattr(settings, name) for name in INTERNAL}
    missing = [name for name, value in given.items() if not value]
    if settings.insecure:
        if len(missing) < len(INTERNAL):
            raise ValueError(f"insecure: plaintext was asked for, but {', '.join(n for n in INTERNAL if given[n])} "
                             f"{'is' if len(INTERNAL) - len(missing) == 1 else 'are'} set too: give the TLS files or "
                             "insecure, not both")
        return None
    if missing:
        raise ValueError(f"{', '.join(missing)}: not set. Internal gRPC traffic is mutual TLS: give this service "
                         "its certificate, its key and the CA that signs its peers' (tls_cert_file, tls_key_file, "
                         "tls_ca_file, e.g. a mounted secret's tls.crt, tls.key and ca.crt; `tandem certs` makes a "
                         "set), or set insecure for plaintext with no authentication")
    cert, key = _pair(given["tls_cert_file"], given["tls_key_file"], "tls_cert_file", "tls_key_file")
    return Identity(cert, key, _ca(given["tls_ca_file"], "tls_ca_file"))


def api_server_credentials(settings) -> grpc.ServerCredentials | None:
    """The gateway's client-facing TLS (a server certificate; clients need none), or None for plaintext."""
    given = {name: getattr(settings, name) for name in API}
    if not any(given.values()):
        return None
    missing = [name for name, value in given.items() if not value]
    if missing:
        raise ValueError(f"{missing[0]}: not set, while {next(n for n in API if given[n])} is: client-facing TLS "
                         "needs both the certificate and its key")
    cert, key = _pair(given["api_tls_cert_file"], given["api_tls_key_file"], "api_tls_cert_file", "api_tls_key_file")
    return grpc.ssl_server_credentials([(key, cert)], require_client_auth=False)


def describe(identity: Identity | None) -> str:
    """How a service's internal port is protected, for its log."""
    if identity is None:
        return "PLAINTEXT, no authentication (insecure)"
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(identity.cert)
    ca = x509.load_pem_x509_certificate(identity.ca)
    return (f"mutual TLS as {cert.subject.rfc4514_string()} (valid until {cert.not_valid_after_utc:%Y-%m-%d %H:%M} "
            f"UTC), peers signed by {ca.subject.rfc4514_string()}")


def certificate_names(pem: bytes) -> list[str]:
    """The DNS names and IP addresses a certificate (the first of a PEM chain) is valid for."""
    from cryptography import x509

    cert = x509.load_pem_x509_certificates(pem)[0]
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [*san.get_values_for_type(x509.DNSName), *(str(ip) for ip in san.get_values_for_type(x509.IPAddress))]


# ---------------------------------------------------------------------------------------------------- files


def read_file(setting: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise ValueError(f"{setting}: cannot read {path} ({exc.strerror or exc})") from None


def _certificates(setting: str, path: str):
    from cryptography import x509

    data = read_file(setting, path)
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise ValueError(f"{setting}: {path} holds no PEM certificate") from None
    now = datetime.datetime.now(datetime.timezone.utc)
    for cert in certs:
        if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
            raise ValueError(f"{setting}: {path}: the certificate {cert.subject.rfc4514_string()} is valid only from "
                             f"{cert.not_valid_before_utc:%Y-%m-%d %H:%M} to {cert.not_valid_after_utc:%Y-%m-%d %H:%M} "
                             "UTC")
    return data, certs


def _ca(path: str, setting: str) -> bytes:
    return _certificates(setting, path)[0]


def _pair(cert_path: str, key_path: str, cert_setting: str, key_setting: str) -> tuple[bytes, bytes]:
    """A certificate (chain) and its private key, checked to belong together."""
    from cryptography.hazmat.primitives import serialization

    cert, certs = _certificates(cert_setting, cert_path)
    key = read_file(key_setting, key_path)
    try:
        private = serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{key_setting}: {key_path} holds no unencrypted PEM private key ({exc})") from None
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    if private.public_key().public_bytes(serialization.Encoding.DER, public) != \
            certs[0].public_key().public_bytes(serialization.Encoding.DER, public):
        raise ValueError(f"{key_setting}: {key_path} is not the key of the certificate in {cert_setting} ({cert_path})")
    return cert, key
