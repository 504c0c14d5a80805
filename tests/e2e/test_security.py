"""Authenticated, encrypted traffic with real processes on loopback (issue 22): the verifier and the drafter take
only callers holding a client certificate their CA signed; a gateway with API keys and client-facing TLS refuses
calls without a valid key (UNAUTHENTICATED, saying what is wrong) and past a key's limit (RESOURCE_EXHAUSTED), while
health stays open; a service given no TLS files, and not told insecure, refuses to start and names the settings.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos.tandem.v1 import gateway_pb2_grpc
from rpc.certs import LOCAL_HOSTS, CertificateAuthority
from rpc.gateway_client import GatewayAccess
from rpc.ports import free_block
from tests.e2e.conftest import chat_request, gateway_command, generate, run
from tests.e2e.test_faults import _wait_for

LIMITED, FREE = "limited-key-" + "1" * 20, "free-key-" + "2" * 20


def _health(channel: grpc.Channel) -> int:
    return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status


@pytest.mark.parametrize("service", ["verifier", "drafter"])
def test_a_service_refuses_callers_without_a_client_certificate_its_ca_signed(split_stack, tmp_path, service):
    """Plaintext, TLS without a client certificate, a certificate of another CA, and the stack's own drafter
    certificate (same CA, but a server's: a drafter cannot call the verifier) are refused; the stack's client
    certificate gets health and reflection on the same port."""
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    address = f"localhost:{split_stack.cfg.ports[service]}"
    ca = split_stack.credentials.ca_file.read_bytes()
    stranger = CertificateAuthority("a stranger's CA", days=1).issue("gateway", server=False, client=True)
    peer = split_stack.credentials.files["drafter"]
    attempts = {
        "plaintext": grpc.insecure_channel(address),
        "no client certificate": grpc.secure_channel(address, grpc.ssl_channel_credentials(ca)),
        "another CA's certificate": grpc.secure_channel(address, grpc.ssl_channel_credentials(
            ca, stranger.key, stranger.cert)),
        "a server's certificate": grpc.secure_channel(address, grpc.ssl_channel_credentials(
            ca, peer.key_file.read_bytes(), peer.cert_file.read_bytes())),
    }
    for what, channel in attempts.items():
        with channel, pytest.raises(grpc.RpcError) as err:
            _health(channel)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE, what
    with split_stack.blocking_channel(service) as ch:
        assert _health(ch) == health_pb2.HealthCheckResponse.SERVING
        assert f"tandem.v1.{service.capitalize()}" in set(ProtoReflectionDescriptorDatabase(ch).get_services())


@pytest.fixture(scope="module")
def keyed_gateway(split_stack, tmp_path_factory):
    """A gateway on the split stack's verifier and drafter with API keys (one limited to 1 call in flight) and
    client-facing TLS (a certificate for localhost from a CA of the test's)."""
    directory = tmp_path_factory.mktemp("keyed")
    ca = CertificateAuthority("client-facing CA", days=1)
    issued = ca.issue("gateway", LOCAL_HOSTS)
    (directory / "ca.crt").write_bytes(ca.cert)
    (directory / "api.crt").write_bytes(issued.cert)
    (directory / "api.key").write_bytes(issued.key)
    (directory / "keys").write_text(f"# test keys\n{LIMITED} 1\n{FREE}\n")
    port = free_block(1)
    proc = subprocess.Popen(gateway_command(split_stack, port, "--api-keys-file", str(directory / "keys"),
                                            "--api-tls-cert-file", str(directory / "api.crt"),
                                            "--api-tls-key-file", str(directory / "api.key")),
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
    tls = GatewayAccess(f"localhost:{port}", ca_file=str(directory / "ca.crt"))

    def serving() -> bool:
        with tls.blocking_channel() as ch:  # health needs no key
            try:
                return _health(ch) == health_pb2.HealthCheckResponse.SERVING
            except grpc.RpcError:
                return False
    try:
        _wait_for(serving, timeout=300, what="the keyed gateway")
        yield tls
    finally:
        proc.terminate()
        proc.wait(30)


def _with(tls: GatewayAccess, key: str | None) -> GatewayAccess:
    return GatewayAccess(tls.address, key, ca_file=tls.ca_file)


@pytest.mark.parametrize("metadata, details", [
    ((), "authorization: missing; send the metadata 'authorization: Bearer <API key>'"),
    ((("authorization", "Bearer not-a-key-of-this-gateway"),), "authorization: the API key is not valid"),
    ((("authorization", f"Basic {FREE}"),), "authorization: expected 'Bearer <API key>'")])
def test_a_call_without_a_valid_key_is_unauthenticated(keyed_gateway, metadata, details):
    async def call():
        async with keyed_gateway.channel() as ch:
            async for _ in gateway_pb2_grpc.GatewayStub(ch).Generate(chat_request("Hello", 4), timeout=30,
                                                                     metadata=metadata):
                pass

    with pytest.raises(grpc.aio.AioRpcError) as err:
        run(call())
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED and err.value.details() == details


def test_health_is_open_reflection_and_plaintext_are_not(keyed_gateway):
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    with keyed_gateway.blocking_channel() as ch:
        assert _health(ch) == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as err:
            ProtoReflectionDescriptorDatabase(ch).get_services()
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with grpc.insecure_channel(keyed_gateway.address) as ch, pytest.raises(grpc.RpcError) as err:
        _health(ch)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE  # the client-facing port speaks TLS only


def test_a_valid_key_is_served_within_its_limit(keyed_gateway):
    """The limited key's second call while its first streams is RESOURCE_EXHAUSTED; another key is served
    meanwhile; once the first ends, the limited key is served again."""
    limited, free = _with(keyed_gateway, LIMITED), _with(keyed_gateway, FREE)

    async def scenario():
        first_token = asyncio.Event()

        async def long_stream():
            async with limited.channel() as ch:
                async for _ in gateway_pb2_grpc.GatewayStub(ch).Generate(
                        chat_request("Count to fifty.", 48, ignore_eos=True), timeout=300, metadata=limited.metadata):
                    first_token.set()

        first = asyncio.create_task(long_stream())
        await first_token.wait()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await generate(limited, chat_request("Hello", 4))
        other = await generate(free, chat_request("Hello", 4, ignore_eos=True))
        await first
        again = await generate(limited, chat_request("Hello", 4, ignore_eos=True))
        return err.value, other, again

    err, other, again = run(scenario())
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.details() == "api key (line 2 of the keys file): its limit of 1 concurrent call is reached"
    assert len(other[0]) == 4 and len(again[0]) == 4


@pytest.mark.parametrize("service, port_flag", [("verifier", "--verifier-port"), ("drafter", "--drafter-port"),
                                                ("gateway", "--gateway-port")])
def test_a_service_without_tls_files_refuses_to_start_naming_them(service, port_flag):
    """No TLS files and no insecure: the service stops at once (before any model loads), exit code 2, naming the
    three settings and the way out; nothing listens on its port."""
    port = free_block(1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "cli.main", service, port_flag, str(port)], capture_output=True,
                          text=True, env=env, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert (f"tandem {service}: error: tls_cert_file, tls_key_file, tls_ca_file: not set. Internal gRPC traffic is "
            "mutual TLS") in proc.stderr
    assert "or set insecure" in proc.stderr and "Traceback" not in proc.stderr
    assert time.monotonic() - t0 < 30
