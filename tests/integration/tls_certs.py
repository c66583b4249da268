"""Throwaway TLS material for the security tests: a CA and certificates it signs, as PEM files.

Why the ``openssl`` command: it is on every machine these tests run on, while the
``cryptography`` package is not a dependency. Keys are RSA 2048, unencrypted PKCS#8 (what
Kafka's PEM keystore, librdkafka, redis-server and Python's ``ssl`` all read); every
certificate is valid for ``127.0.0.1`` and ``localhost`` so that host-name verification stays
on everywhere.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Pem:
    """A certificate and its key."""

    cert: Path
    key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(folder: Path) -> Pem:
    """A self-signed CA in ``folder`` (``ca.pem``, ``ca.key``)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make test certificates")
    folder.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-subj", "/CN=lbctl-test-ca", "-keyout", "ca.key", "-out", "ca.pem",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=folder,
    )  # fmt: skip
    return Pem(folder / "ca.pem", folder / "ca.key")


def issue(ca: Pem, name: str, common_name: str | None = None) -> Pem:
    """A certificate for ``common_name`` (default ``name``) signed by ``ca``, for servers and
    clients alike (both extended key usages), valid for 127.0.0.1 and localhost."""
    folder = ca.cert.parent
    ext = folder / f"{name}.ext"
    ext.write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "extendedKeyUsage=serverAuth,clientAuth\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n",
        encoding="ascii",
    )
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={common_name or name}",
        "-keyout", f"{name}.key", "-out", f"{name}.csr",
        cwd=folder,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", str(ca.cert), "-CAkey", str(ca.key),
        "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", f"{name}.pem",
        cwd=folder,
    )  # fmt: skip
    return Pem(folder / f"{name}.pem", folder / f"{name}.key")
