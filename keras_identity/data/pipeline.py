"""tf.data input pipelines for training and evaluation.

Training streams are defined on *global* batches: batch k of a run is the
same set of examples, with the same augmentations, whatever the number of
workers and replicas.  Under a ``tf.distribute`` strategy each input pipeline
(one per worker) keeps only its replicas' contiguous slices of every global
batch (see :func:`distribute`), so a two-worker run computes the gradients
of a single-device run.

Image files (ImageNet folders) are decoded as they are read: one that does
not decode, or whose header declares more pixels than are read
(``image_headers.MAX_IMAGE_PIXELS``), stops the stream with an error that
names it (see :func:`keras_identity.data.errors.as_data_error`).
"""

import re

import tensorflow as tf

from keras_identity.data import augment as augment_lib
from keras_identity.data import decoding
from keras_identity.data import errors
from keras_identity.data import image_headers
from keras_identity.data.augment import center_crop

AUTOTUNE = tf.data.AUTOTUNE


def _options():
    options = tf.data.Options()
    options.deterministic = True
    # Sharding is explicit (see ``distribute``); never let tf.data re-shard.
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.OFF)
    # No autotuning model thread.  With it, deleting an iterator that Keras's
    # ``fit``/``evaluate`` consumed (at the end of an evaluation or of ``fit``)
    # could block until the thread's next optimisation time, whose period
    # doubles while the iterator lives: stalls of 1-13 s measured on 2 cores.
    # ``AUTOTUNE`` then means one parallel call per core and a prefetch buffer
    # that grows on demand; throughput measured the same.
    options.autotune.enabled = False
    return options


def _seed(seed, position):
    return tf.stack([tf.cast(seed, tf.int64), tf.cast(position, tf.int64)])


def _message(text):
    """The message of an error raised inside tf.data for an image file, marked
    so that :func:`keras_identity.data.errors.as_data_error` finds it."""
    return tf.strings.join([errors.TF_MESSAGE_START, text, errors.TF_MESSAGE_END])


def _too_many_pixels(path, size):
    """The one-line refusal of the file ``path`` whose header declares
    ``size`` (``[height, width]``), as :mod:`~keras_identity.data.datasets` words it."""
    marks = {"\x00": path, "\x01": tf.strings.as_string(size[1]),
             "\x02": tf.strings.as_string(size[0])}
    template = image_headers.describe_too_many("\x00", "\x01", "\x02")
    return tf.strings.join([marks.get(piece, piece)
                            for piece in re.split("([\x00-\x02])", template) if piece])


def _gif_size(encoded):
    import numpy as np

    return np.array(image_headers.declared_size(encoded) or (-1, -1), np.int64)


def _decode_file(path):
    """``(image, refusal)`` of the image file ``path``: the decoded uint8
    image and ``""``; or, for a header that declares more than
    ``image_headers.MAX_IMAGE_PIXELS`` pixels, an empty image and why (it is
    never decoded).  A file that does not read or decode raises."""
    encoded = tf.io.read_file(path)
    size = tf.cond(
        tf.equal(tf.strings.substr(encoded, 0, 3), "GIF"),
        # A GIF decodes to its frames' extent, which only walking its blocks
        # finds (in Python: GIFs are rare in image folders; tf.data is never
        # exported, so a Python function is fine here).
        lambda: tf.reshape(tf.numpy_function(_gif_size, [encoded], tf.int64), [2]),
        lambda: image_headers.tf_declared_size(encoded))
    empty = tf.zeros([0, 0, 3], tf.uint8)
    # Another format (WebP, ...: TensorFlow would decode it unbounded) is refused.
    return tf.case([
        (size[0] < 0, lambda: (empty, tf.strings.join([path, decoding.NO_IMAGE_HEADER]))),
        (size[0] * size[1] > image_headers.MAX_IMAGE_PIXELS,
         lambda: (empty, _too_many_pixels(path, size)))],
        default=lambda: (tf.io.decode_image(encoded, channels=3, expand_animations=False),
                         tf.constant("")), exclusive=False)


def _decode_files(indices, paths, labels, count=None):
    """``(image, label)`` of the files ``paths[i]`` for the indices ``i`` of the dataset
    ``indices``, in order (``count``: the number of indices of a finite stream, ``None`` for
    an endless one).  A file that does not read or decode, or whose header declares too many
    pixels, stops the stream with an ``InvalidArgumentError`` naming it (its message one of
    a :class:`DataError`, see ``errors.as_data_error``).

    tf.data cannot catch the error of an op and name its input, so the files are decoded (in
    parallel) into a stream that drops the elements that fail (``ignore_errors``), each
    element carrying its position and the index before it: the element after a dropped one
    finds the gap and names the file (a finite stream ends with a sentinel for its last
    file).
    """
    if count is not None:
        indices = indices.concatenate(tf.data.Dataset.from_tensors(tf.constant(-1, tf.int64)))
    numbered = indices.enumerate().scan(
        tf.constant(-1, tf.int64),
        lambda previous, element: (element[1], (element[0], element[1], previous)))

    def decode(position, i, previous):
        image, refusal = tf.cond(
            i >= 0, lambda: _decode_file(tf.gather(paths, i)),
            lambda: (tf.zeros([0, 0, 3], tf.uint8), tf.constant("")))  # the sentinel
        return position, previous, image, tf.gather(labels, tf.maximum(i, 0)), refusal

    def check(expected, element):
        position, previous, image, label, refusal = element
        problem = tf.cond(position > expected, lambda: tf.strings.join([
            tf.gather(paths, tf.maximum(previous, 0)),
            " is not a readable image (it does not read or decode: truncated or corrupt?); ",
            decoding.EXPECTED_IMAGE, "."]), lambda: refusal)
        failed = tf.debugging.Assert(tf.equal(problem, ""), [_message(problem)])
        with tf.control_dependencies([failed]):
            return position + 1, (tf.identity(image), label)

    stream = numbered.map(decode, num_parallel_calls=AUTOTUNE).ignore_errors()
    stream = stream.scan(tf.constant(0, tf.int64), check)
    return stream if count is None else stream.take(count)


def _shard(input_context, batch_size):
    """(first example, examples, per-replica batch) of this input pipeline."""
    if input_context is None:
        return 0, batch_size, batch_size
    pipelines = input_context.num_input_pipelines
    replicas = input_context.num_replicas_in_sync
    if batch_size % replicas:
        raise ValueError(f"batch_size={batch_size} is not valid with {replicas} replicas; "
                         f"expected a multiple.")
    per_replica = batch_size // replicas
    local = per_replica * (replicas // pipelines)
    return input_context.input_pipeline_id * local, local, per_replica


def train_dataset(data, *, batch_size, normalization, augmentation="none", seed=0,
                  start_step=0, drop_remainder=True, input_context=None, raw_pixels=False):
    """An endless, shuffled, augmented stream of ``(images, labels)`` batches.

    Args:
        data: an :class:`ImageDataset`.
        batch_size: the global batch size.
        normalization: a :class:`Normalization`.
        augmentation: ``"none"``, ``"cifar"`` or ``"imagenet"``.
        seed: seed of the shuffling and augmentation.
        start_step: global batches already consumed (resuming a run): the stream starts
            where an uninterrupted run would be.
        drop_remainder: static batch shapes (TPU, XLA).
        input_context: a ``tf.distribute.InputContext``; the stream then holds this
            pipeline's per-replica batches.
        raw_pixels: yield pixel values in [0, 255] (float32) for a model that normalises its
            inputs itself (``include_preprocessing=True``).  The CIFAR augmentation still
            pads the *normalised* image with zeros (the authors' order) and maps the crop
            back to pixel values, so the model sees what it would see from a normalising
            pipeline (to float32 rounding; with a per-pixel mean, a shifted crop's values
            may stray from [0, 255] by the mean's variation).
    """
    if augmentation not in augment_lib.AUGMENTATIONS:
        raise ValueError(f"augmentation={augmentation!r} is not valid; expected one of: "
                         f"{', '.join(repr(a) for a in augment_lib.AUGMENTATIONS)}.")
    first, local, per_replica = _shard(input_context, batch_size)
    skip = start_step * batch_size

    if data.in_memory:
        n = data.num_train
        index = tf.data.Dataset.range(n).shuffle(n, seed=seed, reshuffle_each_iteration=True)
        batches = index.repeat().skip(skip).batch(batch_size, drop_remainder=True).enumerate()
        images = tf.constant(data.x_train)
        labels = tf.constant(data.y_train)

        def load_batch(batch_number, idx):
            idx = idx[first:first + local]
            x = tf.gather(images, idx)
            if augmentation == "cifar":
                x = augment_lib.cifar_batch(
                    normalization(x), _seed(seed, (batch_number + start_step) * batch_size),
                    start=first, total=batch_size)
                x = normalization.invert(x) if raw_pixels else x
            else:
                x = _output(x, normalization, raw_pixels)
            return x, tf.gather(labels, idx)

        ds = batches.map(load_batch, num_parallel_calls=AUTOTUNE)
        if local != per_replica:
            ds = ds.rebatch(per_replica)
        return ds.prefetch(AUTOTUNE).with_options(_options())

    # Files (ImageNet folders) or tfds records, one example at a time.
    if data.tfds_train is not None:
        records, n = data.tfds_train
        stream = records.shuffle(min(n, 20_000), seed=seed).repeat().skip(skip)
    else:
        n = data.num_train
        index = tf.data.Dataset.range(n).shuffle(n, seed=seed, reshuffle_each_iteration=True)
        stream = _decode_files(index.repeat().skip(skip), tf.constant(data.files_train[0]),
                               tf.constant(data.files_train[1]))
    stream = stream.enumerate()
    if local != batch_size:
        stream = stream.filter(
            lambda position, _: tf.logical_and(position % batch_size >= first,
                                               position % batch_size < first + local))

    def load_one(position, example):
        image, label = example
        return _augment_one(image, position + skip, augmentation, normalization, seed,
                            raw_pixels), label

    ds = stream.map(load_one, num_parallel_calls=AUTOTUNE)
    ds = ds.batch(per_replica, drop_remainder=drop_remainder)
    return ds.prefetch(AUTOTUNE).with_options(_options())


def _output(images, normalization, raw_pixels):
    """Normalised images, or pixel values as float32."""
    return tf.cast(images, tf.float32) if raw_pixels else normalization(images)


def _augment_one(image, position, augmentation, normalization, seed, raw_pixels):
    if augmentation == "imagenet":
        return _output(augment_lib.imagenet_train(image, _seed(seed, position)),
                       normalization, raw_pixels)
    if augmentation == "cifar":
        image = augment_lib.cifar_batch(normalization(image)[None], _seed(seed, position))[0]
        return normalization.invert(image) if raw_pixels else image
    return _output(image, normalization, raw_pixels)


def eval_dataset(data, *, batch_size, normalization, split="test", pad_to_batch=False,
                 eval_resize=256, eval_crop=224, input_context=None, raw_pixels=False):
    """Batches of ``(images, labels)``, or ``(images, labels, weights)`` if padded.

    Args:
        split: ``"test"`` or ``"val"`` (a validation split of the training set).
        pad_to_batch: pad the last global batch with zero-weight examples (static shapes on
            TPU and equal shards for multiple workers).
        eval_resize, eval_crop: ImageNet evaluation crop (256/224, or 320/320).
        input_context: a ``tf.distribute.InputContext``: this pipeline's share of every
            global batch, as per-replica batches.
        raw_pixels: yield pixel values in [0, 255] (float32) instead of normalised images.
    """
    if split == "val":
        x, y = data.x_val, data.y_val
        if x is None:
            raise ValueError("split='val' needs a dataset with a validation split.")
    elif data.in_memory:
        x, y = data.x_test, data.y_test
    else:
        x = y = None
    if x is not None:
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        ds = ds.map(lambda image, label: (_output(image, normalization, raw_pixels), label),
                    num_parallel_calls=AUTOTUNE)
        count = len(y)
    else:
        source = data.tfds_test[0] if data.tfds_test is not None else _decode_files(
            tf.data.Dataset.range(data.num_test), tf.constant(data.files_test[0]),
            tf.constant(data.files_test[1]), count=data.num_test)
        ds = source.map(lambda image, label: (
            _output(center_crop(image, eval_resize, eval_crop), normalization, raw_pixels),
            label), num_parallel_calls=AUTOTUNE)
        count = data.num_test
    if pad_to_batch:
        ds = ds.map(lambda image, label: (image, label, tf.constant(1.0)))
        missing = (-count) % batch_size
        if missing:
            filler = ds.take(1).map(lambda image, label, w: (image, label, tf.constant(0.0)))
            ds = ds.concatenate(filler.repeat(missing))
    ds = ds.batch(batch_size, drop_remainder=pad_to_batch)
    if input_context is not None and input_context.num_replicas_in_sync > 1:
        first, local, per_replica = _shard(input_context, batch_size)
        ds = ds.map(lambda *batch: tuple(t[first:first + local] for t in batch))
        ds = ds.rebatch(per_replica)
    return ds.prefetch(AUTOTUNE).with_options(_options())


def distribute(strategy, make_dataset):
    """``strategy.distribute_datasets_from_function`` for a pipeline builder.

    ``make_dataset(input_context)`` returns one pipeline's per-replica
    batches (``train_dataset``/``eval_dataset`` with ``input_context``).
    """
    return strategy.distribute_datasets_from_function(make_dataset)
