"""Small image-folder trees of constant PNGs, for the loaders' tests."""

import io
import os

import numpy as np
from PIL import Image


def png(value, size=(6, 6), channels=3):
    image = np.full(size + (channels,), value, np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(image[..., 0] if channels == 1 else image).save(buffer, format="PNG")
    return buffer.getvalue()


def write_tree(root, classes=("cat", "dog"), per_class=3, test_name="test"):
    for split in ("train", test_name):
        for c, name in enumerate(classes):
            folder = os.path.join(root, split, name)
            os.makedirs(folder, exist_ok=True)
            for i in range(per_class):
                with open(os.path.join(folder, f"{i:04d}.png"), "wb") as f:
                    f.write(png(10 * c + i))
