"""What a stack on one machine (rpc/stack.py: tandem serve, demo, the tests) hands its processes: the verifiers and
drafters on 127.0.0.1 with mutual TLS from credentials it makes in a private directory, the gateway with its client
certificate, an API key of its own where the gateway listens beyond loopback, plaintext only when asked; and the
credentials gone when it stops. (The processes themselves: tests/e2e/test_security.py.)"""

from __future__ import annotations

import stat

from rpc.stack import Stack, StackConfig


def _flags(argv: list[str]) -> dict[str, str | bool]:
    out, i = {}, 0
    while i < len(argv):
        if argv[i].startswith("--"):
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out[argv[i][2:]] = argv[i + 1]
                i += 2
                continue
            out[argv[i][2:]] = True
        i += 1
    return out


def test_services_get_mutual_tls_on_loopback_and_the_credentials_go_with_the_stack():
    stack = Stack(StackConfig(port=40000, verifiers=2))
    cmds = {name: _flags(argv) for name, argv in stack.commands().items()}
    creds = stack.credentials
    try:
        assert stat.S_IMODE(creds.directory.stat().st_mode) == 0o700
        for name in ("verifier", "verifier-1", "drafter"):
            f = cmds[name]
            assert f["host"] == "127.0.0.1" and "insecure" not in f
            assert f["tls-cert-file"] == str(creds.files[name.split("-")[0]].cert_file)
            assert f["tls-ca-file"] == str(creds.ca_file)
            assert stat.S_IMODE(creds.files[name.split("-")[0]].key_file.stat().st_mode) == 0o600
        gateway = cmds["gateway"]
        assert gateway["host"] == "127.0.0.1" and gateway["tls-cert-file"] == str(creds.files["gateway"].cert_file)
        assert "api-keys-file" not in gateway and stack.api_key is None and stack.gateway.metadata == ()
    finally:
        stack.stop()
    assert not creds.directory.exists()


def test_a_gateway_beyond_loopback_gets_a_key_of_its_own():
    stack = Stack(StackConfig(port=40000, host="0.0.0.0"))
    try:
        gateway = _flags(stack.commands()["gateway"])
        assert gateway["host"] == "0.0.0.0"
        key = stack.api_key
        assert key and len(key) >= 16 and open(gateway["api-keys-file"]).read().split() == [key]
        assert stack.gateway.metadata == (("authorization", f"Bearer {key}"),)
    finally:
        stack.stop()


def test_a_keys_file_given_is_used_and_insecure_makes_nothing(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# ours\n" + "k" * 20 + " 2\n" + "j" * 20 + "\n")
    stack = Stack(StackConfig(port=40000, host="0.0.0.0", api_keys_file=str(keys)))
    try:
        assert _flags(stack.commands()["gateway"])["api-keys-file"] == str(keys) and stack.api_key is None
        assert stack.gateway.api_key == "k" * 20  # the stack's own calls use the file's first key
    finally:
        stack.stop()
    stack = Stack(StackConfig(port=40000, insecure=True))
    cmds = {name: _flags(argv) for name, argv in stack.commands().items()}
    assert stack.credentials is None
    assert all(f.get("insecure") is True and "tls-cert-file" not in f for f in cmds.values())
    assert cmds["verifier"]["host"] == "127.0.0.1"


def test_direct_draft_wires_each_verifier_to_a_drafter_and_the_drafter_device_goes_to_drafters_alone():
    """--direct-draft: verifier i calls drafter i mod drafters (its certificate is a client one too: mutual TLS both
    ways), the gateway runs no rounds of its own; --drafter-device reaches the drafters only."""
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    stack = Stack(StackConfig(port=40000, verifiers=3, drafters=2, direct_draft=True, device="cuda:0",
                              drafter_device="cuda:1"))
    try:
        cmds = {name: _flags(argv) for name, argv in stack.commands().items()}
        ports = stack.cfg.ports
        for i, name in enumerate(["verifier", "verifier-1", "verifier-2"]):
            drafter = ["drafter", "drafter-1"][i % 2]
            assert cmds[name]["direct-drafter-address"] == f"localhost:{ports[drafter]}"
            assert cmds[name]["draft"] == "none" and cmds[name]["device"] == "cuda:0"
        assert cmds["drafter"]["device"] == cmds["drafter-1"]["device"] == "cuda:1"
        assert cmds["gateway"]["colocated"] is True
        cert = x509.load_pem_x509_certificate(stack.credentials.files["verifier"].cert_file.read_bytes())
        usages = set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
        assert usages == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    finally:
        stack.stop()
    plain = Stack(StackConfig(port=40000, insecure=True))
    assert "direct-drafter-address" not in _flags(plain.commands()["verifier"])
