"""The JAX route's NumPy pipeline: the tf.data pipeline's streams without
TensorFlow (exactly where no randomness is involved, in distribution
elsewhere), sharded over processes, resumable."""

import numpy as np
import pytest

from keras_identity.data import arrays
from keras_identity.data.image_dataset import ImageDataset
from keras_identity.data.normalization import Normalization



def _dataset(n=40, n_test=13, size=8, channels=3, seed=0):
    rng = np.random.default_rng(seed)
    return ImageDataset(
        name="cifar10", num_classes=10, class_names=[str(i) for i in range(10)],
        image_shape=(size, size, channels), source="test",
        x_train=rng.integers(0, 256, (n, size, size, channels), dtype=np.uint8),
        y_train=np.arange(n, dtype=np.int32) % 10,
        x_test=rng.integers(0, 256, (n_test, size, size, channels), dtype=np.uint8),
        y_test=np.arange(n_test, dtype=np.int32) % 10)


def _normalization(data, mode="per_pixel_mean"):
    return Normalization.from_images(mode, data.x_train)


def test_crop_and_flip_is_the_padded_crop_and_its_mirror():
    rng = np.random.default_rng(1)
    images = rng.normal(size=(3, 5, 6, 2)).astype(np.float32)
    offsets = np.array([[0, 8], [4, 4], [8, 1]])
    flips = np.array([False, True, True])
    out = arrays.crop_and_flip(images, offsets, flips)
    padded = np.pad(images, ((0, 0), (4, 4), (4, 4), (0, 0)))
    for i in range(3):
        crop = padded[i, offsets[i, 0]:offsets[i, 0] + 5, offsets[i, 1]:offsets[i, 1] + 6]
        np.testing.assert_array_equal(out[i], crop[:, ::-1] if flips[i] else crop)
    # Offset (4, 4) without a flip is the image itself.
    np.testing.assert_array_equal(
        arrays.crop_and_flip(images, np.full((3, 2), 4), np.zeros(3, bool)), images)


def test_every_pass_is_a_permutation_and_batches_cross_passes():
    data = _dataset(n=40)
    stream = arrays.TrainBatches(data, batch_size=16, normalization=_normalization(data))
    seen = np.concatenate([stream.indices(step) for step in range(5)])  # 80 = two passes
    assert sorted(seen[:40]) == list(range(40)) and sorted(seen[40:]) == list(range(40))
    assert list(seen[:40]) != list(seen[40:])  # reshuffled each pass
    assert list(seen[:40]) != list(range(40))
    # Batch 2 holds the last 8 examples of pass 0 and the first 8 of pass 1.
    np.testing.assert_array_equal(stream.indices(2), seen[32:48])
    stream.close()


def test_a_resumed_stream_reads_what_an_uninterrupted_one_would():
    data = _dataset()
    norm = _normalization(data)
    whole = arrays.TrainBatches(data, batch_size=8, normalization=norm, augmentation="cifar",
                                seed=3, raw_pixels=True)
    resumed = arrays.TrainBatches(data, batch_size=8, normalization=norm,
                                  augmentation="cifar", seed=3, start_step=7, raw_pixels=True)
    for i in range(3):
        for a, b in zip(whole[7 + i], resumed[i]):
            np.testing.assert_array_equal(a, b)
    other_seed = arrays.TrainBatches(data, batch_size=8, normalization=norm,
                                     augmentation="cifar", seed=4, raw_pixels=True)
    assert not np.array_equal(whole[0][0], other_seed[0][0])
    for stream in (whole, resumed, other_seed):
        stream.close()


@pytest.mark.parametrize("augmentation", ["none", "cifar"])
def test_processes_read_disjoint_rows_of_the_same_global_batches(augmentation):
    """Across three processes every example of a global batch is read once,
    with the augmentation a single process gives it."""
    data = _dataset(n=60)
    norm = _normalization(data)
    single = arrays.TrainBatches(data, batch_size=12, normalization=norm,
                                 augmentation=augmentation, seed=5, raw_pixels=True)
    shards = [arrays.TrainBatches(data, batch_size=12, normalization=norm,
                                  augmentation=augmentation, seed=5, raw_pixels=True,
                                  process_index=i, process_count=3) for i in range(3)]
    epoch = []
    for step in range(5):  # one pass of 60 examples
        parts = [shard[step] for shard in shards]
        x, y = single[step]
        np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), x)
        np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), y)
        epoch += [index for shard in shards for index in shard.indices(step)]
    assert sorted(epoch) == list(range(60))  # none twice, none missed
    with pytest.raises(ValueError, match="batch_size=12 is not valid with 5 processes"):
        arrays.TrainBatches(data, batch_size=12, normalization=norm, process_count=5)
    for stream in [single] + shards:
        stream.close()


def test_cifar_draws_are_uniform_offsets_and_fair_flips():
    """In distribution: the offsets uniform over the 9 positions of each
    axis, half the crops mirrored (the tf.data pipeline's law)."""
    offsets, flips = zip(*(arrays.cifar_draws(0, step, 128) for step in range(100)))
    offsets, flips = np.concatenate(offsets), np.concatenate(flips)
    assert offsets.min() == 0 and offsets.max() == 8
    counts = np.bincount(offsets.reshape(-1), minlength=9)
    expected = offsets.size / 9
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 26.1  # the 0.999 quantile of chi-square with 8 degrees of freedom
    assert abs(flips.mean() - 0.5) < 4 * 0.5 / np.sqrt(flips.size)


def test_raw_pixels_of_an_unmoved_crop_are_the_image():
    """The CIFAR augmentation pads the normalised image and maps the crop back
    to pixel values: a crop at (4, 4) without a flip is the stored image."""
    data = _dataset()
    norm = _normalization(data)
    x = arrays.crop_and_flip(norm(data.x_train[:4]), np.full((4, 2), 4), np.zeros(4, bool))
    np.testing.assert_allclose(norm.invert(x), data.x_train[:4], atol=1e-3)


def test_eval_batches_pad_with_zero_weights_and_shard():
    data = _dataset(n_test=13)
    norm = _normalization(data, "per_channel")
    plain = arrays.EvalBatches(data, batch_size=6, normalization=norm)
    assert plain.num_batches == 3
    x = np.concatenate([plain[i][0] for i in range(3)])
    np.testing.assert_allclose(x, norm(data.x_test), rtol=1e-6)
    np.testing.assert_array_equal(np.concatenate([plain[i][1] for i in range(3)]),
                                  data.y_test)
    padded = [arrays.EvalBatches(data, batch_size=6, normalization=norm, pad_to_batch=True,
                                 process_index=i, process_count=2) for i in range(2)]
    weights = np.concatenate([p[b][2] for b in range(3) for p in padded])
    labels = np.concatenate([p[b][1] for b in range(3) for p in padded])
    assert weights.sum() == 13 and weights[:13].all() and not weights[13:].any()
    np.testing.assert_array_equal(labels[:13], data.y_test)
    assert all(p[b][0].shape == (3, 8, 8, 3) for p in padded for b in range(3))
    with pytest.raises(ValueError, match="pad_to_batch=True"):
        arrays.EvalBatches(data, batch_size=6, normalization=norm, process_count=2)
    with pytest.raises(IndexError):
        plain[3]
    for stream in [plain] + padded:
        stream.close()


def test_imagenet_scale_augmentation_and_center_crop():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)
    out = arrays.imagenet_train(image, np.random.default_rng(1))
    assert out.shape == (224, 224, 3) and out.dtype == np.float32
    assert 0.0 <= out.min() and out.max() <= 255.0
    crop = arrays.center_crop(image, 256, 224)
    assert crop.shape == (224, 224, 3)
    # A constant image stays constant through the resize and the crop.
    flat = np.full((300, 400, 3), 77, np.uint8)
    np.testing.assert_array_equal(arrays.center_crop(flat), np.full((224, 224, 3), 77.0))


def test_imagenet_folders_stream_without_tensorflow(tmp_path):
    """File-based datasets: decoded with Pillow, augmented one image at a time."""
    from PIL import Image

    rng = np.random.default_rng(0)
    paths, labels = [], []
    for i in range(4):
        path = tmp_path / f"{i}.png"
        Image.fromarray(rng.integers(0, 256, (260 + 10 * i, 300, 3), dtype=np.uint8)).save(path)
        paths.append(str(path))
        labels.append(i % 2)
    data = ImageDataset(name="imagenet", num_classes=2, class_names=["a", "b"],
                        image_shape=(224, 224, 3), source=str(tmp_path),
                        files_train=(paths, np.array(labels, np.int32)),
                        files_test=(paths, np.array(labels, np.int32)))
    norm = Normalization.imagenet()
    train = arrays.TrainBatches(data, batch_size=4, normalization=norm,
                                augmentation="imagenet", raw_pixels=True)
    x, y = train[0]
    assert x.shape == (4, 224, 224, 3) and sorted(y) == [0, 0, 1, 1]
    test = arrays.EvalBatches(data, batch_size=3, normalization=norm, raw_pixels=True)
    assert test.num_batches == 2 and test[1][0].shape == (1, 224, 224, 3)
    with pytest.raises(ValueError, match="augmentation='cifar' crops whole in-memory batches"):
        arrays.TrainBatches(data, batch_size=4, normalization=norm, augmentation="cifar")
    train.close()
    test.close()


@pytest.mark.needs_tensorflow
def test_the_two_pipelines_agree_where_no_randomness_is_involved():
    """Exactly: the test set's batches, the normalisation, and a CIFAR crop
    and flip given TensorFlow's own offsets and flips."""
    import tensorflow as tf

    from keras_identity.data import augment
    from keras_identity.data import pipeline

    data = _dataset(n_test=13)
    norm = _normalization(data)
    ours = arrays.EvalBatches(data, batch_size=5, normalization=norm, raw_pixels=False)
    theirs = list(pipeline.eval_dataset(data, batch_size=5, normalization=norm))
    for i, (x, y) in enumerate(theirs):
        np.testing.assert_array_equal(ours[i][0], x.numpy())
        np.testing.assert_array_equal(ours[i][1], y.numpy())
    ours.close()

    images = norm(data.x_train[:8])
    seed = tf.constant([3, 16], tf.int64)
    expected = augment.cifar_batch(tf.constant(images), seed).numpy()
    offsets = tf.random.stateless_uniform([8, 2], seed, minval=0, maxval=9,
                                          dtype=tf.int32).numpy()
    flips = tf.random.stateless_uniform([8], seed + 1).numpy() < 0.5
    np.testing.assert_array_equal(arrays.crop_and_flip(images, offsets, flips), expected)


@pytest.mark.needs_tensorflow
def test_center_crop_agrees_with_tensorflow_in_distribution():
    """The ImageNet evaluation crop: Pillow's and TensorFlow's antialiased
    bilinear resizes differ by rounding only."""
    from keras_identity.data import augment

    rng = np.random.default_rng(0)
    smooth = np.kron(rng.integers(0, 256, (30, 40, 3)), np.ones((10, 10, 1))).astype(np.uint8)
    ours = arrays.center_crop(smooth, 256, 224)
    theirs = augment.center_crop(smooth, 256, 224).numpy()
    assert np.abs(ours - theirs).mean() < 2.0
