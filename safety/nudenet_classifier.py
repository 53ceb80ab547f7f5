"""NudeNet's detector as an image classifier for the gate: ``nudenet`` or ``nudenet:<file.onnx>``.

The `nudenet` wheel (PyPI, 3.4.2) ships its detector, ``320n.onnx`` (an Ultralytics YOLOv8n
exported to ONNX), so it runs offline with onnxruntime. It is optional: not in requirements.txt.

    pip install onnxruntime && pip install --no-deps nudenet   # --no-deps: skip opencv, unused here

Licence: the wheel's metadata says MIT, but the LICENSE file it bundles is the GNU AGPL-3.0, and
the ONNX file's own metadata says "AGPL-3.0 License (https://ultralytics.com/license)". Treat it as
AGPL-3.0 (network use counts as distribution) until its authors say otherwise; that is why it is
kept out of the default install (docs/safety_policy.md, "Output-image gate").

Only the ONNX file is used: pre- and post-processing are done here with numpy and PIL, so the
wheel's opencv dependency is not needed (``import nudenet`` would import cv2; this module never
imports the package, it only finds its folder). Faithful to the wheel's ``NudeDetector.detect``
except where noted:
  * pad to a square with black at the right/bottom, resize to 320x320 (bilinear), RGB in [0, 1];
    the wheel feeds BGR when given a file path and RGB when given an RGB array; the network was
    trained by Ultralytics on RGB, so RGB it gets;
  * each of the 2100 anchor rows is classified by its highest class score (as the wheel does);
    a label's score is the highest confidence of any row classified as that label, 0.0 if none.
    The wheel's class-agnostic non-maximum suppression is not applied: it can hide an "exposed"
    box under an overlapping "covered" one, and a gate should not lose that.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
from pathlib import Path

import numpy as np
from PIL import Image

INPUT_SIZE = 320


def bundled_model() -> Path:
    """The 320n.onnx inside the installed nudenet package, found without importing it."""
    spec = importlib.util.find_spec("nudenet")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the nudenet package is not installed "
                                "(pip install onnxruntime && pip install --no-deps nudenet)")
    path = Path(list(spec.submodule_search_locations)[0]) / "320n.onnx"
    if not path.exists():
        raise FileNotFoundError(f"the nudenet package has no bundled detector at {path}")
    return path


def preprocess(image: Image.Image, size: int = INPUT_SIZE) -> np.ndarray:
    """(3, size, size) float32 RGB in [0, 1]: padded to a square with black at the right and bottom."""
    rgb = image.convert("RGB")
    side = max(rgb.size)
    canvas = Image.new("RGB", (side, side), (0, 0, 0))
    canvas.paste(rgb, (0, 0))
    canvas = canvas.resize((size, size), Image.Resampling.BILINEAR)
    return np.asarray(canvas, dtype=np.float32).transpose(2, 0, 1) / 255.0


class NudeNetClassifier:
    def __init__(self, model_path: Path, threads: int = 1, batch: int = 8):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = max(1, threads)
        options.inter_op_num_threads = 1
        self.session = onnxruntime.InferenceSession(str(model_path), sess_options=options,
                                                    providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name
        meta = self.session.get_modelmeta().custom_metadata_map
        names = ast.literal_eval(meta["names"])  # "{0: 'FEMALE_GENITALIA_COVERED', ...}" written by Ultralytics
        self.labels = tuple(names[i] for i in sorted(names))
        self.batch = batch
        try:
            wheel = importlib.metadata.version("nudenet")
        except importlib.metadata.PackageNotFoundError:
            wheel = "unknown"
        self.version = f"nudenet-{wheel}:{Path(model_path).stem}"
        self.policy_keys = (self.version, "nudenet")
        self.licence = meta.get("license", "")

    @classmethod
    def from_spec(cls, arg: str, threads: int = 1) -> NudeNetClassifier:
        return cls(Path(arg) if arg else bundled_model(), threads=threads)

    def scores(self, images: list[Image.Image]) -> list[dict[str, float]]:
        out: list[dict[str, float]] = []
        for start in range(0, len(images), self.batch):
            chunk = images[start:start + self.batch]
            blob = np.stack([preprocess(im) for im in chunk])
            (raw,) = self.session.run(None, {self.input_name: blob})  # (n, 4 + labels, anchors)
            if raw.shape[:2] != (len(chunk), 4 + len(self.labels)):
                raise ValueError(f"the NudeNet detector returned shape {raw.shape}, expected "
                                 f"({len(chunk)}, {4 + len(self.labels)}, anchors)")
            for rows in raw[:, 4:, :].transpose(0, 2, 1):  # (anchors, labels)
                best = rows.argmax(1)
                conf = rows.max(1)
                per_label = np.zeros(len(self.labels), np.float64)
                np.maximum.at(per_label, best, conf)
                out.append({label: float(per_label[i]) for i, label in enumerate(self.labels)})
        return out
