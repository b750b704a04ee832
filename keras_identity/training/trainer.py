"""One training loop for every model, strategy and precision.

:func:`prepare` sets a :class:`~keras_identity.training.config.TrainConfig`
up (:mod:`run_setup`: the strategy, data, plan, streams and stop signals) and
adds the run's files into a :class:`Run` (its identity, :mod:`run_files`; the
checkpoint it resumes from; its lock); :func:`train`, what
``keras-identity-train`` runs, builds the model (:mod:`trained_model`), writes
the run's files and fits it, resumably (:mod:`fit_loop`).
"""

import dataclasses
import json
import math
import shutil
import tempfile
import time
import zlib

import keras

from keras_identity import storage
from keras_identity.data import errors as data_errors
from keras_identity.data import normalization as normalization_lib
from keras_identity.training import checkpoints
from keras_identity.training import config as config_lib
from keras_identity.training import cpu_threads
from keras_identity.training import fit_loop
from keras_identity.training import model_card
from keras_identity.training import orbax_checkpoints
from keras_identity.training import preemption
from keras_identity.training import recorders
from keras_identity.training import run_files
from keras_identity.training import run_lock
from keras_identity.training import run_setup
from keras_identity.training import steps
from keras_identity.training import strategies
from keras_identity.training import trained_model
from keras_identity import _cpu_kernels as cpu_kernels


@dataclasses.dataclass
class Run:
    """A configuration resolved against a machine and a dataset."""

    config: config_lib.TrainConfig
    setup: run_setup.RunSetup   # the strategy, data, recipe, plan, streams, signals
    chief: bool
    work_dir: str
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
        return not self.chief and isinstance(self.setup.strategy,
                                             strategies.KerasDistribution)


def make_checkpointer(model_dir, checkpoint_format, keep, identity):
    """The run's checkpointer in ``model_dir``/checkpoints: Orbax or HDF5
    (``checkpoint_format``), keeping ``keep``, recording ``identity``."""
    directory = storage.join(model_dir, "checkpoints")
    if checkpoint_format == "orbax":
        return orbax_checkpoints.OrbaxCheckpointer(directory, keep=keep, identity=identity)
    return checkpoints.Checkpointer(directory, keep=keep, identity=identity)


def prepare(config, strategy=None):
    """Validates ``config``, sets the run up (:func:`run_setup.set_up`; the
    strategy unless one is given), then its directory, identity and
    checkpointer.  Every problem found here raises :class:`ConfigError
    <keras_identity.training.config.ConfigError>`.  The chief locks
    ``model_dir`` (a second training there is refused); the caller releases
    ``Run.lock``."""
    lock = None
    try:
        config.validate()
        threads = None
        if keras.backend.backend() == "tensorflow":  # before TensorFlow's runtime starts
            threads = cpu_threads.configure(
                config.intra_op_threads, config.batch_size or config.get_recipe().batch_size,
                accelerator=strategy is not None or strategies.accelerators_present(
                    config.strategy, config.tpu))
        setup = run_setup.set_up(config, strategy)
        strategy, data, recipe, plan = setup.strategy, setup.data, setup.recipe, setup.plan
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
        steps.check_stop_at_step(config.stop_at_step, plan)
        if data.in_memory and plan.batch_size > data.num_train:
            raise ValueError(f"batch_size={plan.batch_size} is not valid: the training set "
                             f"has {data.num_train:,} images; expected a global batch no "
                             f"larger than the training set.")
        steps_per_execution = steps.resolve_steps_per_execution(
            config.steps_per_execution, plan, strategies.is_tpu(strategy))
        steps.check_distributed_step(config.jit_compile, strategy, steps_per_execution)
        identity = run_files.run_identity(config, data, recipe, plan, setup.normalization,
                                          setup.augmentation)
        checkpointer = make_checkpointer(config.model_dir, config.resolved_checkpoint_format,
                                         config.keep_checkpoints, identity)
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
        saved = run_files.check_identity(config.model_dir, identity, state) or {}
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
            strategy, zlib.crc32(json.dumps([identity, plan.total_steps],
                                            sort_keys=True).encode()),
            "the run's inputs (a digest of the flags, the data and the run's length)")
        if state is not None:  # a call never crosses the step it resumes from either
            steps_per_execution = steps.resolve_steps_per_execution(
                config.steps_per_execution, plan, strategies.is_tpu(strategy),
                start_step=state["step"])
        extended_from = None
        if state is not None and plan.total_steps < state["step"]:
            raise ValueError(f"the run in model_dir={config.model_dir!r} is at step "
                             f"{state['step']}; this length ({plan.total_steps} steps) ends "
                             f"before it. Give --epochs/--train_steps of at least the run's "
                             f"length, or use a new --model_dir.")
        if length and length.get("total_steps") not in (None, plan.total_steps):
            extended_from = length["total_steps"]
    except BaseException as error:
        if lock is not None:
            lock.release()
        if isinstance(error, ValueError) and not isinstance(error, config_lib.ConfigError):
            raise config_lib.ConfigError(str(error)) from None
        if isinstance(error, storage.StorageError):
            raise config_lib.ConfigError(error.strerror) from None
        raise
    if work_dir is None:
        work_dir = tempfile.mkdtemp(prefix=f"keras_identity_process{strategy.process_index}_")
    storage.makedirs(work_dir)
    return Run(config=config, setup=setup, chief=chief, work_dir=work_dir,
               checkpointer=checkpointer, state=state,
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


def _build_and_restore(config, strategy, data, normalization, recipe, plan,
                       steps_per_execution, checkpointer, state):
    """The run's model, built for ``data`` and compiled with its optimizer
    (``recipe``'s, for ``plan``) in ``strategy``'s scope, where their
    variables are laid out, and the checkpoint ``state`` restored into it
    (``None`` for a new run)."""
    with strategy.scope():
        try:
            model = trained_model.build_model(config, data, seed=config.seed,
                                              normalization=normalization)
        except ValueError as error:
            raise config_lib.ConfigError(str(error)) from None
        # TPUStrategy compiles every step with XLA itself (Keras's own
        # jit_compile would wrap the distributed call in a second one).
        jit_compile = config.jit_compile and not (
            keras.backend.backend() == "tensorflow" and strategies.is_tpu(strategy))
        optimizer = trained_model.make_optimizer(recipe, plan,
                                                 *config.momentum_and_decay(recipe))
        trained_model.compile_model(model, optimizer, jit_compile,
                                    steps_per_execution=steps_per_execution)
        try:
            state = checkpointer.restore(model, state) if state is not None else None
            # A process that had to skip an unreadable checkpoint restored an
            # older one than the others: refused, never trained apart.
            strategies.check_same_in_processes(
                strategy, -1 if state is None else state["step"],
                f"the step of the checkpoint restored from {checkpointer.directory}")
        except (checkpoints.CheckpointError, ValueError) as error:
            raise config_lib.ConfigError(str(error)) from None
    return model, state


def _write_run_record(config, data, normalization, identity, plan):
    """The chief's files that describe the run in ``config.model_dir``:
    ``config.json`` (the flags), ``run.json`` (:mod:`run_files`) and
    ``preprocessing.json`` (what a served model's inputs need)."""
    model_dir = config.model_dir
    storage.write_json(storage.join(model_dir, "config.json"), dataclasses.asdict(config))
    run_files.write_run_file(model_dir, identity, plan)
    normalization_lib.save_preprocessing(
        storage.join(model_dir, "preprocessing.json"), dataset=config.dataset,
        normalization=normalization, image_shape=data.image_shape,
        class_names=data.class_names,
        eval_resize={224: 256, 320: 320}.get(config.eval_crop)
        if config.dataset == "imagenet" else None)


def _callbacks(recorder, signals, strategy, plan, end_step, checkpoint_every,
               tensorboard_dir):
    """The run's callbacks, in order (``tensorboard_dir`` None: no TensorBoard logs)."""
    every_steps, every_seconds = preemption.parse_checkpoint_every(checkpoint_every)
    callbacks = [fit_loop.StopOnNaN(), recorder]
    if end_step % plan.steps_per_epoch:
        # The run ends inside an epoch (fit's epochs end the others): a batch
        # hook, which keeps Keras on JAX from running the batch callbacks
        # beside the next step.
        callbacks.insert(1, fit_loop.StopAtStep(end_step))
    if tensorboard_dir is not None:
        callbacks += recorders.tensorboard(tensorboard_dir)
    # Last: a signal during an epoch's last call or its evaluation stops the
    # run once the epoch's checkpoint and logs are written.
    callbacks.append(fit_loop.InEpochCheckpoints(
        strategy, signals, plan.steps_per_epoch, every_steps, every_seconds))
    return callbacks


def _fit_and_save(model, make_train, eval_ds, callbacks, recorder, *, strategy, plan,
                  start_step, end_step, checkpointer, work_dir, verbose, print_fn,
                  metrics=None, save=True):
    """Trains from ``start_step`` to ``end_step`` (:func:`fit_loop.fit_resumable`:
    checkpoints inside epochs, stop signals) and saves ``model.keras`` into
    ``work_dir`` (unless not ``save``).  ``checkpointer``: the run's (its folder holds the stop
    files); ``metrics``: the metric sums of the checkpoint resumed inside an
    epoch."""
    try:
        fit_loop.fit_resumable(
            model, make_train=make_train, validation_data=eval_ds, callbacks=callbacks,
            strategy=strategy, steps_per_epoch=plan.steps_per_epoch,
            start_step=start_step, end_step=end_step, checkpointer=recorder.checkpointer,
            history=lambda: recorder.history, state=recorder.epoch_progress,
            verbose=verbose, metrics=metrics, print_fn=print_fn,
            stop_directory=checkpointer.directory)
        if start_step >= end_step and end_step < plan.total_steps:
            print_fn(f"the run is already at step {start_step:,} (--stop_at_step={end_step})")
        elif start_step >= end_step:
            print_fn(f"the run is already complete ({start_step} steps)")
        if save:
            trained_model.save_model(model, storage.join(work_dir, "model.keras"))
    except OSError as error:  # the history, curves, TensorBoard or model files
        if not (checkpoints.out_of_space(error) or isinstance(error, storage.StorageError)):
            raise
        fix = "free space" if checkpoints.out_of_space(error) else "fix the cause"
        raise checkpoints.WriteError(
            f"cannot write into {work_dir} ({error.strerror or error}); "
            f"{checkpoints.intact_words(checkpointer.intact_step(), fix)}") from None
    except Exception as error:  # an image that stops the input stream, named in one line
        data_error = data_errors.as_data_error(error)
        if data_error is None:
            raise
        raise config_lib.ConfigError(str(data_error)) from None


def _train(run, print_fn, started):
    config = run.config
    setup = run.setup
    strategy, data, recipe, plan = setup.strategy, setup.data, setup.recipe, setup.plan
    chief, work_dir, checkpointer = run.chief, run.work_dir, run.checkpointer
    normalization, model_dir = setup.normalization, config.model_dir
    model, state = _build_and_restore(config, strategy, data, normalization, recipe, plan,
                                      run.steps_per_execution, checkpointer, run.state)
    # Written once the model is built and restored: a refused builder leaves no run behind.
    if chief:
        _write_run_record(config, data, normalization, run.identity, plan)

    start_step = state["step"] if state else 0
    end_step = steps.stop_step(config.stop_at_step, plan)
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
    print_fn(f"recipe {recipe.name}: global batch {plan.batch_size}, lr "
             f"{plan.learning_rate:g}, {plan.total_steps:,} steps "
             f"({plan.epochs} epochs of {plan.steps_per_epoch}), "
             + {"exponential": f"lr x{recipe.exponential_decay:g} per epoch",
                "cosine": "cosine annealing to 0"}.get(
                 recipe.schedule, f"lr drops at {list(plan.boundaries)}")
             + f", warm-up {plan.warmup_steps}; "
             f"{strategies.describe(strategy)}, {config.precision}"
             f"{', XLA' if model.jit_compile else ''}{per_execution}, Keras backend "
             f"{keras.backend.backend()}")
    # TensorFlow's CPU kernels run the steps only on its backend (a JAX run may import it).
    kernels = cpu_kernels.describe() if keras.backend.backend() == "tensorflow" else None
    if kernels:
        print_fn(kernels)
    if run.threads:
        print_fn(run.threads)
    if config.precision == "mixed_bfloat16" and strategies.trains_on_cpu(strategy):
        slow = cpu_kernels.bfloat16_notice(
            tensorflow_kernels=kernels and cpu_kernels.kernels())
        if slow:
            print_fn(slow)
    if end_step < plan.total_steps:
        print_fn(f"stopping at step {end_step:,} of {plan.total_steps:,} (--stop_at_step; "
                 f"the same command with a larger one, or without it, continues the run)")
    note = steps.steps_per_execution_note(
        run.steps_per_execution, config.steps_per_execution, plan,
        strategies.is_tpu(strategy))
    if note:
        print_fn(note)
    if state:
        print_fn(f"resuming from the checkpoint at step {start_step} "
                 f"({preemption.place(start_step, plan.steps_per_epoch)}) "
                 f"in {checkpointer.directory}")
        if run.previous_backend not in (None, keras.backend.backend()):
            print_fn(f"the run was trained on the {run.previous_backend} backend until now; it "
                     f"continues on {keras.backend.backend()} (same weights and optimizer "
                     f"state; the order of the examples, the augmentation draws (tf.data on "
                     f"TensorFlow, NumPy on JAX), random masks and rounding differ)")
    if run.extended_from is not None:
        print_fn(f"the run's length changes from {run.extended_from:,} to "
                 f"{plan.total_steps:,} steps; the learning-rate schedule is that of the "
                 f"new length (drops at {list(plan.boundaries)})")

    eval_ds = setup.eval_stream(config.eval_crop)
    if keras.backend.backend() == "tensorflow":
        from keras_identity.training import multi_worker

        multi_worker.prepare(model, strategy)

    title = f"{model.name} on {data.name} ({recipe.name} recipe)"
    # A process that is neither the chief nor part of a collective checkpoint
    # saves as process 0 does, into its scratch folder.
    own_checkpointer = checkpointer if chief or checkpointer.collective else \
        checkpoints.Checkpointer(storage.join(work_dir, "checkpoints"), keep=1,
                                 owns_directory=True)
    if run.lock is not None and not strategies.several_processes(strategy):  # lock lost: stop
        own_checkpointer = run.lock.guard(own_checkpointer)
    recorder = recorders.RunRecorder(
        checkpointer=own_checkpointer,
        history=history, global_batch=plan.batch_size, total_steps=plan.total_steps,
        steps_per_epoch=plan.steps_per_epoch,
        writer=recorders.history_writer(model_dir, title) if chief else None,
        title=title, print_fn=print_fn if chief else (lambda *_: None),
        resumed=state if start_step % plan.steps_per_epoch else None)
    callbacks = _callbacks(recorder, setup.signals, strategy, plan, end_step,
                           config.checkpoint_every,
                           None if run.scratch else storage.join(work_dir, "tensorboard"))
    model_path = storage.join(model_dir, "model.keras")
    # A complete run's model.keras that its card certifies is left as it is
    # (a rewrite would change its bytes, and so the card's sha256); any other
    # is replaced, its card removed first (written anew when the run completes).
    save = True
    if chief:
        save = not (start_step >= end_step and model_card.certifies(model_dir, start_step))
        if save:
            model_card.remove_card(model_dir)
    try:
        with setup.signals:
            _fit_and_save(model, setup.train_stream, eval_ds, callbacks, recorder,
                          strategy=strategy, plan=plan, start_step=start_step, end_step=end_step,
                          checkpointer=checkpointer, work_dir=work_dir,
                          verbose=config.verbose if chief else 0, print_fn=print_fn,
                          metrics=(state or {}).get("metrics"), save=save)
        # Process 0's files are written before any process returns (a process
        # that left early would look dead to the coordination service).
        strategies.barrier(strategy, "keras_identity_training_done")
    finally:
        fit_loop.close_stream(eval_ds)
        for callback in callbacks:
            if isinstance(callback, recorders.UploadLogs):
                callback.finish()
    history = recorder.history
    result = {"model_dir": model_dir, "model_path": model_path,
              "steps": int(model.optimizer.iterations.numpy()),
              "test_error": history[-1]["test_error"] if history else None,
              "loss": history[-1]["loss"] if history else None, "history": history,
              "seconds": time.time() - started, "params": params,
              "jit_compile": bool(model.jit_compile), "model_name": model.name,
              "complete": int(model.optimizer.iterations.numpy()) >= plan.total_steps,
              "chief": chief, "data_source": data.source, "num_train": data.num_train,
              "num_test": data.num_test, "recipe_description": recipe.description}
    if chief:
        minutes, seconds = divmod(int(result["seconds"]), 60)
        error = result["test_error"]
        print_fn(f"done: test error {100 * error:.2f}% after {result['steps']:,} steps, "
                 f"{minutes}m{seconds:02d}s; model saved to {model_path}"
                 if error is not None else f"done; model saved to {model_path}")
    return result
