"""The papers' training recipes, and how they adapt to other batch sizes.

A recipe is written for its reference global batch size.  Run with another global batch
B, it follows the linear scaling rule (Goyal et al. 2017): the learning rate is
multiplied by ``B / B_ref`` and every iteration count (training length, warm-up) by
``B_ref / B``, so the run covers the same number of epochs with the same schedule shape.
Learning-rate drops are placed at fixed fractions of the training length (CIFAR: 32k and
48k of 64k iterations = 50% and 75%), so ``--epochs``/``--train_steps`` shorten or
lengthen the whole schedule.

Weight decay is applied as in the authors' Torch code: added to the gradient before
momentum, for every parameter (:class:`keras_identity.training.MomentumSGD`), which
equals an L2 penalty ``wd/2 ||w||^2`` in the loss.

The recipes are the papers' numbers and plain Python: the model builders read a recipe's
input normalisation from here, the trainer and the search resolve and run them (the
Keras schedule of a resolved recipe is
:func:`keras_identity.training.schedules.from_recipe`).
"""

import dataclasses
import math

RECIPE_NAMES = ("cifar", "cifar_cosine", "imagenet", "highway_mnist", "highway_mnist_conv", "highway_cifar")


@dataclasses.dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    batch_size: int
    learning_rate: float
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 0.0
    schedule: str = "step"            # "step", "exponential" or "cosine"
    train_steps: int = None           # at the reference batch size ...
    epochs: int = None                # ... or in epochs
    boundaries: tuple = ()            # fractions of training for the "step" schedule
    decay_factor: float = 0.1         # lr multiplier at each boundary
    exponential_decay: float = 1.0    # per epoch, for the "exponential" schedule
    warmup_steps: int = 0             # at the reference batch size
    warmup_rate: float = None
    warmup: str = "constant"          # "constant" or "linear" (a ramp to the base rate)
    warmup_fraction: float = 0.0      # a warm-up over this fraction of the run (any length)
    warmup_depths: tuple = ()         # depths the warm-up applies to (empty: all)
    large_batch_warmup_epochs: float = 0.0
    augmentation: str = "none"
    normalization: str = "scale"


RECIPES = {
    "cifar": Recipe(
        "cifar", "He et al. 2015/2016 CIFAR: SGD 0.9, wd 1e-4, batch 128, lr 0.1 /10 at "
        "32k and 48k iterations, stop at 64k; 400 iterations at 0.01 first for ResNet-110 "
        "and ResNet-1001; 4-pixel pad + random crop + flip; per-pixel mean subtracted",
        batch_size=128, learning_rate=0.1, weight_decay=1e-4, train_steps=64_000,
        boundaries=(0.5, 0.75), warmup_steps=400, warmup_rate=0.01,
        warmup_depths=(110, 1001), augmentation="cifar", normalization="per_pixel_mean"),
    "cifar_cosine": Recipe(
        "cifar_cosine", "A fast CIFAR schedule (ours, from published parts): 40 epochs "
        "(a quarter of the paper's 64k iterations) of SGD 0.9 with Nesterov momentum, "
        "batch 128, a linear warm-up from 0.01 to lr 0.1 over the first 5% of the run (2 "
        "epochs; Goyal et al. 2017), then cosine annealing to 0 (Loshchilov & Hutter 2017, SGDR without "
        "restarts; with warm-up as in He et al. 2019, Bag of Tricks), wd 5e-4 (Zagoruyko & "
        "Komodakis 2016's CIFAR value); the cifar recipe's augmentation and per-pixel mean",
        batch_size=128, learning_rate=0.1, nesterov=True, weight_decay=5e-4, epochs=40,
        schedule="cosine", warmup_fraction=0.05, warmup_rate=0.01, warmup="linear",
        augmentation="cifar", normalization="per_pixel_mean"),
    "imagenet": Recipe(
        "imagenet", "He et al. 2015 ImageNet: SGD 0.9, wd 1e-4, batch 256, lr 0.1 /10 at "
        "epochs 30, 60, 80, stop at 90 (5 epochs of linear warm-up above batch 256); "
        "scale augmentation [256, 480], 224 crops, flip",
        batch_size=256, learning_rate=0.1, weight_decay=1e-4, epochs=90,
        boundaries=(30 / 90, 60 / 90, 80 / 90), large_batch_warmup_epochs=5.0,
        augmentation="imagenet", normalization="per_channel"),
    "highway_mnist": Recipe(
        "highway_mnist", "Srivastava et al. 2015 Sec. 3.1: SGD with momentum 0.9 and an "
        "exponentially decaying learning rate (0.1, x0.9 per epoch), batch 128, 20 epochs, "
        "inputs scaled to [0, 1], no augmentation (values from the paper's search space)",
        batch_size=128, learning_rate=0.1, schedule="exponential", exponential_decay=0.9,
        epochs=20, normalization="scale"),
    "highway_mnist_conv": Recipe(
        "highway_mnist_conv", "Srivastava et al. 2015 Sec. 3.2 (Table 1's convolutional MNIST "
        "nets; the paper gives no recipe, these are our values): SGD with momentum 0.9, lr "
        "0.1 /10 at 50% and 75%, wd 5e-4, batch 128, 30 epochs, inputs scaled to [0, 1], no "
        "augmentation",
        batch_size=128, learning_rate=0.1, weight_decay=5e-4, epochs=30,
        boundaries=(0.5, 0.75), normalization="scale"),
    "highway_cifar": Recipe(
        "highway_cifar", "Srivastava et al. 2015 Sec. 3.3: SGD with momentum 0.9, a stepwise "
        "decay (lr 0.02, /10 at 50% and 75%), wd 5e-4, batch 128, 200 epochs; translations "
        "and flips; per-channel normalisation (our values: the paper gives none)",
        batch_size=128, learning_rate=0.02, weight_decay=5e-4, epochs=200,
        boundaries=(0.5, 0.75), augmentation="cifar", normalization="per_channel"),
}


def default_recipe(model, dataset, architecture=None):
    """The recipe a model/dataset pair trains with when ``--recipe`` is not
    given (``architecture``: a highway or plain net's, if set)."""
    if dataset == "imagenet":
        return "imagenet"
    highway = model.startswith(("highway", "plain"))
    if dataset == "mnist":
        return "highway_mnist_conv" if highway and architecture == "convolutional" else (
            "highway_mnist")
    return "highway_cifar" if highway else "cifar"


def get_recipe(name):
    if name not in RECIPES:
        raise ValueError(f"recipe={name!r} is not valid; expected one of: "
                         f"{', '.join(repr(r) for r in RECIPE_NAMES)}.")
    return RECIPES[name]


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """A recipe resolved for one run: its step counts, global batch and rates
    (its learning-rate schedule: :func:`~keras_identity.training.schedules.from_recipe`)."""

    learning_rate: float
    total_steps: int
    steps_per_epoch: int
    boundaries: tuple
    warmup_steps: int
    warmup_rate: float
    warmup: str
    batch_size: int
    scale: float
    data_epoch_steps: int = 1         # steps of one pass over the training set

    @property
    def epochs(self):
        return math.ceil(self.total_steps / self.steps_per_epoch)


def resolve(recipe, *, num_train, batch_size=None, depth=None, learning_rate=None,
            epochs=None, train_steps=None, steps_per_epoch=None, warmup_steps=None):
    """The :class:`RunPlan` of ``recipe`` for a global ``batch_size`` and a
    training set size.

    Flags given explicitly (not ``None``) override the recipe and are not
    rescaled: ``learning_rate`` is the rate at this batch size.
    """
    batch = recipe.batch_size if batch_size is None else batch_size
    if batch < 1:
        raise ValueError(f"batch_size={batch_size!r} is not valid; expected >= 1.")
    scale = batch / recipe.batch_size
    data_epoch = max(1, num_train // batch)
    per_epoch = steps_per_epoch or data_epoch
    if train_steps is not None:
        total = int(train_steps)
    elif epochs is not None:
        total = int(epochs) * per_epoch
    elif recipe.train_steps is not None:
        total = max(1, round(recipe.train_steps / scale))
    else:
        total = recipe.epochs * per_epoch
    if total < 1:
        raise ValueError("the run has no training steps; raise --epochs or --train_steps.")
    lr = learning_rate if learning_rate is not None else recipe.learning_rate * scale
    # The warm-up rate keeps the recipe's ratio to the run's rate (CIFAR: a tenth).
    ratio = recipe.warmup_rate / recipe.learning_rate if recipe.warmup_rate else 0.1
    warmup, warmup_rate, kind = 0, lr, "constant"
    if warmup_steps is not None:
        warmup, warmup_rate, kind = int(warmup_steps), lr * ratio, recipe.warmup
    elif recipe.warmup_fraction:
        warmup = round(recipe.warmup_fraction * total)
        warmup_rate, kind = lr * ratio, recipe.warmup
    elif recipe.warmup_steps and (not recipe.warmup_depths or depth in recipe.warmup_depths):
        warmup = max(1, round(recipe.warmup_steps / scale))
        warmup_rate, kind = lr * ratio, recipe.warmup
    elif recipe.large_batch_warmup_epochs and scale > 1:
        warmup = round(recipe.large_batch_warmup_epochs * per_epoch)
        warmup_rate, kind = recipe.learning_rate, "linear"
    if recipe.schedule == "cosine" and warmup >= total:
        raise ValueError(f"warmup_steps={warmup} is not valid for recipe {recipe.name!r}; "
                         f"expected fewer than the run's {total} steps.")
    boundaries = tuple(max(1, round(f * total)) for f in recipe.boundaries)
    return RunPlan(learning_rate=lr, total_steps=total, steps_per_epoch=per_epoch,
                    boundaries=boundaries, warmup_steps=min(warmup, total),
                    warmup_rate=warmup_rate, warmup=kind, batch_size=batch, scale=scale,
                    data_epoch_steps=data_epoch)
