import numpy as np
import pytest
tf = pytest.importorskip("tensorflow")  # TensorFlow-only module

from keras_identity.data import ImageDataset
from keras_identity.data import Normalization
from keras_identity.data import augment
from keras_identity.data import eval_dataset
from keras_identity.data import train_dataset


def _data(n=40, size=8):
    x = np.arange(n * size * size * 3, dtype=np.int64).reshape(n, size, size, 3) % 251
    return ImageDataset(name="cifar10", num_classes=4, class_names=list("abcd"),
                        image_shape=(size, size, 3), source="test", x_train=x.astype(np.uint8),
                        y_train=(np.arange(n) % 4).astype(np.int32),
                        x_test=x[:10].astype(np.uint8), y_test=np.arange(10) % 4)


def _take(ds, k):
    return [(x.numpy(), y.numpy()) for x, y in ds.take(k)]


def test_cifar_augmentation_is_a_padded_crop_or_its_flip(rng):
    images = tf.constant(rng.normal(size=(64, 8, 8, 3)).astype("float32"))
    out = augment.cifar_batch(images, tf.constant([1, 2], tf.int64)).numpy()
    padded = np.pad(images.numpy(), [(0, 0), (4, 4), (4, 4), (0, 0)])
    flips = 0
    for i in range(64):
        crops = [padded[i, r:r + 8, c:c + 8] for r in range(9) for c in range(9)]
        if any(np.array_equal(out[i], c) for c in crops):
            continue
        assert any(np.array_equal(out[i], c[:, ::-1]) for c in crops)
        flips += 1
    assert 16 < flips < 48


def test_slices_of_a_global_batch_are_augmented_as_the_whole():
    images = tf.random.normal((8, 6, 6, 3))
    seed = tf.constant([3, 9], tf.int64)
    whole = augment.cifar_batch(images, seed).numpy()
    part = augment.cifar_batch(images[4:], seed, start=4, total=8).numpy()
    np.testing.assert_array_equal(part, whole[4:])


def test_stream_is_deterministic_and_resumable():
    data = _data()
    norm = Normalization("scale")
    full = _take(train_dataset(data, batch_size=8, normalization=norm, augmentation="cifar",
                               seed=5), 7)
    again = _take(train_dataset(data, batch_size=8, normalization=norm, augmentation="cifar",
                                seed=5), 7)
    resumed = _take(train_dataset(data, batch_size=8, normalization=norm,
                                  augmentation="cifar", seed=5, start_step=4), 3)
    for (x1, y1), (x2, y2) in zip(full, again):
        np.testing.assert_array_equal(x1, x2)
    for (x1, y1), (x2, y2) in zip(full[4:], resumed):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)
    other = _take(train_dataset(data, batch_size=8, normalization=norm, augmentation="cifar",
                                seed=6), 1)
    assert not np.array_equal(other[0][0], full[0][0])


def test_every_epoch_visits_every_example_once():
    data = _data(n=40)
    labels = []
    ds = train_dataset(data, batch_size=8, normalization=Normalization("scale"))
    seen = np.concatenate([x.numpy()[:, 0, 0, 0] for x, _ in ds.take(5)])
    first_pixels = data.x_train[:, 0, 0, 0] / 255.0
    np.testing.assert_allclose(np.sort(seen), np.sort(first_pixels), atol=1e-6)
    del labels


def test_input_pipelines_split_each_global_batch():
    data = _data()
    norm = Normalization("scale")
    whole = _take(train_dataset(data, batch_size=8, normalization=norm, augmentation="cifar",
                                seed=2), 3)
    parts = []
    for worker in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=worker,
                                             num_replicas_in_sync=4)
        # 2 replicas per worker: per-replica batches of 2 examples.
        parts.append(_take(train_dataset(data, batch_size=8, normalization=norm,
                                         augmentation="cifar", seed=2,
                                         input_context=context), 6))
    for step in range(3):
        pieces = [parts[w][2 * step + r][0] for w in range(2) for r in range(2)]
        np.testing.assert_array_equal(np.concatenate(pieces), whole[step][0])


def test_eval_padding_keeps_metrics_exact():
    data = _data()
    ds = eval_dataset(data, batch_size=4, normalization=Normalization("scale"),
                      pad_to_batch=True)
    batches = list(ds)
    assert all(x.shape[0] == 4 for x, _, _ in batches)
    weights = np.concatenate([w.numpy() for _, _, w in batches])
    assert weights.sum() == 10 and len(weights) == 12


def test_pipelines_run_without_the_autotuning_thread():
    # tf.data's autotuning thread made deleting an iterator wait for its next
    # optimisation time (seconds at the end of an evaluation or of fit).
    data = _data()
    norm = Normalization("scale")
    pipelines = [train_dataset(data, batch_size=8, normalization=norm, augmentation="cifar"),
                 eval_dataset(data, batch_size=4, normalization=norm),
                 eval_dataset(data, batch_size=4, normalization=norm, pad_to_batch=True)]
    for ds in pipelines:
        options = ds.options()
        assert options.autotune.enabled is False
        assert options.deterministic is True
        assert (options.experimental_distribute.auto_shard_policy
                == tf.data.experimental.AutoShardPolicy.OFF)
    # The parallel map and prefetch still work without the tuner.
    x, y = next(iter(pipelines[0]))
    assert x.shape == (8, 8, 8, 3) and y.shape == (8,)


def test_raw_pixels_are_what_the_model_normalises_to_the_normalising_pipeline():
    """For models with their preprocessing: the CIFAR augmentation still pads
    the normalised image with zeros, and normalising the raw stream gives the
    normalising stream back."""
    data = _data()
    norm = Normalization.from_images("per_pixel_mean", data.x_train)
    kwargs = dict(batch_size=8, normalization=norm, augmentation="cifar", seed=3)
    normalised = next(iter(train_dataset(data, **kwargs)))[0].numpy()
    raw = next(iter(train_dataset(data, raw_pixels=True, **kwargs)))[0].numpy()
    np.testing.assert_allclose(norm(raw), normalised, atol=2e-6)
    evaluated = next(iter(eval_dataset(data, batch_size=8, normalization=norm,
                                       raw_pixels=True)))[0].numpy()
    np.testing.assert_array_equal(evaluated, data.x_test[:8].astype(np.float32))
