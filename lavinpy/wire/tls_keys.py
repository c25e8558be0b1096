"""A certificate and its private key loaded without ever asking a terminal for a passphrase, and TLS
files that are regular files.

OpenSSL asks the controlling terminal for the passphrase of an encrypted key when the program gives
none: a broker started from a shell would stop there (at start, on a reload, or on a link's connect),
and one without a terminal fails with "Invalid argument". Every TLS context of lavinpy loads its key
here instead: an encrypted key without its passphrase, or with a wrong one, is an error naming the
setting that gives it.

OpenSSL reads a FIFO or a device named as a certificate, key or CA file until it ends: a FIFO with no
writer, for ever, and the caller (the event loop, for a link's connect or a SIGHUP reload) with it.
Every such file is checked to be a regular file first (``regular_file``).
"""

from __future__ import annotations

import errno
import os
import ssl
import stat


class KeyPasswordError(ValueError):
    """An encrypted private key without its passphrase, or with a wrong one."""


def regular_file(path: str) -> str:
    """``path`` (followed through links) once it names a regular file; OSError naming it otherwise (a
    missing file: FileNotFoundError, as OpenSSL's own read would say)."""
    if path and not stat.S_ISREG(os.stat(path).st_mode):
        raise OSError(errno.EINVAL, f"{path} is not a regular file (a FIFO or a device is never read)")
    return path


def load_cert_chain(ctx: ssl.SSLContext, certfile: str, keyfile: str | None, password: str | None,
                    password_setting: str) -> None:
    """ctx.load_cert_chain(certfile, keyfile) with ``password`` for an encrypted key (None or empty: the
    key must not be encrypted). ``password_setting`` names where a passphrase is given, for the error
    texts."""
    asked = False

    def passphrase() -> bytes:  # OpenSSL calls this for an encrypted key only
        nonlocal asked
        asked = True
        if not password:
            raise KeyPasswordError(f"the key file {keyfile or certfile} is encrypted: give its passphrase "
                                   f"({password_setting})")
        return password.encode()

    try:
        ctx.load_cert_chain(regular_file(certfile), regular_file(keyfile or "") or None, password=passphrase)
    except ssl.SSLError:
        if asked:
            raise KeyPasswordError(f"the passphrase ({password_setting}) does not decrypt the key file "
                                   f"{keyfile or certfile}") from None
        raise
