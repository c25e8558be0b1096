"""Encrypted private keys: every TLS context of lavinpy takes the key's passphrase from a setting (a URI's
``password`` key, ``tls_key_password``) and never asks a terminal for one; a URI's unknown query keys are
refused by name; statuses show a URI without its secrets."""

from __future__ import annotations

import os
import pty
import select
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lavinpy.cluster.tls import ClusterTLSError, etcd_context, node_contexts, replication_server_context
from lavinpy.config import Config
from lavinpy.spark.options import OptionError, ReadOptions
from lavinpy.tls import TLSConfigError, build_context
from lavinpy.wire.client_blocking import AMQPParams
from lavinpy.wire.tls_keys import KeyPasswordError, load_cert_chain
from lavinpy.wire.uri import QUERY_KEYS, parse_url, shown_uri
from tests.e2e.tls_certs import CA, encrypted

REPO_ROOT = Path(__file__).resolve().parents[2]
PASSPHRASE = "s3cret pass"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[CA, Path, Path, Path]:
    ca = CA(tmp_path_factory.mktemp("pki"))
    cert, key, _ = ca.issue("server", server=True)
    return ca, cert, key, encrypted(key, PASSPHRASE)


def test_an_encrypted_key_loads_with_its_passphrase_and_fails_clearly_without(pki) -> None:
    _ca, cert, plain, enc = pki
    load_cert_chain(ssl.create_default_context(), str(cert), str(enc), PASSPHRASE, "setting x")
    load_cert_chain(ssl.create_default_context(), str(cert), str(plain), None, "setting x")  # none asked for
    with pytest.raises(KeyPasswordError, match=f"the key file {enc} is encrypted: give its passphrase \\(setting x\\)"):
        load_cert_chain(ssl.create_default_context(), str(cert), str(enc), None, "setting x")
    with pytest.raises(KeyPasswordError, match=r"the passphrase \(setting x\) does not decrypt the key file"):
        load_cert_chain(ssl.create_default_context(), str(cert), str(enc), "wrong", "setting x")
    with pytest.raises(KeyPasswordError, match=f"the key file {enc} is encrypted: give its passphrase \\(setting x\\)"):
        load_cert_chain(ssl.create_default_context(), str(cert), str(enc), "", "setting x")  # an empty setting


def test_no_terminal_is_ever_asked_for_a_passphrase(pki) -> None:
    """With a controlling terminal, OpenSSL's own prompt would wait there for ever (a broker started from a
    shell, reloading its certificate): each context builder must answer at once."""
    _ca, cert, _plain, enc = pki
    script = (
        "import ssl\n"
        "from lavinpy.config import Config\nfrom lavinpy.tls import build_context\n"
        "from lavinpy.wire.uri import parse_url\nfrom lavinpy.cluster.tls import etcd_context\n"
        f"cert, key = {str(cert)!r}, {str(enc)!r}\n"
        "for name, make in (('uri', lambda: parse_url(f'amqps://h/?certfile={cert}&keyfile={key}').tls.context()),\n"
        "                   ('server', lambda: build_context(Config(tls_cert=cert, tls_key=key))),\n"
        "                   ('etcd', lambda: etcd_context('', cert, key))):\n"
        "    try:\n        make()\n        print(name, 'LOADED', flush=True)\n"
        "    except Exception as e:\n        print(name, 'REFUSED', type(e).__name__, flush=True)\n"
        "print('DONE', flush=True)\n")
    pid, fd = pty.fork()
    if pid == 0:  # the child: its controlling terminal is the pty
        os.environ["PYTHONPATH"] = str(REPO_ROOT)
        os.execv(sys.executable, [sys.executable, "-c", script])
    out = b""
    deadline = time.monotonic() + 30
    try:
        while b"DONE" not in out and time.monotonic() < deadline:
            if select.select([fd], [], [], 0.5)[0]:
                try:
                    out += os.read(fd, 4096)
                except OSError:
                    break
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(fd)
    text = out.decode(errors="replace")
    assert "pass phrase" not in text.lower(), text
    assert "DONE" in text, f"a context builder waited on the terminal:\n{text}"
    for name, error in (("uri", "KeyPasswordError"), ("server", "TLSConfigError"), ("etcd", "ClusterTLSError")):
        assert f"{name} REFUSED {error}" in text, text


def test_a_uris_password_key_decrypts_its_keyfile(pki) -> None:
    ca, _cert, _plain, enc = pki
    client_cert, client_key, _ = ca.issue("client", server=False)
    client_enc = encrypted(client_key, "k3y")
    base = f"amqps://h/?cacertfile={ca.cert_path}&certfile={client_cert}&keyfile={client_enc}"
    assert parse_url(f"{base}&password=k3y").tls.context() is not None
    assert "k3y" not in repr(parse_url(f"{base}&password=k3y").tls)  # not in a traceback's locals or a log
    with pytest.raises(KeyPasswordError, match="give its passphrase \\(the URI's password key\\)"):
        parse_url(base).tls.context()
    with pytest.raises(KeyPasswordError, match="does not decrypt"):
        parse_url(f"{base}&password=nope").tls.context()
    assert "password" in QUERY_KEYS and enc.exists()


def test_the_servers_key_takes_tls_key_password(pki) -> None:
    _ca, cert, _plain, enc = pki
    build_context(Config(tls_cert=str(cert), tls_key=str(enc), tls_key_password=PASSPHRASE))
    with pytest.raises(TLSConfigError, match="tls_key_password"):
        build_context(Config(tls_cert=str(cert), tls_key=str(enc)))
    replication_server_context(str(cert), str(enc), "", PASSPHRASE)
    with pytest.raises(ClusterTLSError, match="tls_key_password"):
        replication_server_context(str(cert), str(enc), "", "")
    etcd_context("", str(cert), str(enc), PASSPHRASE)
    with pytest.raises(ClusterTLSError, match="clustering_etcd_tls_key_password"):
        etcd_context("", str(cert), str(enc))
    etcd, _ = node_contexts(Config(clustering_etcd_tls_cert=str(cert), clustering_etcd_tls_key=str(enc),
                                   clustering_etcd_tls_key_password=PASSPHRASE))
    assert etcd is not None
    with pytest.raises(ClusterTLSError, match=r"etcd TLS: .* give its passphrase \(clustering_etcd_tls_key_password\)"):
        node_contexts(Config(clustering_etcd_tls_cert=str(cert), clustering_etcd_tls_key=str(enc)))


@pytest.mark.parametrize("setting", ["tls_key_password", "clustering_etcd_tls_key_password"])
def test_a_key_password_comes_from_the_environment(tmp_path: Path, setting: str) -> None:
    res = subprocess.run([sys.executable, "-c", f"from lavinpy.config import load; print(load(None).{setting})"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(REPO_ROOT), f"LAVINPY_{setting.upper()}": "from-env"})
    assert res.stdout.strip() == "from-env", res.stderr


@pytest.mark.parametrize("url", ["amqp://h/?heartbaet=5", "amqps://h/?cacertfile=/c&sni=h", "amqp://h/?connection_attempts=3"])
def test_an_unknown_query_key_is_refused_by_name(url: str) -> None:
    key = url.rsplit("&", 1)[-1].split("?")[-1].split("=")[0]
    with pytest.raises(ValueError, match=f"unknown URI query key\\(s\\) '{key}'; should be one of: 'cacertfile'"):
        parse_url(url)
    with pytest.raises(ValueError, match=f"'{key}'"):
        AMQPParams.from_url(url)
    with pytest.raises(OptionError, match=f"option url: unknown URI query key\\(s\\) '{key}'"):
        ReadOptions.parse({"url": url, "queue": "q"})


def test_a_uri_is_shown_without_its_secrets() -> None:
    uri = "amqps://u:pw@h:5671/v?cacertfile=/c&password=key-pass&heartbeat=5"
    assert shown_uri(uri) == "amqps://u:***@h:5671/v?cacertfile=/c&password=***&heartbeat=5"
    assert shown_uri(uri, None) == "amqps://u@h:5671/v?cacertfile=/c&heartbeat=5"
    assert shown_uri("amqp://h/") == "amqp://h/" and shown_uri("amqp://:pw@[::1]:1/", None) == "amqp://[::1]:1/"


def test_a_fifo_or_a_device_named_as_a_tls_file_is_refused_at_once(pki, tmp_path: Path) -> None:
    """OpenSSL would read a FIFO without a writer for ever: every context builder refuses one (and a device)
    before reading. Run in a child, so that a builder that waits fails the test instead of stalling it."""
    _ca, cert, plain, _enc = pki
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    script = (
        "from lavinpy.config import Config\nfrom lavinpy.tls import build_context\n"
        "from lavinpy.wire.uri import parse_url\nfrom lavinpy.cluster.tls import etcd_context\n"
        f"cert, key, fifo = {str(cert)!r}, {str(plain)!r}, {str(fifo)!r}\n"
        "cases = {'uri cacertfile': lambda: parse_url(f'amqps://h/?cacertfile={fifo}').tls.context(),\n"
        "         'uri keyfile': lambda: parse_url(f'amqps://h/?certfile={cert}&keyfile=/dev/stdin').tls.context(),\n"
        "         'tls_ca_cert': lambda: build_context(Config(tls_cert=cert, tls_key=key, tls_ca_cert=fifo)),\n"
        "         'tls_cert': lambda: build_context(Config(tls_cert=fifo, tls_key=key)),\n"
        "         'etcd ca': lambda: etcd_context(fifo, '', '')}\n"
        "for name, make in cases.items():\n"
        "    try:\n        make()\n        print(name, 'LOADED', flush=True)\n"
        "    except Exception as e:\n        print(name, 'REFUSED', ' '.join(str(e).split()), flush=True)\n")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    lines = res.stdout.splitlines()
    assert len(lines) == 5, (res.stdout, res.stderr)
    for line in lines:
        assert "REFUSED" in line and "is not a regular file" in line, line
