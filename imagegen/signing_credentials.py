"""The key and certificate chain that sign every image file's content credentials (C2PA,
jobs/media/credentials.py), checked when the process starts.

- The embedded default generates them once per installation in the var folder (`c2pa/`, the key
  mode 0600, like the secret key): an EC P-256 signing key with its certificate, issued by a
  self-signed root made at the same time (its key is thrown away: it has signed the one
  certificate it was made for). The root is what `imagegen_cli.py verify` trusts by default.
- Production names its own (IMAGEGEN_C2PA_KEY, IMAGEGEN_C2PA_CERT: PEM files, the certificate
  file the chain from the signing certificate up). A missing, unreadable, expired or not yet
  valid certificate, or a key that is not the certificate's, refuses to start, with the reason.

Only `cryptography` here: settings import this module, and c2pa is loaded by the processes that
sign.
"""

from __future__ import annotations

import datetime
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

FOLDER = "c2pa"
KEY_FILE, CHAIN_FILE, ROOT_FILE = "signing_key.pem", "signing_chain.pem", "root.pem"
EMBEDDED_VALID_DAYS = 3650


class CredentialsError(ValueError):
    """The configured signing credentials cannot be used (the message says why)."""


@dataclass(frozen=True)
class SigningCredentials:
    key: Path
    chain: Path
    trust_anchors: Path | None  # the embedded default's own root; None for production's


def embedded(var_dir: Path) -> SigningCredentials:
    """The installation's credentials in var_dir/c2pa, made first if missing (or expired). Every
    process that starts at once gets the same ones: they are written to a folder aside that is
    renamed into place, which fails when another process got there first."""
    folder = Path(var_dir) / FOLDER
    creds = SigningCredentials(folder / KEY_FILE, folder / CHAIN_FILE, folder / ROOT_FILE)
    for _ in range(20):
        if creds.key.exists() and creds.chain.exists():
            try:
                check(creds.key, creds.chain)
                return creds
            except CredentialsError:
                if _expired(creds.chain):  # ten years on: a new root and key, as on first start
                    shutil.rmtree(folder, ignore_errors=True)
                    continue
                raise
        folder.parent.mkdir(parents=True, exist_ok=True)
        draft = folder.parent / f".{FOLDER}.{os.getpid()}.{secrets.token_hex(4)}"
        draft.mkdir(mode=0o700)
        try:
            _write_embedded(draft)
            os.rename(draft, folder)
        except OSError:
            if not folder.exists():
                raise
        finally:
            shutil.rmtree(draft, ignore_errors=True)
    raise CredentialsError(f"could not read or create the signing credentials in {folder}")


# The process types that sign images, besides the workers whose stage rows load "signing_key"
# (imagegen/stage_table.py): the web processes make a cache hit's own file (its own credentials)
# when they answer it at once; a cross-user hit's is made by its lane's GPU worker (the reveal row).
SIGNING_PROCESSES = ("web",)


def require() -> None:
    """For a process that signs images (a web process, a GPU worker): the configured key and chain
    must be there and valid, else CredentialsError naming what is missing or wrong. The others
    start without them (settings check a key and chain only where they are named)."""
    from django.conf import settings

    check(settings.IMAGEGEN_C2PA_KEY, settings.IMAGEGEN_C2PA_CERT)


def check(key_path: Path | str, chain_path: Path | str, now: datetime.datetime | None = None) -> None:
    """Raise CredentialsError naming what is wrong with the key and certificate chain."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    now = now or datetime.datetime.now(datetime.UTC)
    for what, path in (("IMAGEGEN_C2PA_KEY", key_path), ("IMAGEGEN_C2PA_CERT", chain_path)):
        if not str(path):
            raise CredentialsError(f"{what} must name a PEM file (content credentials sign every image)")
        if not Path(path).is_file():
            raise CredentialsError(f"{what}: {path} does not exist")
    try:
        chain = x509.load_pem_x509_certificates(Path(chain_path).read_bytes())
    except ValueError as exc:
        raise CredentialsError(f"IMAGEGEN_C2PA_CERT: {chain_path} holds no PEM certificate ({exc})") from None
    try:
        key = serialization.load_pem_private_key(Path(key_path).read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise CredentialsError(f"IMAGEGEN_C2PA_KEY: {key_path} holds no unencrypted PEM private key ({exc})") from None
    for cert in chain:
        subject = cert.subject.rfc4514_string()
        if cert.not_valid_after_utc <= now:
            raise CredentialsError(f"IMAGEGEN_C2PA_CERT: the certificate {subject!r} expired on "
                                   f"{cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
        if cert.not_valid_before_utc > now:
            raise CredentialsError(f"IMAGEGEN_C2PA_CERT: the certificate {subject!r} is not valid before "
                                   f"{cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC")
    if _public(key.public_key()) != _public(chain[0].public_key()):
        raise CredentialsError("IMAGEGEN_C2PA_KEY is not the key of the first certificate in IMAGEGEN_C2PA_CERT")
    if chain[0].subject == chain[0].issuer:
        raise CredentialsError("IMAGEGEN_C2PA_CERT: C2PA refuses a self-signed signing certificate; "
                               "give the chain from a certificate issued by a CA")


def algorithm(key_path: Path | str) -> str:
    """The C2PA signing algorithm for the key: es256/es384/es512 by curve, ps256 for RSA, ed25519."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    key = serialization.load_pem_private_key(Path(key_path).read_bytes(), password=None)
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return {"secp256r1": "es256", "secp384r1": "es384", "secp521r1": "es512"}[key.curve.name]
    if isinstance(key, rsa.RSAPrivateKey):
        return "ps256"
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return "ed25519"
    raise CredentialsError(f"IMAGEGEN_C2PA_KEY: a {type(key).__name__} cannot sign C2PA manifests")


def _public(public_key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _expired(chain_path: Path) -> bool:
    from cryptography import x509

    try:
        chain = x509.load_pem_x509_certificates(chain_path.read_bytes())
    except ValueError:
        return False
    return any(cert.not_valid_after_utc <= datetime.datetime.now(datetime.UTC) for cert in chain)


def issue_chain(folder: Path, valid_days: int = EMBEDDED_VALID_DAYS, organization: str = "imagegen (embedded)",
                not_before: datetime.datetime | None = None) -> SigningCredentials:
    """A root and a signing certificate it issued, in the profile C2PA validators accept (leaf:
    digitalSignature, emailProtection, not a CA; root: keyCertSign). Also what tests use to
    make production-like credentials."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    start = not_before or datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    end = start + datetime.timedelta(days=valid_days)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common),
                          x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization)])

    def usage(**on: bool) -> x509.KeyUsage:
        fields = ("digital_signature", "content_commitment", "key_encipherment", "data_encipherment", "key_agreement",
                  "key_cert_sign", "crl_sign", "encipher_only", "decipher_only")
        return x509.KeyUsage(**{f: on.get(f, False) for f in fields})

    root_key = ec.generate_private_key(ec.SECP256R1())
    root_name = name("imagegen content credentials root")
    root = (x509.CertificateBuilder().subject_name(root_name).issuer_name(root_name).public_key(root_key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(usage(key_cert_sign=True, crl_sign=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(root_key.public_key()), critical=False)
            .sign(root_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (x509.CertificateBuilder().subject_name(name("imagegen image signer")).issuer_name(root_name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(usage(digital_signature=True), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.EMAIL_PROTECTION]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(root_key.public_key()), critical=False)
            .sign(root_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    creds = SigningCredentials(folder / KEY_FILE, folder / CHAIN_FILE, folder / ROOT_FILE)
    fd = os.open(creds.key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    creds.chain.write_bytes(leaf.public_bytes(pem) + root.public_bytes(pem))
    assert creds.trust_anchors is not None
    creds.trust_anchors.write_bytes(root.public_bytes(pem))
    return creds


def _write_embedded(folder: Path) -> None:
    issue_chain(folder)
