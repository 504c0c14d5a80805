"""The credentials a stack on one machine (``rpc.stack``: ``tandem serve``, ``tandem demo``, the tests) makes for
itself: a throwaway CA, a server certificate for its verifiers and drafters, a client certificate for its gateway,
and, where the gateway listens beyond this machine without a keys file, one API key.

They live in a private temporary directory (0700, keys 0600) that exists while the stack runs and is removed when
it stops; a local process that does not hold them cannot call the verifiers or drafters. The CA signs nothing
else and is never written down: its key lives in this process only while the files are made.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rpc.certs import LOCAL_HOSTS, CertFiles, CertificateAuthority, write_identities, write_private

# how long the throwaway certificates last: a stack restarted within that makes new ones anyway
DAYS = 30.0


@dataclass(frozen=True)
class LocalCredentials:
    directory: Path
    ca_file: Path
    files: dict[str, CertFiles]        # "verifier" (server and client), "drafter" (server), "gateway" (client)
    api_key: str | None = None
    api_keys_file: Path | None = None

    @classmethod
    def make(cls, api_key: bool = False) -> LocalCredentials:
        directory = Path(tempfile.mkdtemp(prefix="tandem-credentials-"))  # 0700
        try:
            ca = CertificateAuthority("tandem serve throwaway CA", days=DAYS)
            # the verifier's is a client certificate too: with --direct-draft it calls its drafter
            ca_file, files = write_identities(directory, {"verifier": (LOCAL_HOSTS, True, True),
                                                          "drafter": (LOCAL_HOSTS, True, False),
                                                          "gateway": ((), False, True)}, ca)
            key = keys_file = None
            if api_key:
                key = secrets.token_urlsafe(24)
                keys_file = write_private(directory / "api-keys", f"{key}\n".encode())
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        return cls(directory, ca_file, files, key, keys_file)

    def flags(self, service: str) -> dict[str, str]:
        """The tls_* settings of a service of the stack: its own certificate (the gateway's is its client one)."""
        own = self.files["gateway" if service == "gateway" else service.split("-")[0]]
        return {"tls_cert_file": str(own.cert_file), "tls_key_file": str(own.key_file),
                "tls_ca_file": str(self.ca_file)}

    def identity(self):
        """The stack's own calls to its verifiers and drafters present the gateway's client certificate."""
        from rpc.tls import Identity

        own = self.files["gateway"]
        return Identity(own.cert_file.read_bytes(), own.key_file.read_bytes(), self.ca_file.read_bytes())

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
