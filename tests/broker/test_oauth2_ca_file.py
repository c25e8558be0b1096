"""The identity provider's CA file (https_cacertfile) is read in the event loop before each key fetch: one
that is missing, a FIFO or not a certificate makes the fetch fail with a reason naming the setting (a token
login is then refused), never an unhandled error or a loop waiting on a FIFO."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from lavinpy.broker.access.oauth2_keys import KeyFetchError, ProviderKeys
from lavinpy.broker.access.oauth2_settings import ProviderSettings


def _refresh(cafile: str) -> None:
    keys = ProviderKeys(ProviderSettings(name="p", issuer="", jwks_url="https://127.0.0.1:1/jwks",
                                         discovery_endpoint_path="", https_cacertfile=cafile, algorithms=("RS256",)))
    asyncio.run(asyncio.wait_for(keys.refresh(), 10))


@pytest.mark.parametrize("kind", ["fifo", "missing", "not a certificate"])
def test_a_bad_ca_file_fails_the_fetch_naming_the_setting(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "ca.pem"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "not a certificate":
        path.write_text("not a certificate\n")
    with pytest.raises(KeyFetchError, match=f"https_cacertfile {path}: "):
        _refresh(str(path))
