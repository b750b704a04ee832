"""The datasets of the papers: names, image shapes and classes (the one table
that data loaders, model builders and the trainer read)."""

DATASETS = ("mnist", "cifar10", "cifar100", "imagenet")
IMAGE_SHAPES = {"mnist": (28, 28, 1), "cifar10": (32, 32, 3), "cifar100": (32, 32, 3),
                "imagenet": (224, 224, 3)}
NUM_CLASSES = {"mnist": 10, "cifar10": 10, "cifar100": 100, "imagenet": 1000}

# The papers' augmentations (keras_identity.data.augment, tf.data; and
# keras_identity.data.arrays, NumPy): none (MNIST), CIFAR's pad-4 crop and
# flip (He et al. 2015, Sec. 4.2), ImageNet's scale augmentation (Sec. 3.4).
AUGMENTATIONS = ("none", "cifar", "imagenet")
