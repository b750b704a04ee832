"""The papers' data augmentation, with stateless (seeded) randomness.

Every random choice is a function of ``(seed, position in the stream)``, so
a run that resumes from a checkpoint and skips the batches it already
consumed sees exactly the augmentations of an uninterrupted run.
"""

import tensorflow as tf

from keras_identity.data.facts import AUGMENTATIONS  # noqa: F401  (re-exported)


def cifar_batch(images, seed, pad=4, start=0, total=None):
    """He et al. (2015), Sec. 4.2, on a batch: "4 pixels are padded on each
    side, and a 32x32 crop is randomly sampled from the padded image or its
    horizontal flip".  ``images`` are normalised (so zero padding is the
    mean), ``seed`` an int64 pair.

    The random crop offsets and flips are drawn for a global batch of
    ``total`` examples (default: this batch) and ``images`` receive entries
    ``start, start+1, ...``: a replica's slice of a global batch is augmented
    exactly as in a single-device run.
    """
    shape = tf.shape(images)
    batch, height, width = shape[0], shape[1], shape[2]
    total = batch if total is None else total
    padded = tf.pad(images, [[0, 0], [pad, pad], [pad, pad], [0, 0]])
    offsets = tf.random.stateless_uniform([total, 2], seed, minval=0, maxval=2 * pad + 1,
                                          dtype=tf.int32)[start:start + batch]
    rows = offsets[:, :1] + tf.range(height)[None, :]
    cols = offsets[:, 1:] + tf.range(width)[None, :]
    crops = tf.gather(padded, rows, axis=1, batch_dims=1)
    crops = tf.gather(crops, cols, axis=2, batch_dims=1)
    flip = tf.random.stateless_uniform([total], seed + 1)[start:start + batch] < 0.5
    return tf.where(flip[:, None, None, None], tf.reverse(crops, axis=[2]), crops)


def _resize_shorter_side(image, size):
    shape = tf.cast(tf.shape(image)[:2], tf.float32)
    scale = tf.cast(size, tf.float32) / tf.reduce_min(shape)
    new = tf.cast(tf.round(shape * scale), tf.int32)
    return tf.image.resize(image, new, method="bilinear", antialias=True)


def imagenet_train(image, seed, crop=224, scale=(256, 480)):
    """Scale augmentation of He et al. (2015), Sec. 3.4: shorter side resized
    to s in [256, 480], a random 224x224 crop, a random horizontal flip.
    Returns float32 in [0, 255]."""
    size = tf.random.stateless_uniform([], seed, minval=scale[0], maxval=scale[1] + 1,
                                       dtype=tf.int32)
    image = _resize_shorter_side(tf.cast(image, tf.float32), size)
    channels = tf.shape(image)[-1]
    image = tf.image.stateless_random_crop(image, tf.stack([crop, crop, channels]), seed + 1)
    return tf.image.stateless_random_flip_left_right(image, seed + 2)


def center_crop(image, resize=256, crop=224):
    """Evaluation crop: shorter side to ``resize``, the central ``crop`` square
    (224 from 256 as in He et al. 2015; 320 from 320 for Table 5)."""
    image = _resize_shorter_side(tf.cast(image, tf.float32), resize)
    shape = tf.shape(image)
    top = (shape[0] - crop) // 2
    left = (shape[1] - crop) // 2
    return image[top:top + crop, left:left + crop, :]
