"""Datasets (tensorflow_datasets or offline files), augmentation, pipelines."""

from keras_identity.data.augment import AUGMENTATIONS
from keras_identity.data.datasets import DATASETS
from keras_identity.data.datasets import DataError
from keras_identity.data.datasets import ImageDataset
from keras_identity.data.datasets import load_dataset
from keras_identity.data.normalization import Normalization
from keras_identity.data.normalization import load_preprocessing
from keras_identity.data.normalization import save_preprocessing
from keras_identity.data.pipeline import eval_dataset
from keras_identity.data.pipeline import train_dataset
