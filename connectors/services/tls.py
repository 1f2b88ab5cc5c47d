"""A private CA and the server certificates of the embedded services' TLS (Kafka's SASL_SSL listener, Postgres'
``ssl=on``), made at start with the ``cryptography`` package, for 127.0.0.1 and localhost.

The CA's key stays in the service's directory, so that a certificate can be issued again by the same CA
under a running client (a rotation: clients that trust the CA go on), or one that has expired, or one for
another host name (what a client refuses). Keys are PKCS#8 PEM without a passphrase, mode 0600.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eos_core.errors import ServiceError

__all__ = ["Certificate", "CertificateAuthority"]

_VALID = datetime.timedelta(days=30)
_SKEW = datetime.timedelta(minutes=5)  # not before: a little in the past, for a clock that lags


def _crypto() -> Any:
    try:
        import cryptography  # noqa: F401
    except ImportError:
        raise ServiceError(
            "the embedded services' TLS needs the cryptography package: pip install 'spark-eos[embedded]' "
            "(or pip install cryptography), or run them without TLS (security='plaintext')"
        ) from None
    from cryptography import x509

    return x509


def _write(path: Path, data: bytes, *, secret: bool = False, owner: Any = None) -> None:
    path.write_bytes(data)
    os.chmod(path, 0o600 if secret else 0o644)
    if owner is not None:
        os.chown(path, owner.uid, owner.gid)


@dataclass(frozen=True)
class Certificate:
    """A server certificate issued by the CA: ``cert`` (PEM), ``key`` (its private key), ``chain`` (key,
    certificate and the CA's in one PEM file: Kafka's PEM key store), ``ca`` (the CA's certificate)."""

    cert: Path
    key: Path
    chain: Path
    ca: Path


class CertificateAuthority:
    """A CA of its own in ``directory`` (``ca.pem``, ``ca.key``): made once, then loaded."""

    def __init__(self, directory: str | Path, name: str = "spark-eos embedded services CA") -> None:
        x509 = _crypto()
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cert_path, self.key_path = self.dir / "ca.pem", self.dir / "ca.key"
        if self.cert_path.is_file() and self.key_path.is_file():
            self._key = serialization.load_pem_private_key(self.key_path.read_bytes(), None)
            self._cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())
            return
        now = datetime.datetime.now(datetime.timezone.utc)
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        usage = dict.fromkeys(
            ("content_commitment", "key_encipherment", "data_encipherment", "key_agreement", "encipher_only"), False
        )
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _SKEW)
            .not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, decipher_only=False, **usage),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        _write(self.key_path, self._key.private_bytes(*_pkcs8()), secret=True)
        _write(self.cert_path, self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self,
        directory: str | Path,
        stem: str = "server",
        *,
        hosts: Sequence[str] = ("localhost", "127.0.0.1"),
        valid: datetime.timedelta = _VALID,
        expired: bool = False,
        owner: Any = None,
    ) -> Certificate:
        """A server (and client) certificate for ``hosts`` (names and IP addresses) in ``directory``
        (``<stem>.pem``, ``<stem>.key``, ``<stem>-chain.pem``), replacing one of that stem; ``expired``: one
        whose validity ended an hour ago. ``owner``: who the files belong to (the server's unprivileged user)."""
        x509 = _crypto()
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        now = datetime.datetime.now(datetime.timezone.utc)
        start, end = (
            (now - valid - datetime.timedelta(hours=1), now - datetime.timedelta(hours=1))
            if expired
            else (
                now - _SKEW,
                now + valid,
            )
        )
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[Any] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        pem = serialization.Encoding.PEM
        key_pem = key.private_bytes(*_pkcs8())
        made = Certificate(out / f"{stem}.pem", out / f"{stem}.key", out / f"{stem}-chain.pem", self.cert_path)
        _write(made.key, key_pem, secret=True, owner=owner)
        _write(made.cert, cert.public_bytes(pem), owner=owner)
        _write(made.chain, key_pem + cert.public_bytes(pem) + self._cert.public_bytes(pem), secret=True, owner=owner)
        return made


def _pkcs8() -> tuple[Any, Any, Any]:
    from cryptography.hazmat.primitives import serialization

    return serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
