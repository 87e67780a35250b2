"""Writes a small, learnable image folder: RAW/<label>/<name>.(png|jpg), no download.

Four classes of drawn shapes on noisy backgrounds, in random sizes, positions and colours, saved in
varied sizes and modes (grayscale, RGB, RGBA) and formats, like a real scraped folder. It also
writes two broken files and a README, so that `make preprocess` shows how bad inputs are rejected
and other files ignored.

    make data        # python -m {{ cookiecutter.package }}.sample_data --output data/raw
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

CLASSES = ("circle", "square", "triangle", "cross")


def draw_example(label: str, rng: np.random.Generator) -> Image.Image:
    """One image of class `label`, at a random size between 28 and 96 pixels."""
    size = int(rng.integers(28, 97))
    background = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8) // 3
    image = Image.fromarray(background)
    draw = ImageDraw.Draw(image)
    colour = tuple(int(c) for c in rng.integers(140, 256, size=3))
    extent = rng.uniform(0.45, 0.8) * size
    cx, cy = rng.uniform(extent / 2, size - extent / 2, size=2)
    left, top, right, bottom = cx - extent / 2, cy - extent / 2, cx + extent / 2, cy + extent / 2
    if label == "circle":
        draw.ellipse((left, top, right, bottom), fill=colour)
    elif label == "square":
        draw.rectangle((left, top, right, bottom), fill=colour)
    elif label == "triangle":
        draw.polygon([(cx, top), (right, bottom), (left, bottom)], fill=colour)
    else:
        bar = extent / 4
        draw.rectangle((cx - bar / 2, top, cx + bar / 2, bottom), fill=colour)
        draw.rectangle((left, cy - bar / 2, right, cy + bar / 2), fill=colour)
    return image


def write_dataset(output: Path, images_per_class: int, seed: int = 0, broken: bool = True) -> int:
    """Writes the folder; returns the number of valid images."""
    rng = np.random.default_rng(seed)
    count = 0
    for label in CLASSES:
        folder = output / label
        folder.mkdir(parents=True, exist_ok=True)
        for index in range(images_per_class):
            image = draw_example(label, rng)
            mode = ("RGB", "L", "RGBA")[index % 3]
            image = image.convert(mode)
            if mode == "RGB" and index % 2:
                image.save(folder / f"{label}_{index:05d}.jpg", quality=90)
            else:
                image.save(folder / f"{label}_{index:05d}.png")
            count += 1
        print(f"  {label}: {images_per_class} images", flush=True)
    if broken:
        (output / CLASSES[0] / "empty.png").write_bytes(b"")
        (output / CLASSES[1] / "not_an_image.jpg").write_text("this is text, not a JPEG\n")
        (output / "README.txt").write_text(
            "Sample data: one folder per class. Files without an image "
            "extension, like this one, are ignored by preprocessing.\n"
        )
    return count
