"""Content credentials (C2PA) in every image file, with c2pa-python (the reference implementation).

`sign` embeds a manifest in a PNG, JPEG or WebP file as it is handed off (on the encoder
threads, never the denoising one): a `c2pa.created` action whose digitalSourceType is IPTC's
trainedAlgorithmicMedia and whose softwareAgent is the model version, and an assertion of its
own (PARAMETERS_LABEL) with the request's parameters, the model version and the job id. The
claim is signed with the deployment's key and certificate chain (imagegen/signing_credentials.py).
The manifest hashes the file's bytes (a hard binding), so a change to its pixels no longer
verifies.

`verify` reads the manifest back with c2pa's Reader and checks it: signature, hard binding and
certificate chain, trusting the roots of IMAGEGEN_C2PA_TRUST_ANCHORS (the embedded default's own
root). `scripts/imagegen_cli.py verify FILE` prints what it found.
"""

from __future__ import annotations

import hashlib
import io
import json
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

PARAMETERS_LABEL = "invalid.imagegen.parameters"  # a reverse-domain label under a name never resolved
TRAINED_ALGORITHMIC_MEDIA = "http://cv.iptc.org/newscodes/digitalsourcetype/trainedAlgorithmicMedia"
UNTRUSTED = "signingCredential.untrusted"
MIME_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp", "mp4": "video/mp4"}
_NAMESPACE = uuid.UUID("0f6b7a52-7b1e-4f43-9d7e-5d1c1a6f2c31")

_local = threading.local()  # one c2pa Signer per encoder thread (a Signer is not shared across threads)


@dataclass(frozen=True)
class Verification:
    state: str  # c2pa's validation state: Trusted, Valid or Invalid; "none" without a manifest
    ok: bool  # a manifest whose signature and hard binding check out (its signer may be unknown)
    trusted: bool  # ... and whose certificate chain ends at a trusted root
    manifest: dict[str, Any] = field(default_factory=dict)  # the active manifest, as c2pa reads it
    failures: list[dict] = field(default_factory=list)  # c2pa's failure codes and explanations

    def assertion(self, label: str) -> Any:
        for item in self.manifest.get("assertions", []):
            if item.get("label") == label:
                return item.get("data")
        return None

    @property
    def parameters(self) -> dict | None:
        return self.assertion(PARAMETERS_LABEL)

    @property
    def actions(self) -> list[dict]:
        data = self.assertion("c2pa.actions.v2") or self.assertion("c2pa.actions") or {}
        return list(data.get("actions", []))


def manifest(parameters, output_format: str) -> dict:
    """The manifest definition for one image file (`parameters`: jobs.media.encoding.ImageParameters)."""
    fields = parameters.as_dict()
    instance = uuid.uuid5(_NAMESPACE, f"{fields['jobId']}/{fields['seed']}/{output_format}")
    return {
        "claim_generator_info": [{"name": "imagegen", "version": "1"}],
        "title": f"{fields['jobId']}-{fields['seed']}.{output_format}",
        "format": MIME_TYPES[output_format],
        "instance_id": f"xmp:iid:{instance}",
        "assertions": [
            {"label": "c2pa.actions", "data": {"actions": [{
                "action": "c2pa.created",
                "digitalSourceType": TRAINED_ALGORITHMIC_MEDIA,
                "softwareAgent": {"name": parameters.model_version},
                "parameters": {"jobId": parameters.job_id, "modelVersion": parameters.model_version},
            }]}},
            {"label": PARAMETERS_LABEL, "data": {
                "prompt": parameters.prompt, "negativePrompt": parameters.negative_prompt, "seed": parameters.seed,
                "steps": parameters.steps, "guidanceScale": parameters.guidance_scale, "width": parameters.width,
                "height": parameters.height, "modelVersion": parameters.model_version, "jobId": parameters.job_id,
                "levers": parameters.scheduler,
                # The user's own prompt, where the prompt rewriter changed what was drawn.
                **({"originalPrompt": parameters.original_prompt, "rewriter": parameters.rewriter}
                   if parameters.original_prompt else {}),
            }},
        ],
    }


def _context():
    import c2pa

    ctx = getattr(_local, "context", None)
    if ctx is None:
        # No thumbnail: the file is the picture, and a thumbnail would cost more than the signature.
        ctx = _local.context = c2pa.Context.from_dict({"builder": {"thumbnail": {"enabled": False}}})
    return ctx


def _signer():
    import c2pa

    from imagegen import signing_credentials

    wanted = (settings.IMAGEGEN_C2PA_KEY, settings.IMAGEGEN_C2PA_CERT, settings.IMAGEGEN_C2PA_TSA_URL)
    cached = getattr(_local, "signer", None)
    if cached is not None and cached[0] == wanted:
        return cached[1]
    key, chain, tsa = wanted
    info = c2pa.C2paSignerInfo(signing_credentials.algorithm(key).encode(), Path(chain).read_bytes(),
                               Path(key).read_bytes(), tsa or None)
    signer = c2pa.Signer.from_info(info)
    _local.signer = (wanted, signer)
    return signer


def sign(data: bytes, output_format: str, parameters) -> bytes:
    """The file with its content credentials embedded."""
    import c2pa

    builder = c2pa.Builder(manifest(parameters, output_format), context=_context())
    out = io.BytesIO()
    builder.sign(_signer(), MIME_TYPES[output_format], io.BytesIO(data), out)
    return out.getvalue()


def credentialed(encoded, output_format: str, parameters):
    """(the encoded file with its credentials, the sha256 of the file without them)."""
    from dataclasses import replace

    return replace(encoded, data=sign(encoded.data, output_format, parameters)), content_digest(encoded.data)


def content_digest(unsigned: bytes) -> str:
    """The sha256 of a file before its credentials were added: what a regeneration reproduces
    (the manifest's salts and signature differ from one signing to the next)."""
    return hashlib.sha256(unsigned).hexdigest()


def _trust_anchors(extra: str | None) -> str:
    pems = []
    configured = settings.IMAGEGEN_C2PA_TRUST_ANCHORS if settings.configured else ""  # the CLI runs without Django
    for path in (configured, extra):
        if path and Path(path).is_file():
            pems.append(Path(path).read_text())
    return "".join(pems)


def verify(data: bytes, trust_anchors: str | None = None) -> Verification:
    """Read the file's manifest with c2pa's Reader and check it (signature, hard binding,
    certificate chain against the configured roots and `trust_anchors`, a PEM file)."""
    import c2pa

    anchors = _trust_anchors(trust_anchors)
    config: dict = {"verify": {"verify_trust": bool(anchors)}}
    if anchors:
        config["trust"] = {"trust_anchors": anchors}
    try:
        reader = c2pa.Reader(None, io.BytesIO(data), context=c2pa.Context.from_dict(config))
    except c2pa.C2paError as exc:
        return Verification("none", False, False, failures=[{"code": type(exc).__name__, "explanation": str(exc)}])
    with reader:
        store = json.loads(reader.json())
        state = reader.get_validation_state() or "Invalid"
        results = reader.get_validation_results() or {}
    active = store.get("manifests", {}).get(store.get("active_manifest", ""), {})
    failures = list((results.get("activeManifest") or {}).get("failure", []))
    # An untrusted signer is c2pa's only failure that leaves the signature and the binding intact.
    ok = state in ("Valid", "Trusted") and all(f.get("code") == UNTRUSTED for f in failures)
    return Verification(state, ok, ok and state == "Trusted", active, failures)
