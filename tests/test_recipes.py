import numpy as np
import pytest

from keras_identity import recipes
from keras_identity.recipes import get_recipe
from keras_identity.recipes import resolve
from keras_identity.training import schedules

pytestmark = pytest.mark.quick  # the quick tier (docs/testing.md)


def lr_at(recipe, plan, steps):
    rate = schedules.from_recipe(recipe, plan)
    return [float(rate(s)) for s in steps]


def test_cifar_recipe_at_the_papers_boundaries():
    recipe = get_recipe("cifar")
    s = resolve(recipe, num_train=50_000, depth=110)
    assert (s.batch_size, s.total_steps, s.boundaries) == (128, 64_000, (32_000, 48_000))
    assert s.steps_per_epoch == 390 and s.epochs == 165
    got = lr_at(recipe, s, [0, 399, 400, 31_999, 32_000, 47_999, 48_000, 63_999])
    np.testing.assert_allclose(got, [0.01, 0.01, 0.1, 0.1, 0.01, 0.01, 0.001, 0.001],
                               rtol=1e-6)


def test_warmup_only_for_resnet110_and_1001():
    recipe = get_recipe("cifar")
    assert resolve(recipe, num_train=50_000, depth=164).warmup_steps == 0
    assert resolve(recipe, num_train=50_000, depth=1001).warmup_steps == 400
    assert resolve(recipe, num_train=50_000, depth=110, warmup_steps=0).warmup_steps == 0


def test_linear_scaling_with_the_global_batch():
    recipe = get_recipe("cifar")
    s = resolve(recipe, num_train=50_000, depth=1001, batch_size=64)  # the paper's ResNet-1001
    assert s.learning_rate == pytest.approx(0.05) and s.total_steps == 128_000
    assert s.boundaries == (64_000, 96_000) and s.warmup_steps == 800
    big = resolve(recipe, num_train=50_000, depth=110, batch_size=1024)
    assert big.learning_rate == pytest.approx(0.8) and big.total_steps == 8_000
    assert big.boundaries == (4_000, 6_000) and big.warmup_steps == 50
    np.testing.assert_allclose(lr_at(recipe, big, [0, 49, 50]), [0.08, 0.08, 0.8], rtol=1e-6)
    explicit = resolve(recipe, num_train=50_000, batch_size=1024, learning_rate=0.3)
    assert explicit.learning_rate == 0.3


def test_epochs_shorten_the_whole_schedule():
    recipe = get_recipe("cifar")
    s = resolve(recipe, num_train=50_000, epochs=10)
    assert s.total_steps == 3_900 and s.boundaries == (1_950, 2_925)


def test_imagenet_recipe():
    recipe = get_recipe("imagenet")
    s = resolve(recipe, num_train=1_281_167)
    assert s.steps_per_epoch == 5_004 and s.total_steps == 90 * 5_004
    assert s.boundaries == tuple(round(e * 5_004) for e in (30, 60, 80))
    assert s.warmup_steps == 0
    large = resolve(recipe, num_train=1_281_167, batch_size=1024)
    assert large.learning_rate == pytest.approx(0.4) and large.warmup == "linear"
    assert large.warmup_steps == 5 * large.steps_per_epoch
    half = lr_at(recipe, large, [large.warmup_steps // 2])[0]
    assert 0.1 < half < 0.4


def test_highway_mnist_exponential_decay():
    recipe = get_recipe("highway_mnist")
    s = resolve(recipe, num_train=60_000)
    np.testing.assert_allclose(lr_at(recipe, s, [0, 468, 2 * 468]), [0.1, 0.09, 0.081],
                               rtol=1e-5)


def test_default_recipes_and_bad_names():
    assert recipes.default_recipe("preact_resnet", "cifar10") == "cifar"
    assert recipes.default_recipe("highway_net", "cifar100") == "highway_cifar"
    assert recipes.default_recipe("resnet", "mnist") == "highway_mnist"
    assert recipes.default_recipe("resnet", "imagenet") == "imagenet"
    with pytest.raises(ValueError, match="recipe='sgdr'"):
        get_recipe("sgdr")
    with pytest.raises(ValueError, match="batch_size=0"):
        resolve(get_recipe("cifar"), num_train=10, batch_size=0)


def test_cifar_cosine_warms_up_linearly_then_follows_the_cosine():
    recipe = get_recipe("cifar_cosine")
    s = resolve(recipe, num_train=50_000, depth=20)
    # 40 epochs: a quarter of the cifar recipe's 64k iterations; warm-up: 5% = 2 epochs
    assert (s.total_steps, s.epochs, s.warmup_steps, s.warmup) == (15_600, 40, 780, "linear")
    assert s.total_steps <= get_recipe("cifar").train_steps / 4
    got = lr_at(recipe, s, [0, 390, 780, 780 + 7_410, 15_599, 15_600, 20_000])
    t = 7_410 / (15_600 - 780)  # half-way through the cosine
    expected = [0.01, 0.055, 0.1, 0.05 * (1 + np.cos(np.pi * t)), 0.0, 0.0, 0.0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-8)
    # the warm-up applies at every depth, and scales with the batch as the cifar recipe's
    assert resolve(recipe, num_train=50_000, depth=1001).warmup_steps == 780
    big = resolve(recipe, num_train=50_000, batch_size=512)
    assert (big.learning_rate, big.total_steps, big.warmup_steps) == (
        pytest.approx(0.4), 40 * 97, 194)
    np.testing.assert_allclose(lr_at(recipe, big, [0, 194]), [0.04, 0.4], rtol=1e-6)
    cifar = get_recipe("cifar")
    assert (recipe.augmentation, recipe.normalization) == (cifar.augmentation,
                                                           cifar.normalization)
    assert recipe.nesterov and recipe.weight_decay == 5e-4


def test_a_shorter_cifar_cosine_run_shrinks_its_warmup_and_cosine_together():
    recipe = get_recipe("cifar_cosine")
    short = resolve(recipe, num_train=50_000, train_steps=500)
    assert (short.total_steps, short.warmup_steps) == (500, 25)
    np.testing.assert_allclose(lr_at(recipe, short, [0, 25, 499]), [0.01, 0.1, 0.0],
                               atol=1e-5)
    assert resolve(recipe, num_train=50_000, epochs=80).warmup_steps == 1_560
    assert resolve(recipe, num_train=50_000, train_steps=1).warmup_steps == 0
    # --warmup_steps keeps the recipe's linear ramp from a tenth of the run's rate
    flagged = resolve(recipe, num_train=50_000, warmup_steps=100, learning_rate=0.05)
    assert (flagged.warmup_steps, flagged.warmup, flagged.warmup_rate) == (
        100, "linear", pytest.approx(0.005))
    with pytest.raises(ValueError, match="warmup_steps=500 is not valid for recipe "
                                         "'cifar_cosine'; expected fewer than the run's 500"):
        resolve(recipe, num_train=50_000, train_steps=500, warmup_steps=500)


def test_the_cosine_schedule_round_trips_and_refuses_a_warmup_past_its_end():
    rate = schedules.WarmupCosineDecay(0.2, 100, warmup_steps=10, warmup_rate=0.02)
    again = schedules.WarmupCosineDecay.from_config(rate.get_config())
    steps = [0, 5, 10, 55, 99, 100]
    np.testing.assert_allclose([float(again(s)) for s in steps],
                               [float(rate(s)) for s in steps])
    np.testing.assert_allclose(float(rate(55)), 0.1, rtol=1e-6)
    with pytest.raises(ValueError, match="warmup_steps=100 is not valid"):
        schedules.WarmupCosineDecay(0.1, 100, warmup_steps=100)
    with pytest.raises(ValueError, match="total_steps=0 is not valid"):
        schedules.WarmupCosineDecay(0.1, 0)
