#!/usr/bin/python3
"""Builds tests/decks/lora/vision.h5 and vision_bad.h5: image-text token datasets for the lora
job on the tiny model (its media placeholder is id 3; with patch 4 and a 2x2 merge,
inputs/images/checker.png makes 4 image tokens, gradient.png 24, stripes.jpg 15).

A document is BOS, the placeholders of its images, then a caption of 6 tokens that depends on
which images it has (the loss counts the caption only). vision_bad.h5 has one document with a
placeholder short. Run: /usr/bin/python3 tests/decks/lora/make_vision_data.py
"""
import os
import random

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
IMAGES = {"checker.png": 4, "gradient.png": 24, "stripes.jpg": 15}
CAPTION = {"checker.png": [40, 41, 42], "gradient.png": [50, 51, 52], "stripes.jpg": [60, 61, 62]}


def write(path, n, seed, short=False):
    r = random.Random(seed)
    tokens, masks, offsets, images = [], [], [0], []
    for i in range(n):
        files = r.sample(sorted(IMAGES), r.choice([1, 2]))
        doc = [1]
        for f in files:
            doc += [3] * IMAGES[f]
        if short and i == n - 1:
            doc.pop()
        caption = [t for f in files for t in CAPTION[f]] + [2]
        tokens += doc + caption
        masks += [0] * len(doc) + [1] * len(caption)
        offsets.append(len(tokens))
        images.append(";".join("../../../inputs/images/" + f for f in files))
    with h5py.File(path, "w") as h:
        h["tokens"] = np.asarray(tokens, np.int32)
        h["offsets"] = np.asarray(offsets, np.int64)
        h["loss_mask"] = np.asarray(masks, np.uint8)
        h.create_dataset("images", data=images, dtype=h5py.string_dtype())


if __name__ == "__main__":
    write(os.path.join(HERE, "vision.h5"), 64, 1)
    write(os.path.join(HERE, "vision_bad.h5"), 4, 2, short=True)
