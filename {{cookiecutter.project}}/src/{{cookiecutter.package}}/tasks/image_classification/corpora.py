"""Image classification's real data: the public corpora `make real-data CORPUS=...` writes in this task's raw
format: the task's `corpora()` (core/task.py's Corpus says what each field holds; ../../real_data.py fetches them)."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
from PIL import Image

from ...core.task import Corpus


def digits(content: bytes, output: Path) -> int:
    """scikit-learn's digits.csv.gz: 1,797 rows of 8x8 pixels (0-16) and the digit, as RAW/<digit>/<n>.png."""
    rows = [line for line in gzip.decompress(content).decode().splitlines() if line.strip()]
    for index, line in enumerate(rows):
        values = [int(float(value)) for value in line.split(",")]
        pixels = (np.array(values[:64], np.float32).reshape(8, 8) * (255 / 16)).round().astype(np.uint8)
        folder = output / str(values[64])
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels, mode="L").convert("RGB").save(folder / f"{index:04d}.png")
    return len(rows)


CORPORA = {
    "digits": Corpus(
        "scikit-learn",
        "sklearn/datasets/data/digits.csv.gz",
        "1,797 handwritten digits, 8x8 pixels, 10 classes (UCI's optical recognition set, in scikit-learn)",
        digits,
    ),
}
