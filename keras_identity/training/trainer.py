"""One training loop for every model, strategy and precision.

:func:`train` is what ``keras-identity-train`` runs; the pieces
(:func:`build_model`, :func:`compile_model`, ...) are public so that the
tuner and notebooks share them.
"""

import dataclasses
import json
import math
import os
import shutil
import tempfile
import time
import warnings
import zlib

import keras

from keras_identity import _checks
from keras_identity import storage
from keras_identity.data import arrays
from keras_identity.data import datasets as datasets_lib
from keras_identity.data import facts
from keras_identity.data import normalization as normalization_lib
from keras_identity.models import registry
from keras_identity.training import callbacks as callbacks_lib
from keras_identity.training import checkpoints
from keras_identity.training import cpu_threads
from keras_identity.training import orbax_checkpoints
from keras_identity.training import preemption
from keras_identity.training import recipes as recipes_lib
from keras_identity.training import run_lock
from keras_identity.training import strategies
from keras_identity.training.optimizers import MomentumSGD
from keras_identity import _cpu_kernels as cpu_kernels

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
CHECKPOINT_FORMATS = ("orbax", "h5")


# The inputs of a run (run_identity) and its length, in its model_dir.
RUN_FILE = "run.json"


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
    dataset: str = setting("mnist", "Dataset.", datasets_lib.DATASETS)
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
        return _without_defaults(builder, arguments)

    @property
    def resolved_recipe(self):
        return self.recipe or recipes_lib.default_recipe(
            self.family, self.dataset, self.builder_arguments().get("architecture"))

    def check_exponential_schedule(self, name):
        """Raises ``ValueError`` (naming ``name``, a decay factor's flag)
        unless the recipe decays its learning rate exponentially."""
        recipe = self.resolved_recipe
        if recipes_lib.get_recipe(recipe).schedule != "exponential":
            raise ValueError(f"{name} applies to recipes with an exponential schedule "
                             f"(highway_mnist); recipe {recipe!r} decays in steps.")

    def get_recipe(self):
        """The recipe this configuration trains with (``lr_decay`` applied)."""
        recipe = recipes_lib.get_recipe(self.resolved_recipe)
        if self.lr_decay is not None:
            recipe = dataclasses.replace(recipe, exponential_decay=self.lr_decay)
        return recipe


def _without_defaults(builder, arguments):
    defaults = builder.defaults
    return {k: v for k, v in arguments.items()
            if k not in defaults or v != defaults[k] or k in ("depth", "dataset")}


def build_model(config, data, seed=None, normalization=None):
    """Builds ``config.model`` for ``data`` (its image shape and classes),
    passing ``config.model_kwargs`` through to the builder.

    With ``normalization`` (a :class:`Normalization` with the training
    set's statistics) the model includes it as its first layer and takes
    pixel values: the ``.keras`` file a run saves is self-contained.
    """
    builder, kwargs = registry.resolve(
        config.model, config.depth, config.dataset, num_classes=data.num_classes,
        input_shape=tuple(data.image_shape), **config.model_kwargs)
    if "seed" in builder.parameters:
        kwargs["seed"] = seed
    if normalization is not None:
        kwargs.update(include_preprocessing=True, normalization=normalization)
    return builder.function(**kwargs)


def _momentum_and_decay(recipe, config):
    """SGD momentum and weight decay: the flags, else the recipe's."""
    return (recipe.momentum if config.momentum is None else config.momentum,
            recipe.weight_decay if config.weight_decay is None else config.weight_decay)


def make_optimizer(recipe, schedule, config):
    momentum, decay = _momentum_and_decay(recipe, config)
    return MomentumSGD(recipes_lib.make_learning_rate(recipe, schedule), momentum=momentum,
                       nesterov=recipe.nesterov, coupled_weight_decay=decay)


# Training steps per call of the compiled function on a TPU (host round trips
# dominate small steps there); elsewhere one.
TPU_STEPS_PER_EXECUTION = 32
# On JAX, Keras's fit loop costs about as much per call as highway-50's whole
# MNIST step (it re-tracks the training state on the model and runs the
# callbacks), so a call runs several steps: the default command trains 1.6-2.5x
# faster (docs/performance.md, "The JAX route's step").
JAX_STEPS_PER_EXECUTION = 16


def resolve_steps_per_execution(requested, schedule, tpu, backend=None, start_step=0):
    """Steps per compiled call: ``requested``, or 32 on a TPU, 16 on JAX and
    1 elsewhere (``backend``: Keras's, by default), as a divisor of the epoch,
    of the run's length and of ``start_step``, the step it resumes from (a
    call never crosses a checkpoint or the end of training).

    Raises:
        ValueError: a requested value that does not divide them.
    """
    total, per_epoch = schedule.total_steps, schedule.steps_per_epoch
    if requested is not None:
        if per_epoch % requested or total % requested:
            raise ValueError(f"steps_per_execution={requested} is not valid: it must divide "
                             f"steps_per_epoch={per_epoch} and the run's {total} steps.")
        if start_step % requested:
            raise ValueError(f"steps_per_execution={requested} is not valid for this run: "
                             f"it resumes from step {start_step}, which it does not divide; "
                             f"give a divisor of {math.gcd(start_step, requested)}, or leave "
                             f"the flag out.")
        return requested
    if tpu:
        wanted = TPU_STEPS_PER_EXECUTION
    elif (backend or keras.backend.backend()) == "jax":
        wanted = JAX_STEPS_PER_EXECUTION
    else:
        wanted = 1
    return max(d for d in range(1, wanted + 1)
               if per_epoch % d == 0 and total % d == 0 and start_step % d == 0)


def steps_per_execution_note(resolved, requested, schedule, tpu):
    """A line saying why a TPU run makes fewer than 32 steps per compiled
    call (no larger divisor of the epoch and the run), or ``None``."""
    if not tpu or requested is not None or resolved >= TPU_STEPS_PER_EXECUTION:
        return None
    return (f"note: {resolved} step{'s' if resolved > 1 else ''} per execution on the TPU, "
            f"not {TPU_STEPS_PER_EXECUTION}: no larger divisor of the epoch "
            f"({schedule.steps_per_epoch} steps) and the run ({schedule.total_steps} steps) "
            f"is at most {TPU_STEPS_PER_EXECUTION}; a --steps_per_epoch and a run length "
            f"(--train_steps or --epochs) divisible by {TPU_STEPS_PER_EXECUTION} save host "
            f"round trips")


def check_distributed_step(config, strategy, steps_per_execution):
    """Refuses what Keras 3's TensorFlow trainer cannot run on several
    replicas of a ``MirroredStrategy``/``MultiWorkerMirroredStrategy``: it
    compiles ``strategy.run`` inside the XLA function (keras-team/keras#18145)
    and loops over distributed iterators in a ``tf.while_loop`` that fails
    with "You must feed a value for placeholder tensor" (keras-team/keras#19246;
    both reproduced with Keras 3.15 on two logical CPU devices).  A TPU
    compiles its step itself, and JAX has neither problem."""
    if (keras.backend.backend() != "tensorflow" or strategies.is_tpu(strategy)
            or strategy.num_replicas_in_sync < 2):
        return
    where = strategies.describe(strategy)
    if config.jit_compile:
        raise ValueError(f"jit_compile=True is not valid with {where} on TensorFlow: Keras "
                         f"compiles the whole distributed step, which tf.distribute cannot "
                         f"run (keras-team/keras#18145); drop --jit_compile, or use "
                         f"--backend=jax.")
    if steps_per_execution > 1:
        raise ValueError(f"steps_per_execution={steps_per_execution} is not valid with {where} "
                         f"on TensorFlow (Keras's multi-step loop fails on distributed "
                         f"iterators, keras-team/keras#19246); use 1, or --backend=jax.")


def compile_model(model, optimizer, jit_compile=False, steps_per_execution=1):
    """Compiles ``model`` for training and creates its optimizer's variables.

    Call it inside the strategy's scope. Building the optimizer here, rather
    than in the first training step, matters for start-up: a ``tf.function``
    whose first trace creates variables (Keras creates the momentum slots
    there) is traced a second time, which doubles the tracing cost of the
    first step (ResNet-164: about 7 s on a 2-core CPU).
    """
    # JAX always compiles the step with XLA (without, Keras runs it op by op).
    jit_compile = bool(jit_compile) or keras.backend.backend() == "jax"
    # Weighted metrics: the zero-weight examples that pad the last test batch
    # on TPUs and multiple replicas count neither in the error nor in the
    # cross-entropy (Keras's loss divides by the padded batch size).
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(),
                  weighted_metrics=[
                      keras.metrics.SparseCategoricalAccuracy(name="accuracy"),
                      keras.metrics.SparseCategoricalCrossentropy(name="cross_entropy")],
                  jit_compile=jit_compile, steps_per_execution=steps_per_execution)
    build_optimizer(model)
    return model


def build_optimizer(model):
    """Creates ``model.optimizer``'s variables for the model's trainable weights
    now, so that the first ``fit`` step is traced once instead of twice."""
    if model.optimizer is not None and not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    return model


def load_data(config):
    """The run's data; a split without images is refused (a run would report
    a test error of NaN), and so is ``--input_workers`` for data in memory."""
    # The JAX route reads tensorflow_datasets through its random-access data
    # source (no TensorFlow); the TensorFlow route through tf.data.
    data = datasets_lib.load_dataset(config.dataset, config.data_dir,
                                     random_access=keras.backend.backend() == "jax")
    for split, count in (("training", data.num_train), ("test", data.num_test)):
        if not count:
            raise ValueError(f"data_dir={config.data_dir or data.source!r}: the {split} set of "
                             f"{config.dataset} has no images; expected at least one.")
    if config.input_workers is not None:
        arrays.resolve_worker_processes(config.input_workers, data, name="input_workers")
    if config.train_examples or config.test_examples:
        data = data.subset(config.train_examples, config.test_examples, seed=config.seed)
    return data


def make_normalization(mode, data):
    if mode == "per_channel" and data.name == "imagenet":
        return normalization_lib.Normalization.imagenet()
    if data.in_memory:
        return normalization_lib.Normalization.from_images(mode, data.x_train)
    if mode != "scale":
        raise ValueError(f"normalization={mode!r} needs its statistics from the training "
                         f"images, which {data.name} streams from files; use 'per_channel' "
                         f"(ImageNet: its published statistics) or 'scale'.")
    return normalization_lib.Normalization(mode)


def run_identity(config, data, recipe, schedule, normalization, augmentation):
    """Everything that changes what a training step computes, by flag name.

    A ``model_dir`` resumes only with the same identity (:func:`prepare`);
    only the run's length (``--epochs``, ``--train_steps``) may change.
    """
    momentum, decay = _momentum_and_decay(recipe, config)
    return {
        "model": config.model, "model_kwargs": config.builder_arguments(),
        "dataset": config.dataset, "data_dir": data.fingerprint,
        "train_examples": config.train_examples, "test_examples": config.test_examples,
        "recipe": recipe.name, "batch_size": schedule.batch_size,
        "learning_rate": schedule.learning_rate, "momentum": momentum,
        "weight_decay": decay, "warmup_steps": config.warmup_steps,
        "steps_per_epoch": schedule.steps_per_epoch, "normalization": normalization.mode,
        "augmentation": augmentation, "precision": config.precision, "seed": config.seed,
        "deterministic": config.deterministic, "eval_crop": config.eval_crop,
        "lr_decay": config.lr_decay}


def differences(before, now):
    """``["key: old != new", ...]`` for the keys whose values differ, as JSON
    stores them (tuples as lists); the builder arguments of ``model_kwargs``
    are compared one by one."""
    before, now = json.loads(json.dumps(before)), json.loads(json.dumps(now))
    lines = []
    for key in sorted(set(before) | set(now)):
        old, new = before.get(key), now.get(key)
        if key == "model_kwargs" and isinstance(old, dict) and isinstance(new, dict):
            lines += differences(old, new)
        elif old != new:
            lines.append(f"{key}: {old!r} != {new!r}")
    return lines


def _read_run_file(path):
    """``run.json``'s contents, or the reason it cannot be used."""
    try:
        saved = storage.read_json(path)
        if not isinstance(saved, dict) or not isinstance(saved.get("identity"), dict):
            raise KeyError("identity")
        return saved, None
    except (FileNotFoundError, NotADirectoryError):
        return None, "is missing"
    except storage.StorageError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as error:
        return None, f"is not readable ({type(error).__name__})"


def check_identity(model_dir, identity, state):
    """Refuses to resume a run whose flags differ from ``identity`` (one line
    naming the flags); returns ``run.json``'s contents (``None`` when it is
    missing or unreadable).

    The flags a run was started with are in ``run.json``, and each checkpoint
    (``state``, the latest) keeps them too: both are compared, so a
    checkpoint copied in from a run with other flags is refused even where
    ``run.json`` is this run's, and a missing or unreadable ``run.json`` is
    replaced by the checkpoint's record.  Checkpoints with no record of
    their flags are refused, never trained over.
    """
    path = storage.join(model_dir, RUN_FILE)
    checkpoint = None if state is None else storage.join(model_dir, "checkpoints",
                                                         state["weights"])
    saved, problem = _read_run_file(path)
    if saved is not None:
        before, where = saved["identity"], "flags"
    elif state is None:
        if problem == "is missing":
            return None
        raise ValueError(f"{path} {problem} and the run has no checkpoint; delete it, or use a "
                         f"new --model_dir.")
    elif isinstance(state.get("identity"), dict):
        before = state["identity"]
        where = f"flags (as its checkpoint of step {state['step']} records them; {RUN_FILE} " \
                f"{problem})"
        warnings.warn(f"{path} {problem}; the run's flags are compared with the record in its "
                      f"checkpoint of step {state['step']} instead.", stacklevel=2)
    else:
        raise ValueError(f"{path} {problem} and the checkpoints in {model_dir}/checkpoints "
                         f"keep no record of the flags they were trained with; nothing was "
                         f"changed there: restore {RUN_FILE}, or use a new --model_dir.")
    diffs = differences(before, identity)
    if diffs:
        raise ValueError(f"model_dir={model_dir!r} holds a run started with other {where} "
                         f"({'; '.join(diffs)}); resume it with its own flags (only "
                         f"--epochs/--train_steps may grow) or use a new --model_dir.")
    if state is not None:
        if not isinstance(state.get("identity"), dict):
            raise ValueError(f"the checkpoint {checkpoint} keeps no record of the flags it was "
                             f"trained with, so it cannot be told from another run's; nothing "
                             f"was changed: move it (and checkpoints/state.json) away, or use a "
                             f"new --model_dir.")
        diffs = differences(state["identity"], identity)
        if diffs:
            raise ValueError(f"the checkpoint {checkpoint} was trained with other flags than "
                             f"this run's ({'; '.join(diffs)}): it is not this run's; nothing "
                             f"was changed: move it (and checkpoints/state.json) away, or use a "
                             f"new --model_dir.")
    return saved


def set_op_determinism(enabled):
    """Turns TensorFlow op determinism on or off (it is process-wide, and the
    public API can only turn it on).  The JAX route uses no TensorFlow op
    (XLA's CPU and TPU programs are deterministic; on GPUs see
    ``XLA_FLAGS=--xla_gpu_deterministic_ops=true``)."""
    if keras.backend.backend() != "tensorflow":
        return
    import tensorflow as tf

    if enabled:
        tf.config.experimental.enable_op_determinism()
        return
    from tensorflow.python.framework import config as tf_config

    if tf_config.is_op_determinism_enabled():
        tf_config.disable_op_determinism()


def check_global_batch(schedule, strategy):
    """The global batch must split evenly over the replicas (devices)."""
    if schedule.batch_size % strategy.num_replicas_in_sync:
        raise ValueError(f"batch_size={schedule.batch_size} is not valid with "
                         f"{strategy.num_replicas_in_sync} replicas; expected a multiple.")


def check_stop_at_step(stop_at_step, schedule):
    """A run stops at a checkpoint: ``stop_at_step`` must end an epoch."""
    if stop_at_step is not None and stop_at_step % schedule.steps_per_epoch:
        raise ValueError(f"stop_at_step={stop_at_step} is not valid; expected a multiple of "
                         f"the epoch ({schedule.steps_per_epoch} steps, --steps_per_epoch), "
                         f"so that the run stops at a checkpoint.")


def stop_step(config, schedule):
    """The step this invocation trains to: ``stop_at_step`` within the run's length."""
    return min(schedule.total_steps, config.stop_at_step or schedule.total_steps)


def setup_precision_and_seed(config):
    """The run's Keras dtype policy and seeds (every backend's)."""
    keras.config.set_dtype_policy(config.precision)
    keras.utils.set_random_seed(config.seed)
    set_op_determinism(config.deterministic)


def input_streams(strategy, data, *, batch_size, normalization, augmentation, seed,
                  start_step=0, split="test", eval_crop=224, training=True, evaluation=True,
                  worker_processes=None):
    """The training stream and the evaluation batches of a run (models that
    take pixel values), for the Keras backend:

    * TensorFlow: tf.data pipelines (:mod:`keras_identity.data.pipeline`),
      distributed by the ``tf.distribute`` strategy;
    * JAX: NumPy batches in ``keras.utils.PyDataset`` objects
      (:mod:`keras_identity.data.arrays`), each process reading its rows of
      every global batch, image files decoded in ``worker_processes``
      (``--input_workers``; None: see :class:`~keras_identity.data.TrainBatches`).

    Returns ``(train, evaluation)``; ``training`` or ``evaluation`` False
    leaves that one None.
    """
    eval_resize = {224: 256, 320: 320}.get(eval_crop, 256)
    padded = strategies.is_tpu(strategy) or strategy.num_replicas_in_sync > 1
    train = evaluate = None
    if isinstance(strategy, strategies.KerasDistribution):
        processes = dict(process_index=strategy.process_index,
                         process_count=strategy.process_count,
                         worker_processes=worker_processes)
        if training:
            train = arrays.TrainBatches(
                data, batch_size=batch_size, normalization=normalization,
                augmentation=augmentation, seed=seed, start_step=start_step, raw_pixels=True,
                **processes)
        if evaluation:
            evaluate = arrays.EvalBatches(
                data, batch_size=batch_size, normalization=normalization, split=split,
                pad_to_batch=padded, eval_resize=eval_resize, eval_crop=eval_crop,
                raw_pixels=True, **processes)
        return train, evaluate
    from keras_identity.data import pipeline

    def make_train(input_context=None):
        return pipeline.train_dataset(
            data, batch_size=batch_size, normalization=normalization,
            augmentation=augmentation, seed=seed, start_step=start_step,
            input_context=input_context, raw_pixels=True)

    def make_eval(input_context=None):
        return pipeline.eval_dataset(
            data, batch_size=batch_size, normalization=normalization, split=split,
            pad_to_batch=padded, eval_resize=eval_resize, eval_crop=eval_crop,
            input_context=input_context, raw_pixels=True)

    if training:
        train = pipeline.distribute(strategy, make_train)
    if evaluation:
        evaluate = pipeline.distribute(strategy, make_eval)
    return train, evaluate


@dataclasses.dataclass
class Run:
    """A configuration resolved against a machine and a dataset."""

    config: TrainConfig
    strategy: object
    chief: bool
    work_dir: str
    data: object
    recipe: object
    schedule: object
    normalization: object
    augmentation: str
    checkpointer: object
    state: dict
    identity: dict = None
    extended_from: int = None
    previous_backend: str = None   # the backend that trained the run so far (run.json's)
    threads: str = None     # TensorFlow's CPU thread pools, a line (cpu_threads.configure)
    steps_per_execution: int = 1
    lock: object = None     # the chief's run_lock.RunLock, held until training ends

    @property
    def scratch(self):
        """A JAX process other than the first: it saves into a scratch folder
        of its own (``work_dir``, removed at the end), never into model_dir."""
        return not self.chief and isinstance(self.strategy, strategies.KerasDistribution)


def make_checkpointer(config, identity):
    """The run's checkpointer, of ``config.resolved_checkpoint_format``."""
    directory = storage.join(config.model_dir, "checkpoints")
    if config.resolved_checkpoint_format == "orbax":
        return orbax_checkpoints.OrbaxCheckpointer(directory, keep=config.keep_checkpoints,
                                                   identity=identity)
    return checkpoints.Checkpointer(directory, keep=config.keep_checkpoints, identity=identity)


def prepare(config, strategy=None):
    """Validates ``config``, picks the strategy (unless one is given), loads the
    data and resolves the recipe.  Every problem found here raises
    :class:`ConfigError`.  The chief locks ``model_dir`` (a second training
    there is refused); the caller releases ``Run.lock``."""
    lock = None
    try:
        config.validate()
        threads = None
        if keras.backend.backend() == "tensorflow":  # before TensorFlow's runtime starts
            threads = cpu_threads.configure(
                config.intra_op_threads, config.batch_size or config.get_recipe().batch_size,
                accelerator=strategy is not None or strategies.accelerators_present(
                    config.strategy, config.tpu))
        setup_precision_and_seed(config)
        if strategy is None:
            strategy = strategies.get_strategy(config.strategy, config.tpu)
        chief = strategies.is_chief(strategy)
        # Every worker or process saves, as the others do: TensorFlow's other
        # workers into their own folders of model_dir, JAX's other processes
        # into a local scratch folder removed at the end (on JAX, saving passes
        # values through jax.device_put, whose check that every process holds
        # the same value is a collective: process 0 cannot save alone).
        # model_dir is process 0's alone.
        scratch = not chief and isinstance(strategy, strategies.KerasDistribution)
        if chief:
            work_dir = config.model_dir
        elif scratch:
            work_dir = None  # the scratch folder, made once nothing can fail
        else:
            work_dir = storage.join(config.model_dir,
                                    f".worker{strategy.cluster_resolver.task_id}")
        data = load_data(config)
        recipe = config.get_recipe()
        schedule = recipes_lib.resolve(
            recipe, num_train=data.num_train, batch_size=config.batch_size,
            depth=config.resolved_depth, learning_rate=config.learning_rate,
            epochs=config.epochs, train_steps=config.train_steps,
            steps_per_epoch=config.steps_per_epoch, warmup_steps=config.warmup_steps)
        check_global_batch(schedule, strategy)
        check_stop_at_step(config.stop_at_step, schedule)
        if data.in_memory and schedule.batch_size > data.num_train:
            raise ValueError(f"batch_size={schedule.batch_size} is not valid: the training set "
                             f"has {data.num_train:,} images; expected a global batch no "
                             f"larger than the training set.")
        normalization = make_normalization(config.normalization or recipe.normalization, data)
        augmentation = config.augmentation or recipe.augmentation
        steps_per_execution = resolve_steps_per_execution(
            config.steps_per_execution, schedule, strategies.is_tpu(strategy))
        check_distributed_step(config, strategy, steps_per_execution)
        identity = run_identity(config, data, recipe, schedule, normalization, augmentation)
        checkpointer = make_checkpointer(config, identity)
        strategies.check_same_in_processes(
            strategy, zlib.crc32(storage.normalize(config.model_dir).encode()),
            "--model_dir (a digest of the path)")
        # Process 0 writes model_dir; every process writes its part of an
        # Orbax checkpoint.  A missing bucket or no permission: said before
        # anything is read.
        writes = not scratch or checkpointer.collective
        if writes:
            storage.check_writable(config.model_dir)
        state = checkpointer.latest()
        saved = check_identity(config.model_dir, identity, state) or {}
        length = saved.get("length", {})
        if writes and storage.isdir(checkpointer.directory) \
                and not storage.is_remote(checkpointer.directory):
            storage.check_writable(checkpointer.directory, "the checkpoint folder")
        if chief:
            lock = run_lock.RunLock(config.model_dir).acquire()
        strategies.check_same_in_processes(
            strategy, -1 if state is None else state["step"],
            f"the latest checkpoint's step in {checkpointer.directory} (-1: none)")
        strategies.check_same_in_processes(
            strategy, zlib.crc32(json.dumps([identity, schedule.total_steps],
                                            sort_keys=True).encode()),
            "the run's inputs (a digest of the flags, the data and the run's length)")
        if state is not None:  # a call never crosses the step it resumes from either
            steps_per_execution = resolve_steps_per_execution(
                config.steps_per_execution, schedule, strategies.is_tpu(strategy),
                start_step=state["step"])
        extended_from = None
        if state is not None and schedule.total_steps < state["step"]:
            raise ValueError(f"the run in model_dir={config.model_dir!r} is at step "
                             f"{state['step']}; this length ({schedule.total_steps} steps) ends "
                             f"before it. Give --epochs/--train_steps of at least the run's "
                             f"length, or use a new --model_dir.")
        if length and length.get("total_steps") not in (None, schedule.total_steps):
            extended_from = length["total_steps"]
    except BaseException as error:
        if lock is not None:
            lock.release()
        if isinstance(error, ValueError) and not isinstance(error, ConfigError):
            raise ConfigError(str(error)) from None
        if isinstance(error, storage.StorageError):
            raise ConfigError(error.strerror) from None
        raise
    if work_dir is None:
        work_dir = tempfile.mkdtemp(prefix=f"keras_identity_process{strategy.process_index}_")
    storage.makedirs(work_dir)
    return Run(config=config, strategy=strategy, chief=chief, work_dir=work_dir, data=data,
               recipe=recipe, schedule=schedule, normalization=normalization,
               augmentation=augmentation, checkpointer=checkpointer, state=state,
               identity=identity, extended_from=extended_from,
               previous_backend=saved.get("backend") if state is not None else None,
               steps_per_execution=steps_per_execution, lock=lock, threads=threads)


def train(config, print_fn=print, strategy=None):
    """Trains ``config.model``; returns a dict with the final metrics and paths.

    ``strategy`` overrides ``config.strategy`` with a strategy already created
    (e.g. a notebook's ``TPUStrategy``, which must be initialised only once).

    Raises:
        ConfigError: bad configuration or missing data (one-line message).
        TrainingDiverged: the loss became NaN/inf (names the step).
    """
    started = time.time()
    run = prepare(config, strategy)
    try:
        return _train(run, print_fn, started)
    finally:
        run.checkpointer.close()  # a checkpoint still being written is waited for
        if run.lock is not None:
            run.lock.release()
        if run.scratch:
            shutil.rmtree(run.work_dir, ignore_errors=True)


def _fit_and_save(model, make_train, eval_ds, callbacks, run, start_step, end_step, print_fn,
                  metrics=None):
    """Trains from ``start_step`` to ``end_step`` (:func:`preemption.fit_resumable`:
    checkpoints inside epochs, stop signals) and saves ``model.keras``.
    ``metrics``: the metric sums of the checkpoint resumed inside an epoch."""
    schedule, work_dir = run.schedule, run.work_dir
    recorder = next(c for c in callbacks if isinstance(c, callbacks_lib.RunRecorder))
    try:
        preemption.fit_resumable(
            model, make_train=make_train, validation_data=eval_ds, callbacks=callbacks,
            strategy=run.strategy, steps_per_epoch=schedule.steps_per_epoch,
            start_step=start_step, end_step=end_step, checkpointer=recorder.checkpointer,
            history=lambda: recorder.history, state=recorder.epoch_progress,
            verbose=run.config.verbose if run.chief else 0, metrics=metrics,
            print_fn=print_fn, stop_directory=run.checkpointer.directory)
        if start_step >= end_step and end_step < schedule.total_steps:
            print_fn(f"the run is already at step {start_step:,} (--stop_at_step={end_step})")
        elif start_step >= end_step:
            print_fn(f"the run is already complete ({start_step} steps)")
        save_model(model, storage.join(work_dir, "model.keras"))
    except OSError as error:  # the history, curves, TensorBoard or model files
        if not (checkpoints.out_of_space(error) or isinstance(error, storage.StorageError)):
            raise
        fix = "free space" if checkpoints.out_of_space(error) else "fix the cause"
        raise checkpoints.WriteError(
            f"cannot write into {work_dir} ({error.strerror or error}); the checkpoint of "
            f"step {run.checkpointer.latest_step()} is intact: {fix} and run the same "
            f"command to resume") from None
    except Exception as error:  # an image that stops the input stream, named in one line
        data_error = datasets_lib.as_data_error(error)
        if data_error is None:
            raise
        raise ConfigError(str(data_error)) from None


def save_model(model, path):
    """``model.save(path)`` whole: locally under a temporary name renamed
    when written; into a bucket from a local file once it is written."""
    if storage.is_remote(path):
        with storage.staged(path) as local:
            model.save(local)
        return
    partial = path[:-len(".keras")] + ".partial.keras"
    model.save(partial)
    os.replace(partial, path)


def _train(run, print_fn, started):
    config = run.config
    strategy, data, recipe, schedule = run.strategy, run.data, run.recipe, run.schedule
    chief, work_dir, checkpointer = run.chief, run.work_dir, run.checkpointer
    normalization, augmentation, model_dir = run.normalization, run.augmentation, config.model_dir
    with strategy.scope():
        try:
            model = build_model(config, data, seed=config.seed, normalization=normalization)
        except ValueError as error:
            raise ConfigError(str(error)) from None
        # TPUStrategy compiles every step with XLA itself (Keras's own
        # jit_compile would wrap the distributed call in a second one).
        jit_compile = config.jit_compile and not (
            keras.backend.backend() == "tensorflow" and strategies.is_tpu(strategy))
        compile_model(model, make_optimizer(recipe, schedule, config), jit_compile,
                      steps_per_execution=run.steps_per_execution)
        try:
            state = checkpointer.restore(model, run.state) if run.state is not None else None
            # A process that had to skip an unreadable checkpoint restored an
            # older one than the others: refused, never trained apart.
            strategies.check_same_in_processes(
                strategy, -1 if state is None else state["step"],
                f"the step of the checkpoint restored from {checkpointer.directory}")
        except (checkpoints.CheckpointError, ValueError) as error:
            raise ConfigError(str(error)) from None
    # Written once the model is built and restored: a configuration the
    # builder refuses leaves no run behind.
    if chief:
        storage.write_json(storage.join(model_dir, "config.json"), dataclasses.asdict(config))
        storage.write_json(storage.join(model_dir, RUN_FILE), {
            "identity": run.identity,
            "length": {"total_steps": schedule.total_steps, "epochs": schedule.epochs},
            "backend": keras.backend.backend()})
        normalization_lib.save_preprocessing(
            storage.join(model_dir, "preprocessing.json"), dataset=config.dataset,
            normalization=normalization, image_shape=data.image_shape,
            class_names=data.class_names,
            eval_resize={224: 256, 320: 320}.get(config.eval_crop)
            if config.dataset == "imagenet" else None)

    start_step = state["step"] if state else 0
    end_step = stop_step(config, schedule)
    if start_step % run.steps_per_execution:
        # An older checkpoint than the latest was restored (the latest could
        # not be read): a call must not cross the step it resumes from.
        model.steps_per_execution = math.gcd(start_step, run.steps_per_execution)
    history = state["history"] if state else []
    params = sum(int(w.numpy().size) for w in model.trainable_weights)
    per_execution = (f", {model.steps_per_execution} steps per execution"
                     if model.steps_per_execution > 1 else "")
    print_fn(f"model {model.name}: {params:,} trainable parameters; data {data.name} from "
             f"{data.source} ({data.num_train:,} train / {data.num_test:,} test images)")
    print_fn(f"recipe {recipe.name}: global batch {schedule.batch_size}, lr "
             f"{schedule.learning_rate:g}, {schedule.total_steps:,} steps "
             f"({schedule.epochs} epochs of {schedule.steps_per_epoch}), "
             + (f"lr x{recipe.exponential_decay:g} per epoch" if recipe.schedule ==
                "exponential" else f"lr drops at {list(schedule.boundaries)}")
             + f", warm-up {schedule.warmup_steps}; "
             f"{strategies.describe(strategy)}, {config.precision}"
             f"{', XLA' if model.jit_compile else ''}{per_execution}, Keras backend "
             f"{keras.backend.backend()}")
    # TensorFlow's CPU kernels run the steps only on its backend (a JAX run may import it).
    kernels = cpu_kernels.describe() if keras.backend.backend() == "tensorflow" else None
    if kernels:
        print_fn(kernels)
    if run.threads:
        print_fn(run.threads)
    if end_step < schedule.total_steps:
        print_fn(f"stopping at step {end_step:,} of {schedule.total_steps:,} (--stop_at_step; "
                 f"the same command with a larger one, or without it, continues the run)")
    note = steps_per_execution_note(run.steps_per_execution, config.steps_per_execution,
                                    schedule, strategies.is_tpu(strategy))
    if note:
        print_fn(note)
    if state:
        print_fn(f"resuming from the checkpoint at step {start_step} "
                 f"({preemption.place(start_step, schedule.steps_per_epoch)}) "
                 f"in {checkpointer.directory}")
        if run.previous_backend not in (None, keras.backend.backend()):
            print_fn(f"the run was trained on the {run.previous_backend} backend until now; it "
                     f"continues on {keras.backend.backend()} (same weights and optimizer "
                     f"state; the order of the examples, the augmentation draws (tf.data on "
                     f"TensorFlow, NumPy on JAX), random masks and rounding differ)")
    if run.extended_from is not None:
        print_fn(f"the run's length changes from {run.extended_from:,} to "
                 f"{schedule.total_steps:,} steps; the learning-rate schedule is that of the "
                 f"new length (drops at {list(schedule.boundaries)})")

    streams = dict(batch_size=schedule.batch_size, normalization=normalization,
                   augmentation=augmentation, seed=config.seed, eval_crop=config.eval_crop,
                   worker_processes=config.input_workers)
    _, eval_ds = input_streams(strategy, data, training=False, **streams)

    def make_train(step):
        return input_streams(strategy, data, start_step=step, evaluation=False, **streams)[0]

    if keras.backend.backend() == "tensorflow":
        from keras_identity.training import multi_worker

        multi_worker.prepare(model, strategy)

    title = f"{model.name} on {data.name} ({recipe.name} recipe)"
    if not (chief or checkpointer.collective):  # saves as process 0 does, into its scratch
        checkpointer = checkpoints.Checkpointer(storage.join(work_dir, "checkpoints"), keep=1,
                                                owns_directory=True)
    recorder = callbacks_lib.RunRecorder(
        checkpointer=checkpointer,
        history=history, global_batch=schedule.batch_size, total_steps=schedule.total_steps,
        steps_per_epoch=schedule.steps_per_epoch,
        writer=callbacks_lib.history_writer(model_dir, title) if chief else None,
        title=title, print_fn=print_fn if chief else (lambda *_: None),
        resumed=state if start_step % schedule.steps_per_epoch else None)
    every_steps, every_seconds = preemption.parse_checkpoint_every(config.checkpoint_every)
    signals = preemption.StopSignals(config.stop_signal)
    callbacks = [callbacks_lib.StopOnNaN(), recorder]
    if end_step % schedule.steps_per_epoch:
        # The run ends inside an epoch (fit's epochs end the others): a batch
        # hook, which keeps Keras on JAX from running the batch callbacks
        # beside the next step.
        callbacks.insert(1, callbacks_lib.StopAtStep(end_step))
    if not run.scratch:
        callbacks += callbacks_lib.tensorboard(storage.join(work_dir, "tensorboard"))
    # Last: a signal during an epoch's last call or its evaluation stops the
    # run once the epoch's checkpoint and logs are written.
    callbacks.append(preemption.InEpochCheckpoints(
        strategy, signals, schedule.steps_per_epoch, every_steps, every_seconds))
    model_path = storage.join(model_dir, "model.keras")
    try:
        with signals:
            _fit_and_save(model, make_train, eval_ds, callbacks, run, start_step, end_step,
                          print_fn, metrics=(state or {}).get("metrics"))
        # Process 0's files are written before any process returns (a process
        # that left early would look dead to the coordination service).
        strategies.barrier(strategy, "keras_identity_training_done")
    finally:
        preemption.close_stream(eval_ds)
        for callback in callbacks:
            if isinstance(callback, callbacks_lib.UploadLogs):
                callback.finish()
    history = recorder.history
    result = {"model_dir": model_dir, "model_path": model_path,
              "steps": int(model.optimizer.iterations.numpy()),
              "test_error": history[-1]["test_error"] if history else None,
              "loss": history[-1]["loss"] if history else None, "history": history,
              "seconds": time.time() - started, "params": params,
              "jit_compile": bool(model.jit_compile)}
    if chief:
        minutes, seconds = divmod(int(result["seconds"]), 60)
        error = result["test_error"]
        print_fn(f"done: test error {100 * error:.2f}% after {result['steps']:,} steps, "
                 f"{minutes}m{seconds:02d}s; model saved to {model_path}"
                 if error is not None else f"done; model saved to {model_path}")
    return result
