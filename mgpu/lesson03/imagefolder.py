"""An ImageNet-like folder of real JPEG files, built locally from a course dataset.

Notebook 03 studies input pipelines, and a pipeline's costs are file reads and JPEG decoding: feeding
28x28 arrays from memory would hide them. :func:`build_image_folder` turns a course dataset (the
generated one offline, Fashion-MNIST or CIFAR-10 when cached) into

- ``train/<label>_<class name>/<index>.jpg``: colour JPEGs with ``short_side`` pixels on the short
  side and a random aspect ratio up to 4:3, as ImageNet's files are usually stored after resizing;
- ``tfrecord/train-<i>-of-<n>.tfrecord``: the same encoded bytes in ``n`` TFRecord shards;
- ``manifest.json``: the file list, the labels and the source dataset's fingerprint.

The folder is made once (seconds to a minute) and cached; it is built under a temporary name and
renamed into place, so a killed build never leaves a folder that looks complete.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from mgpu.runtime import data


@dataclass(frozen=True)
class ImageFolder:
    root: Path
    files: tuple[str, ...]       # relative to root
    labels: tuple[int, ...]
    tfrecords: tuple[str, ...]   # relative to root
    class_names: tuple[str, ...]
    short_side: int
    source_fingerprint: str
    total_bytes: int

    def paths(self) -> list[str]:
        return [str(self.root / f) for f in self.files]

    def tfrecord_paths(self) -> list[str]:
        return [str(self.root / f) for f in self.tfrecords]

    @property
    def mean_kib(self) -> float:
        return self.total_bytes / len(self.files) / 1024


def _render(image: np.ndarray, short_side: int, rng: np.random.Generator) -> Image.Image:
    """Upscale one small image to a colour picture with photo-like detail (so JPEG has work)."""
    grey = image if image.ndim == 2 else image.mean(axis=2)
    aspect = rng.uniform(1.0, 4 / 3)
    size = (round(short_side * aspect), short_side) if rng.random() < 0.5 else (short_side, round(short_side * aspect))
    base = np.asarray(Image.fromarray(grey.astype(np.uint8)).resize(size, Image.BICUBIC), dtype=np.float32)
    if image.ndim == 3:
        colour = np.asarray(Image.fromarray(image.astype(np.uint8)).resize(size, Image.BICUBIC), dtype=np.float32)
    else:
        tint = rng.uniform(0.55, 1.0, size=3)
        background = rng.uniform(0, 60, size=3)
        colour = background + base[..., None] / 255.0 * (255.0 * tint - background)
    # Fine-grained texture: a low-amplitude random field at a few scales, like sensor noise and
    # surface detail in photographs (JPEG files of flat upscaled shapes would be unrealistically small).
    h, w = base.shape
    detail = sum(np.asarray(Image.fromarray(rng.normal(0, 1, (max(2, h // s), max(2, w // s))).astype(np.float32))
                            .resize((w, h), Image.BILINEAR)) * (6.0 / s ** 0.5) for s in (1, 4, 16))
    picture = np.clip(colour + detail[..., None], 0, 255).astype(np.uint8)
    return Image.fromarray(picture, "RGB")


def _tf_example(encoded: bytes, label: int):
    import tensorflow as tf

    return tf.train.Example(features=tf.train.Features(feature={
        "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[encoded])),
        "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    })).SerializeToString()


def _folder_name(dataset, n_images: int, short_side: int, shards: int, seed: int) -> str:
    digest = dataset.fingerprint.split(":")[-1]
    return f"imagefolder-{dataset.name}-{digest}-n{n_images}-s{short_side}-t{shards}-seed{seed}"


def _load(root: Path) -> ImageFolder | None:
    try:
        manifest = json.loads((root / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    if not all((root / f).exists() for f in manifest["files"] + manifest["tfrecords"]):
        return None
    return ImageFolder(root=root, files=tuple(manifest["files"]), labels=tuple(manifest["labels"]),
                       tfrecords=tuple(manifest["tfrecords"]), class_names=tuple(manifest["class_names"]),
                       short_side=manifest["short_side"], source_fingerprint=manifest["source_fingerprint"],
                       total_bytes=manifest["total_bytes"])


def build_image_folder(dataset, n_images: int = 2000, short_side: int = 256, shards: int = 8,
                       seed: int = 0, quality: int = 90, verbose: bool = True) -> ImageFolder:
    """The cached JPEG folder for ``dataset`` (made now if missing): ``n_images``, class-balanced."""
    import tensorflow as tf

    if n_images < dataset.num_classes:
        raise ValueError(f"n_images must be at least the number of classes ({dataset.num_classes})")
    root = data.cache_dir() / _folder_name(dataset, n_images, short_side, shards, seed)
    existing = _load(root)
    if existing is not None:
        if verbose:
            print(f"Image folder: {root} (cached, {len(existing.files)} JPEGs, {existing.mean_kib:.0f} KiB each)")
        return existing
    rng = np.random.default_rng(seed)
    per_class = [rng.permutation(np.flatnonzero(dataset.y_train == c)) for c in range(dataset.num_classes)]
    chosen = [per_class[i % dataset.num_classes][i // dataset.num_classes] for i in range(n_images)]
    chosen = [int(i) for i in rng.permutation(chosen)]

    staging = root.with_name(f"{root.name}.building-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    started = time.monotonic()
    files, labels, total = [], [], 0
    writers = []
    try:
        (staging / "tfrecord").mkdir(parents=True)
        tfrecords = [f"tfrecord/train-{i:05d}-of-{shards:05d}.tfrecord" for i in range(shards)]
        writers = [tf.io.TFRecordWriter(str(staging / name)) for name in tfrecords]
        for n, index in enumerate(chosen):  # one line when done (a progress bar sticks at 0% in a saved notebook)
            label = int(dataset.y_train[index])
            folder = f"train/{label}_{dataset.class_names[label].replace('/', '-').replace(' ', '_')}"
            buffer = io.BytesIO()
            _render(dataset.x_train[index], short_side, rng).save(buffer, format="JPEG", quality=quality)
            encoded = buffer.getvalue()
            (staging / folder).mkdir(parents=True, exist_ok=True)
            (staging / folder / f"{n:06d}.jpg").write_bytes(encoded)
            writers[n % shards].write(_tf_example(encoded, label))
            files.append(f"{folder}/{n:06d}.jpg")
            labels.append(label)
            total += len(encoded)
        for writer in writers:
            writer.close()
        manifest = {"files": files, "labels": labels, "tfrecords": tfrecords,
                    "class_names": list(dataset.class_names), "short_side": short_side,
                    "source_fingerprint": dataset.fingerprint, "total_bytes": total}
        (staging / "manifest.json").write_text(json.dumps(manifest))
        try:
            os.replace(staging, root)
        except OSError:
            if _load(root) is None:  # another process finished first: keep theirs
                raise
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        for writer in writers:
            writer.close()
        shutil.rmtree(staging, ignore_errors=True)
        raise
    folder = _load(root)
    if verbose:
        print(f"Image folder: built {root} in {time.monotonic() - started:.0f} s "
              f"({len(files)} JPEGs, {folder.mean_kib:.0f} KiB each, {shards} TFRecord shards)")
    return folder
