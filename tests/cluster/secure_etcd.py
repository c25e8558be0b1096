"""An etcd as a cluster should run it: TLS on its client port with client certificates required, and
authentication on (a root user, and a user for lavinpy allowed only under the cluster's prefix).

``SecureEtcd`` is a harness ``Etcd``: the test's own reads (``call``, ``get``, ``etcdctl``) go over TLS
as root, so a ``Cluster`` of nodes runs on it unchanged; the nodes get their side of it from
``node_settings()`` (a YAML file passed with ``--config``).
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from tests.e2e.tls_certs import CA
from tests.helpers import wait_until

from .certs import node_certificate
from .harness import PREFIX, Etcd, etcd_binary

ROOT_PASSWORD = "root-secret-1"
USER = "lavinpy"
PASSWORD = "lavinpy-secret-2"


class SecureEtcd(Etcd):
    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.ca = CA(directory / "pki", "etcd test CA")
        self.cert, self.key = node_certificate(self.ca, "etcd")
        # No Common Name: etcd's gateway refuses a client certificate that has one (it would not be the
        # user: through the gateway etcd sees its own certificate), and lavinpy talks to the gateway.
        self.client_cert, self.client_key = node_certificate(self.ca, "client", common_name=False)
        self._context = ssl.create_default_context(cafile=str(self.ca.cert_path))
        self._context.load_cert_chain(str(self.client_cert), str(self.client_key))
        self._token = ""
        self.auth_enabled = False

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        client = f"https://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        with open(self.directory / "etcd.log", "ab") as log:
            self.process = subprocess.Popen(
                [etcd_binary() or "etcd", "--name", "n", "--data-dir", str(self.directory / "data"),
                 "--listen-client-urls", client, "--advertise-client-urls", client,
                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", f"n={peer}", "--cert-file", str(self.cert), "--key-file", str(self.key),
                 "--trusted-ca-file", str(self.ca.cert_path), "--client-cert-auth"],
                stdout=log, stderr=subprocess.STDOUT)
        wait_until(self._healthy, 15, 0.1, "etcd to answer")

    def enable_auth(self) -> None:
        """A root user, a lavinpy user with read-write on the cluster's prefix only, and auth on."""
        self.etcdctl("user", "add", f"root:{ROOT_PASSWORD}")
        self.etcdctl("user", "add", f"{USER}:{PASSWORD}")
        self.etcdctl("role", "add", USER)
        self.etcdctl("role", "grant-permission", USER, "--prefix=true", "readwrite", f"{PREFIX}/")
        self.etcdctl("user", "grant-role", USER, USER)
        self.etcdctl("auth", "enable")
        self.auth_enabled = True

    def node_settings(self, path: Path, password: str = PASSWORD, **more: str) -> Path:
        """A settings file for a node of this etcd (JSON is YAML)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "clustering_etcd_user": USER, "clustering_etcd_password": password,
            "clustering_etcd_tls_ca": str(self.ca.cert_path), "clustering_etcd_tls_cert": str(self.client_cert),
            "clustering_etcd_tls_key": str(self.client_key), **more}))
        return path

    def call(self, path: str, body: dict) -> dict:
        try:
            return self._post(path, body)
        except urllib.error.HTTPError as e:
            if not self.auth_enabled or e.code != 401:
                raise
        self._token = ""  # expired or revoked: log in again
        return self._post(path, body)

    def _post(self, path: str, body: dict) -> dict:
        headers = {"Content-Type": "application/json"}
        if self.auth_enabled and path != "auth/authenticate":
            if not self._token:
                self._token = self._post("auth/authenticate", {"name": "root", "password": ROOT_PASSWORD})["token"]
            headers["Authorization"] = self._token
        request = urllib.request.Request(f"https://{self.endpoint}/v3/{path}", data=json.dumps(body).encode(),
                                         headers=headers)
        with urllib.request.urlopen(request, timeout=2, context=self._context) as response:
            return json.loads(response.read().decode().splitlines()[0] or "{}")

    def etcdctl(self, *args: str, stdin: str | None = None) -> str:
        env = {**os.environ, "ETCDCTL_API": "3"}
        command = ["etcdctl", "--endpoints", f"https://{self.endpoint}", "--cacert", str(self.ca.cert_path),
                   "--cert", str(self.client_cert), "--key", str(self.client_key)]
        if self.auth_enabled:
            command += ["--user", f"root:{ROOT_PASSWORD}"]
        return subprocess.run([*command, *args], env=env, check=True, capture_output=True, text=True, timeout=10,
                              input=stdin).stdout
