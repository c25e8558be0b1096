"""Debian's OpenLDAP server (slapd) for the ldap backend's tests: its own configuration file, database
and free port, entries loaded with ldapadd (ldap-utils), stopped with the test module."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import free_port

from .conftest import port_open

SUFFIX = "dc=example,dc=com"
ADMIN = f"cn=admin,{SUFFIX}"
ADMIN_PASSWORD = "admin-secret"
SLAPD = shutil.which("slapd") or "/usr/sbin/slapd"


def have_slapd() -> bool:
    return Path(SLAPD).exists() and shutil.which("ldapadd") is not None


class Slapd:
    def __init__(self, workdir: Path, tls: tuple[Path, Path] | None = None) -> None:
        """``tls``: (certificate, key) for StartTLS on the same port."""
        if not have_slapd():
            pytest.skip("Debian's slapd and ldap-utils are not installed (.ci/run installs them)")
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "db").mkdir()
        self.port = free_port()
        self.url = f"ldap://127.0.0.1:{self.port}/"
        conf = self.dir / "slapd.conf"
        schemas = "".join(f"include /etc/ldap/schema/{name}.schema\n"
                          for name in ("core", "cosine", "nis", "inetorgperson"))
        conf.write_text(f"{schemas}pidfile {self.dir}/slapd.pid\nmodulepath /usr/lib/ldap\nmoduleload back_mdb\n"
                        f"database mdb\nmaxsize 10485760\nsuffix \"{SUFFIX}\"\nrootdn \"{ADMIN}\"\n"
                        f"rootpw {ADMIN_PASSWORD}\ndirectory {self.dir / 'db'}\n"
                        + (f"TLSCertificateFile {tls[0]}\nTLSCertificateKeyFile {tls[1]}\n" if tls else "")
                        + "access to attrs=userPassword by anonymous auth by self read by * none\n"
                        "access to * by * read\n")
        self.log = open(self.dir / "slapd.log", "wb")  # noqa: SIM115 (closed in stop)
        # -d: stay in the foreground (the test owns the process); 0: no debug output.
        self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            [SLAPD, "-f", str(conf), "-h", self.url, "-d", "0"], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 15
        while not port_open("127.0.0.1", self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"slapd did not start: {(self.dir / 'slapd.log').read_text()}")
            time.sleep(0.05)

    def add(self, ldif: str) -> None:
        subprocess.run(["ldapadd", "-x", "-H", self.url, "-D", ADMIN, "-w", ADMIN_PASSWORD], input=ldif.encode(),
                       check=True, capture_output=True, timeout=30)

    def pause(self) -> None:
        """The directory stops answering (SIGSTOP): connections to it time out."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            proc.send_signal(signal.SIGCONT)
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.log.close()
