"""The gateway's API keys (rpc/auth.py): the keys file's format and what each mistake in it names, what a call's
metadata must hold, and where a gateway may serve without keys. (The interceptor itself runs in the real gateway:
tests/e2e/test_security.py.)"""

from __future__ import annotations

import os
import re

import pytest

from gateway.settings import GatewaySettings
from rpc.auth import ApiKeys, check_open
from rpc.settings import load

A, B = "a" * 16 + "-first-key", "b" * 24


@pytest.fixture(autouse=True)
def _no_tandem_env(monkeypatch):
    for key in [k for k in os.environ if k.startswith("TANDEM_")]:
        monkeypatch.delenv(key)


def test_a_keys_file_with_comments_and_limits():
    keys = ApiKeys.parse(f"# who may call\n\n{A}\n  {B}   3  # team b\n")
    assert len(keys) == 2
    assert keys.find([("authorization", f"Bearer {A}")])[1].limit is None
    found = keys.find([("x-other", "1"), ("authorization", f"bearer  {B} ")])[1]
    assert (found.line, found.limit) == (4, 3)


@pytest.mark.parametrize("text, message", [
    ("", "holds no key"), ("# nothing\n", "holds no key"),
    ("short\n", "line 1: a key must have at least 16 characters, this one has 5"),
    (f"{A} 0\n", "line 1: the limit must be a whole number >= 1, got '0'"),
    (f"{A} many\n", "line 1: the limit must be a whole number >= 1, got 'many'"),
    (f"{A} 2 3\n", "line 1: expected KEY [LIMIT], got 3 fields"),
    (f"{A}\n{B}\n{A} 4\n", "line 3: the key of line 1 again")])
def test_a_bad_keys_file_names_the_line(text, message):
    with pytest.raises(ValueError, match="^" + re.escape(f"api_keys_file: {message}")):
        ApiKeys.parse(text)


@pytest.mark.parametrize("metadata, message", [
    ([], "authorization: missing; send the metadata 'authorization: Bearer <API key>'"),
    ([("authorization", f"Basic {A}")], "authorization: expected 'Bearer <API key>'"),
    ([("authorization", "Bearer ")], "authorization: expected 'Bearer <API key>'"),
    ([("authorization", "Bearer " + "c" * 20)], "authorization: the API key is not valid"),
    ([("authorization", f"Bearer {A}"), ("authorization", f"Bearer {A}")], "authorization: sent more than once")])
def test_a_call_without_a_valid_key_is_told_why(metadata, message):
    with pytest.raises(PermissionError) as err:
        ApiKeys.parse(f"{A}\n").find(metadata)
    assert str(err.value) == message and A not in str(err.value)


def test_keys_file_from_disk(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"{A} 2\n")
    assert len(check_open(load(GatewaySettings, api_keys_file=str(path), host="0.0.0.0"))) == 1
    with pytest.raises(ValueError, match=rf"^api_keys_file: cannot read {tmp_path}/missing"):
        check_open(load(GatewaySettings, api_keys_file=str(tmp_path / "missing")))


def test_a_gateway_without_keys_serves_this_machine_alone_unless_told_otherwise():
    assert check_open(load(GatewaySettings, host="127.0.0.1")) is None
    with pytest.raises(ValueError, match=r"^api_keys_file: not set, and the gateway would listen on 0.0.0.0, beyond "
                                         r"this machine: clients must authenticate.*or set api_open"):
        check_open(load(GatewaySettings))  # the default host: every interface
    assert check_open(load(GatewaySettings, api_open=True)) is None  # the services keep their mutual TLS
    assert check_open(load(GatewaySettings, insecure=True)) is None  # plaintext and open everywhere
