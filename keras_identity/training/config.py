"""A run's configuration: :class:`TrainConfig`, its flags and their checks.

Each field of :class:`TrainConfig` is a setting of a run, declared once
with :func:`setting` (its default and, for the command-line programs, its
flag's help and choices); :meth:`TrainConfig.validate` checks the values and
their combinations.  :class:`ConfigError` is the one-line error with which
a run refuses a configuration or data that cannot work (:func:`prepare
<keras_identity.training.trainer.prepare>` raises it too).  The choice
tuples (:data:`PRECISIONS`, :data:`CHECKPOINT_FORMATS`) are here too.
"""

import dataclasses
import os

import keras

from keras_identity import _checks
from keras_identity import recipes as recipes_lib
from keras_identity import storage
from keras_identity.data import facts
from keras_identity.data import normalization as normalization_lib
from keras_identity.models import registry
from keras_identity.models.resnet import default_stride_on_1x1
from keras_identity.training import orbax_checkpoints
from keras_identity.training import preemption
from keras_identity.training import run_files
from keras_identity.training import strategies

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
CHECKPOINT_FORMATS = ("orbax", "h5")


class ConfigError(ValueError):
    """The configuration or the data cannot work; the message says why (one line)."""


def setting(default=None, help=None, choices=None):
    """A field of :class:`TrainConfig`: its default and, for the command-line
    programs, its flag's ``help`` and ``choices`` (the flags are generated
    from these fields; a field without ``help`` has no flag of its own)."""
    metadata = {} if help is None else {"help": help, "choices": choices}
    if isinstance(default, dict):
        return dataclasses.field(default_factory=dict, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


# Settings of one backend's machinery: (name, backend, what it sets there).
_BACKEND_SETTINGS = (
    ("intra_op_threads", "tensorflow",
     "it sets TensorFlow's CPU thread pools (XLA's CPU runtime sizes its own)"),
    ("input_workers", "jax", "it sets the JAX route's worker processes (--backend=jax), "
     "tf.data tunes its own parallelism"))


@dataclasses.dataclass
class TrainConfig:
    """Everything a run depends on; each field is also a flag of
    ``keras-identity-train`` (``--name``, with the help given here)."""

    model: str = setting("highway_net", "Builder (resnet, preact_resnet, highway_net, "
                         "plain_net) or a named configuration (e.g. preact_resnet164).")
    depth: int = setting(None, "Depth (none given: the model's usual depth for the dataset).")
    # Builder arguments, passed through to the model's builder (e.g.
    # {"shortcut": "exclusive_gating", "gate_bias_init": -6.0}); on the
    # command line the model flags and --model_kwargs.
    model_kwargs: dict = setting({})
    dataset: str = setting("mnist", "Dataset.", facts.DATASETS)
    data_dir: str = setting(None, "Offline data (.npz, image folder or .tar.gz, or a folder "
                            "holding one) or a tensorflow_datasets data directory.")
    recipe: str = setting(None, "Training recipe (default: by model and dataset).",
                          recipes_lib.RECIPE_NAMES)
    batch_size: int = setting(None, "Global batch size (default: the recipe's; the learning "
                              "rate and iteration counts scale linearly).")
    epochs: int = setting(None, "Train this many epochs (overrides the recipe's length).")
    train_steps: int = setting(None, "Train this many iterations.")
    stop_at_step: int = setting(None, "Stop at this step, resumable: the learning-rate "
                                "schedule keeps the run's length (the start of a long run; "
                                "a multiple of the epoch).")
    steps_per_epoch: int = setting(None, "Iterations per epoch (default: one pass over the "
                                   "training set); also the checkpoint interval.")
    learning_rate: float = setting(None, "Peak learning rate at this batch size.")
    momentum: float = setting(None, "SGD momentum.")
    weight_decay: float = setting(None, "Weight decay (coupled, as the authors' Torch code).")
    lr_decay: float = setting(None, "Learning-rate decay factor per epoch (recipes with an "
                              "exponential schedule: highway_mnist).")
    warmup_steps: int = setting(None, "Warm-up iterations.")
    normalization: str = setting(None, "Input normalisation (default: the recipe's).",
                                 normalization_lib.MODES)
    augmentation: str = setting(None, "Data augmentation (default: the recipe's).",
                                facts.AUGMENTATIONS)
    strategy: str = setting("auto", "Distribution: a tf.distribute strategy on TensorFlow, "
                            "keras.distribution.DataParallel on JAX (auto/mirrored: every "
                            "device, of every process).", strategies.STRATEGIES)
    tpu: str = setting("", "TPU address for --strategy=tpu (Colab: empty).")
    precision: str = setting("float32", "Keras dtype policy (mixed_float16 uses loss "
                             "scaling).", PRECISIONS)
    jit_compile: bool = setting(False, "Compile the training step with XLA.")
    steps_per_execution: int = setting(None, "Training steps per call of the compiled "
                                       "function (default: 32 on a TPU, up to 16 on JAX, else "
                                       "1; a divisor of the epoch).")
    seed: int = setting(0, "Seed of initialisation, shuffling and augmentation.")
    deterministic: bool = setting(False, "Enable TensorFlow op determinism (with --seed: "
                                  "repeatable runs on CPU).")
    model_dir: str = setting(None, "Output directory (default: a folder of runs/ named by "
                             "model, depth and dataset).")
    keep_checkpoints: int = setting(2, "Checkpoints kept.")
    checkpoint_format: str = setting(
        None, "Checkpoints as Orbax checkpoints (asynchronous, written by every process; JAX "
        "only, the default there where orbax-checkpoint is installed) or Keras HDF5 weights "
        "files (h5: TensorFlow's).", CHECKPOINT_FORMATS)
    checkpoint_every: str = setting(
        preemption.DEFAULT_CHECKPOINT_EVERY, "Checkpoints inside an epoch as well as at its "
        "end: every N steps (500), or every span of training time (90s, 10m, 1h); 'epoch': "
        "at epoch ends only.")
    stop_signal: str = setting(None, "A signal that stops the run with a checkpoint, besides "
                               "SIGTERM and SIGINT (SLURM: --signal=USR1@120 with USR1).")
    intra_op_threads: int = setting(
        None, "TensorFlow threads per CPU operation in training (default: half the cores, two "
        "operations at once, where the batch gives each core 8 images or fewer on a CPU; 0: "
        "TensorFlow's own split, every core per operation).")
    input_workers: int = setting(
        None, "Processes decoding image files on the JAX route (Grain; default: one per "
        "core on machines of more than 2 cores where grain is installed, else 0: two threads "
        "of the training process). The stream is the same for every value.")
    train_examples: int = setting(None, "Use a random subset of the training set.")
    test_examples: int = setting(None, "Use a random subset of the test set.")
    eval_crop: int = setting(224, "ImageNet evaluation crop (Table 5).", (224, 320))
    verbose: int = setting(1, "Keras progress: 0 silent, 1 progress bar, 2 one line per "
                           "epoch.", (0, 1, 2))

    def validate(self):
        """Checks the flags' values and combinations; raises :class:`ConfigError`."""
        try:
            self._check()
        except ConfigError:
            raise
        except ValueError as error:
            raise ConfigError(str(error)) from None
        if self.model_dir:
            try:
                storage.check_path(self.model_dir)
                storage.check_object_names(
                    self.model_dir, run_files.longest_names(self.resolved_checkpoint_format))
            except ValueError as error:
                raise ConfigError(str(error)) from None
        else:
            self.model_dir = os.path.join(
                "runs", f"{self.model}{self.resolved_depth or ''}_{self.dataset}")
        return self

    def _check(self):
        if not isinstance(self.model_kwargs, dict):
            raise ValueError(f"model_kwargs={self.model_kwargs!r} is not valid; expected a "
                             f"dict of builder arguments.")
        for name in ("depth", "dataset", "num_classes", "input_shape", "seed"):
            if name in self.model_kwargs:
                raise ValueError(f"model_kwargs sets {name!r}, which the trainer sets (from "
                                 f"--{name} or the data); remove it from model_kwargs.")
        for name in ("include_preprocessing", "normalization"):
            if name in self.model_kwargs:
                raise ValueError(f"model_kwargs sets {name!r}, which the trainer sets (the "
                                 f"model always normalises its inputs; choose the mode with "
                                 f"--normalization); remove it from model_kwargs.")
        if "weights" in self.model_kwargs:
            raise ValueError("model_kwargs sets 'weights'; the trainer starts from the "
                             "builder's initialisation with the run's own input statistics "
                             "(to fine-tune a trained model, see the README's Transfer "
                             "learning); remove it from model_kwargs.")
        for name, value in (("include_top", True), ("pooling", None)):
            if self.model_kwargs.get(name, value) != value:
                raise ValueError(f"model_kwargs sets {name}={self.model_kwargs[name]!r}; the "
                                 f"trainer trains classifiers (include_top=True, no pooling).")
        for field in dataclasses.fields(self):  # the settings with a list of choices
            value = getattr(self, field.name)
            if field.metadata.get("choices") and (value is not None or field.default is not None):
                _checks.check_choice(field.name, value, field.metadata["choices"])
        if not isinstance(self.model_kwargs.get("shortcut", ""), str):
            raise ValueError(f"model_kwargs sets shortcut={self.model_kwargs['shortcut']!r}; a "
                             f"run's settings are JSON: give its name and arguments (e.g. "
                             f"shortcut='exclusive_gating', gate_bias_init=-6.0).")
        registry.builder_of(self.model)
        for name in ("batch_size", "epochs", "train_steps", "stop_at_step", "steps_per_epoch",
                     "train_examples", "test_examples", "steps_per_execution"):
            value = getattr(self, name)
            if value is not None:
                _checks.check_positive_int(name, value)
        _checks.check_positive_int("keep_checkpoints", self.keep_checkpoints)
        if self.checkpoint_format == "orbax" and keras.backend.backend() != "jax":
            raise ValueError(f"checkpoint_format='orbax' is not valid on the "
                             f"{keras.backend.backend()} backend; Orbax checkpoints are the JAX "
                             f"route's (--backend=jax), TensorFlow writes h5.")
        if self.checkpoint_format == "orbax" and not orbax_checkpoints.available():
            raise ValueError("checkpoint_format='orbax' needs orbax-checkpoint, which is not "
                             "installed: pip install orbax-checkpoint (or keras-identity[jax]).")
        for name, backend, why in _BACKEND_SETTINGS:
            if getattr(self, name) is not None:
                _checks.check_positive_int(name, getattr(self, name), minimum=0)
                if keras.backend.backend() != backend:
                    raise ValueError(f"{name} is not valid on the {keras.backend.backend()} "
                                     f"backend; {why}.")
        preemption.parse_checkpoint_every(self.checkpoint_every)
        if self.stop_signal is not None:
            preemption.signal_number(self.stop_signal)
        if self.warmup_steps is not None:
            _checks.check_positive_int("warmup_steps", self.warmup_steps, minimum=0)
        if self.learning_rate is not None:
            _checks.check_range("learning_rate", self.learning_rate, 0.0, low_inclusive=False)
        if self.momentum is not None:
            _checks.check_range("momentum", self.momentum, 0.0, 1.0, high_inclusive=False)
        if self.weight_decay is not None:
            _checks.check_range("weight_decay", self.weight_decay, 0.0)
        if self.lr_decay is not None:
            _checks.check_range("lr_decay", self.lr_decay, 0.0, 1.0, low_inclusive=False)
        _checks.check_positive_int("seed", self.seed, minimum=0)
        if self.jit_compile and self.deterministic and keras.backend.backend() == "tensorflow":
            raise ValueError("jit_compile and deterministic are exclusive: Keras runs "
                             "without XLA when TensorFlow op determinism is enabled.")
        if self.epochs is not None and self.train_steps is not None:
            raise ValueError("epochs and train_steps are exclusive; give one of them.")
        # The builder's own checks, without building.
        registry.check_model_kwargs(self.model, self.depth, self.dataset, **self.model_kwargs)
        if self.lr_decay is not None:
            self.check_exponential_schedule("lr_decay")

    @property
    def resolved_checkpoint_format(self):
        """``--checkpoint_format``, or its default: orbax on JAX where
        orbax-checkpoint is installed, else h5."""
        if self.checkpoint_format is not None:
            return self.checkpoint_format
        return ("orbax" if keras.backend.backend() == "jax" and orbax_checkpoints.available()
                else "h5")

    @property
    def family(self):
        """The builder of ``model`` (``"resnet"``, ``"highway_net"``, ...)."""
        return registry.builder_of(self.model).name

    @property
    def resolved_depth(self):
        return registry.resolve(self.model, self.depth, self.dataset)[1]["depth"]

    def builder_arguments(self):
        """The builder's arguments this configuration sets (defaults left out)."""
        builder, arguments = registry.resolve(self.model, self.depth, self.dataset,
                                              **self.model_kwargs)
        return registry.non_default_arguments(builder, arguments)

    def identity_arguments(self):
        """:meth:`builder_arguments` as a run's identity records them: a
        bottleneck's stride on the 3x3 (``stride_on_1x1`` resolved False, the
        ImageNet pre-activation default) is recorded, on the first 1x1 (True,
        the only default before) left out, so that a run started under the
        earlier default never resumes on the other architecture."""
        builder, given = registry.resolve(self.model, self.depth, self.dataset,
                                          **self.model_kwargs)
        arguments = registry.non_default_arguments(builder, given)
        if "stride_on_1x1" not in builder.defaults:
            return arguments
        stride = given.get("stride_on_1x1")
        if stride is None:
            unit = ("full_preactivation" if builder.name == "preact_resnet"
                    else given.get("unit", builder.defaults["unit"]))
            stride = default_stride_on_1x1(given.get("dataset", self.dataset), unit)
        arguments.pop("stride_on_1x1", None)
        return arguments if stride else {**arguments, "stride_on_1x1": False}

    @property
    def resolved_recipe(self):
        return self.recipe or recipes_lib.default_recipe(
            self.family, self.dataset, self.builder_arguments().get("architecture"))

    def check_exponential_schedule(self, name):
        """Raises ``ValueError`` (naming ``name``, a decay factor's flag)
        unless the recipe decays its learning rate exponentially."""
        recipe = self.resolved_recipe
        schedule = recipes_lib.get_recipe(recipe).schedule
        if schedule != "exponential":
            raise ValueError(f"{name} applies to recipes with an exponential schedule "
                             f"(highway_mnist); recipe {recipe!r} has a {schedule} schedule.")

    def get_recipe(self):
        """The recipe this configuration trains with (``lr_decay`` applied)."""
        recipe = recipes_lib.get_recipe(self.resolved_recipe)
        if self.lr_decay is not None:
            recipe = dataclasses.replace(recipe, exponential_decay=self.lr_decay)
        return recipe

    def momentum_and_decay(self, recipe):
        """SGD momentum and weight decay: the flags, else ``recipe``'s."""
        return (recipe.momentum if self.momentum is None else self.momentum,
                recipe.weight_decay if self.weight_decay is None else self.weight_decay)


