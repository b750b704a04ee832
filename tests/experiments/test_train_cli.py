"""The command-line programs, run as a user runs them."""

import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.backend import tensorflow_only
from tests.conftest import REPO
from tests.datasets import cifar_like_npz
from tests.programs import error_lines
from tests.programs import run_cases
from tests.programs import run_refusals


def run_cli(module, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, text=True,
                          capture_output=True, timeout=timeout)


BAD_FLAGS = [
    (["--model=resnet9"], ["model='resnet9'"]),
    (["--model=preact_resnet", "--depth=1000", "--dataset=cifar10"], ["depth=1000", "9n+2"]),
    (["--strategy=gpu"], ["--strategy=gpu", "auto|default"]),
    (["--model=resnet", "--depth=20", "--dataset=cifar10", "--data_dir=/no/such/dir"],
     ["data_dir='/no/such/dir' does not exist"]),
    (["--epochs=0"], ["epochs=0"]),
    (["--data_dir=da\x01ta/mnist.npz"], ["data_dir='da\\x01ta/mnist.npz' holds a control "
                                         "character"]),
    (["--recompute=all"], ["--recompute=all", "none|bn_relu|unit"]),
    (["--model=preact_resnet", "--depth=164", "--stage_mode=unrolled", "--recompute=bn_relu"],
     ["recompute='bn_relu'", "unrolled"]),
    (["--model=resnet", "--depth=20", "--dataset=cifar10", "--gate_bias_init=-2"],
     ["gate_bias_init=-2.0 does not apply to shortcut='identity'"]),
    (["--model=highway_net", "--model_kwargs={\"dimension_shortcut\": \"B\"}"],
     ["dimension_shortcut='B' does not apply to 'highway_net'", "--model=resnet"]),
    (["--model_kwargs=[1]"], ["--model_kwargs=[1]", "JSON object"]),
    (["--model=resnet", "--shortcut=conv1x1", "--model_kwargs={\"shortcut\": \"dropout\"}"],
     ["--model_kwargs sets 'shortcut'", "--shortcut"]),
    (["--no_such_flag=1"], ["no_such_flag"]),
    (["positional"], ["unexpected arguments"]),
]


def test_bad_flags_exit_non_zero_with_one_line(tmp_path):
    results = run_refusals("keras_identity_cli.train",
                           [args + [f"--model_dir={tmp_path}"] for args, _ in BAD_FLAGS])
    for (args, words), (code, stderr) in zip(BAD_FLAGS, results):
        lines = error_lines(stderr)
        assert code == 2 and len(lines) == 1, (args, stderr[-2000:])
        for word in words:
            assert word in lines[0], (args, lines[0])


def test_killed_run_resumes_from_its_checkpoint(tmp_path):
    args = ["-m", "keras_identity_cli.train", "--model=highway_net", "--depth=30",
            "--train_examples=20000", "--test_examples=500", "--batch_size=256",
            "--steps_per_epoch=10", "--epochs=6", "--verbose=0", "--seed=2",
            f"--model_dir={tmp_path}"]
    process = subprocess.Popen([sys.executable, *args], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    # The history is written after each epoch's checkpoint was begun (on JAX
    # an Orbax checkpoint, maybe still in flight when the kill comes: the
    # run then resumes from the one before).
    history = tmp_path / "history.json"

    def epochs():
        try:
            return len(json.loads(history.read_text()))
        except (OSError, ValueError):
            return 0

    deadline = time.time() + 240
    while time.time() < deadline and process.poll() is None:
        if epochs() >= 2:
            break
        time.sleep(0.05)
    assert process.poll() is None, "the run ended before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert 2 <= epochs() < 6
    assert not (tmp_path / "model_card.json").exists()  # a card for complete runs only
    result = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "resuming from the checkpoint at step" in result.stdout
    history = json.loads((tmp_path / "history.json").read_text())
    assert [row["epoch"] for row in history] == list(range(1, 7))
    assert history[-1]["step"] == 60
    assert "done: test error" in result.stdout
    _check_card_and_preset(tmp_path, history, args, result.stdout)
    _check_card_follows_the_weights(tmp_path, args)


def _check_card_follows_the_weights(run_dir, args):
    """The same command on the complete run leaves model.keras (and the
    card's sha256) as they are; a card that is not of the weights beside it
    (another run's file; a run extended since) is never registered; an
    extension removes the card before it writes new weights."""
    import hashlib

    import keras_identity as ki
    from keras_identity.models import pretrained

    def sha256():
        return hashlib.sha256((run_dir / "model.keras").read_bytes()).hexdigest()

    card = json.loads((run_dir / "model_card.json").read_text())
    before = sha256()
    again = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0 and "already complete" in again.stdout, again.stderr[-2000:]
    assert sha256() == before == json.loads((run_dir / "model_card.json").read_text())[
        "sha256"]
    registry = run_dir / "registry2"
    kept = (run_dir / "model.keras").read_bytes()
    ki.models.highway_net(30).save(run_dir / "model.keras")   # another network's weights
    with pytest.raises(ValueError, match=rf"model.keras has sha256 {sha256()}, its model "
                                         rf"card's is {before} \(the card is not of these "
                                         rf"weights\)"):
        pretrained.register(str(run_dir), "trial", str(registry))
    (run_dir / "model.keras").write_bytes(kept)
    cards = {n: (run_dir / n).read_bytes() for n in ("model_card.json", "model_card.md")}
    longer = [a for a in args if not a.startswith("--epochs=")] + ["--epochs=8",
                                                                    "--stop_at_step=70"]
    extended = subprocess.run([sys.executable, *longer], cwd=REPO, capture_output=True,
                              text=True, timeout=300)
    assert extended.returncode == 0, extended.stderr[-2000:]
    assert sha256() != before and not (run_dir / "model_card.json").exists() and not (
        run_dir / "model_card.md").exists()
    with pytest.raises(ValueError, match="has no model_card.json"):
        pretrained.register(str(run_dir), "trial", str(registry))
    for name, data in cards.items():   # the stale card, as a kill before the fix left it
        (run_dir / name).write_bytes(data)
    with pytest.raises(ValueError, match=r"its model card is of a run of 60 steps, "
                                         r"run.json's is 80 \(the run was extended"):
        pretrained.register(str(run_dir), "trial", str(registry))
    assert not registry.exists()
    assert card["sha256"] == before


def _check_card_and_preset(run_dir, history, args, stdout):
    """The complete run's model card, and the run made a preset of a registry."""
    import hashlib

    import keras_identity as ki
    from keras_identity.models import pretrained

    assert f"model card: {run_dir / 'model_card.md'}" in stdout
    card = json.loads((run_dir / "model_card.json").read_text())
    assert card["command"] == "keras-identity-train " + " ".join(args[2:])
    assert card["builder"] == "highway_net" and card["arguments"] == {"depth": 30,
                                                                      "dataset": "mnist"}
    assert card["test_error"] == history[-1]["test_error"]
    assert card["training_seconds"] == round(history[-1]["wall_time"], 1)
    assert card["recipe"]["steps"] == 60 and card["data"]["test_images"] == 500
    assert card["sha256"] == hashlib.sha256((run_dir / "model.keras").read_bytes()).hexdigest()
    assert "**{:.2f}%**".format(100 * card["test_error"]) in (run_dir / "model_card.md") \
        .read_text()
    registry = run_dir / "registry"
    preset = pretrained.register(str(run_dir), "trial", str(registry))
    assert preset.call == "highway_net(depth=30, dataset='mnist', weights='trial')"
    original = pretrained._directory
    pretrained._directory = lambda: str(registry)
    try:
        model = ki.models.highway_net(30, weights="trial")
    finally:
        pretrained._directory = original
    images = np.random.default_rng(0).random((8, 28, 28, 1), dtype=np.float32)
    trained = ki.models.load_model(str(run_dir / "model.keras"))
    np.testing.assert_allclose(model.predict(images, verbose=0),
                               trained.predict(images * 255.0, verbose=0), atol=1e-5)


def test_plot_runs(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        rows = [{"step": s, "loss": 1.0 / s, "test_error": 0.5 / s} for s in (1, 2, 3)]
        (tmp_path / name / "history.json").write_text(json.dumps(rows))
    out = tmp_path / "both.png"
    (code, stderr), (bad, bad_err) = run_refusals("experiments.plot_runs", [
        [f"--run_dirs={tmp_path / 'a'},{tmp_path / 'b'}", "--labels=one,two", f"--out={out}"],
        [f"--run_dirs={tmp_path}"]])
    assert code == 0, stderr
    assert out.stat().st_size > 5000
    assert bad == 2 and "has no history.json" in bad_err


def test_helpshort_lists_the_program_and_model_flags():
    """The flags live in keras_identity_cli; --helpshort of the wrapper (and of
    the console command, whose argv[0] is its script) still lists them."""
    result = run_cli("keras_identity_cli.train", "--helpshort")  # absl exits 1 after help
    for flag in ("--model:", "--shortcut:", "--gate_bias_init:", "--backend:", "--data_dir:"):
        assert flag in result.stdout, flag


def test_every_setting_is_one_flag_with_the_declared_default_and_type():
    """TrainConfig declares each setting once; keras-identity-train's flags
    are generated from it, and the flags' values come back as the fields'
    types (enum flags hold strings)."""
    code = (
        "import dataclasses, json\n"
        "from absl import flags\n"
        "from keras_identity_cli import train\n"
        "from keras_identity.training import TrainConfig\n"
        "flags.FLAGS(['prog', '--eval_crop=320', '--verbose=2', '--learning_rate=0.05',\n"
        "             '--jit_compile', '--dataset=cifar10', '--model=resnet', '--depth=20'])\n"
        "fields = dataclasses.fields(TrainConfig)\n"
        "print(json.dumps({\n"
        "    'without_flag': [f.name for f in fields if f.name not in flags.FLAGS],\n"
        "    'given': dataclasses.asdict(train.config_from_flags()),\n"
        "    'default': dataclasses.asdict(TrainConfig(model='resnet', depth=20,\n"
        "                                              dataset='cifar10').validate())}))\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, text=True,
                            capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    out = json.loads(result.stdout.splitlines()[-1])
    assert out["without_flag"] == []  # model_kwargs: the model flags and its JSON flag
    given, default = out["given"], out["default"]
    assert default["model_dir"] == "runs/resnet20_cifar10"
    changed = {k: v for k, v in given.items() if default[k] != v}
    assert changed == {"eval_crop": 320, "verbose": 2, "learning_rate": 0.05,
                       "jit_compile": True}


def test_a_stop_signal_while_the_program_starts_exits_75_in_one_line(tmp_path):
    """SIGINT, or the --stop_signal (SLURM's USR1), while the libraries load
    or the run is prepared: the documented line and status 75 (a requeue),
    not USR1's default death (138) or a traceback."""
    for number, extra in ((signal.SIGUSR1, ["--stop_signal=USR1"]), (signal.SIGINT, [])):
        process = subprocess.Popen(
            [sys.executable, "-m", "keras_identity_cli.train", "--depth=3",
             "--train_examples=640", "--train_steps=3", f"--model_dir={tmp_path / 'run'}",
             *extra], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.5)   # importing Keras and TensorFlow takes longer
        process.send_signal(number)
        out, err = process.communicate(timeout=120)
        assert process.returncode == 75, (process.returncode, err[-2000:])
        assert "Traceback" not in err
        name = signal.Signals(number).name
        assert f"stopped by {name} outside the training loop" in err
        assert "run the same command to resume (exit status 75)" in err
        assert not (tmp_path / "run" / "checkpoints").exists()


@tensorflow_only
@pytest.mark.parametrize("batches", [
    (3, 7), pytest.param((5, 9, 15), marks=pytest.mark.slow)])
def test_odd_static_batches_train_in_parts_as_whole_units(tmp_path, batches):
    # One thread per operation: the looped identity units of a pre-activation
    # ResNet run in parts along the batch, which the in-memory stream batches
    # with drop_remainder (a static batch size the parts do not divide at an
    # odd batch).  The first epoch's loss equals that of TensorFlow's own
    # split (--intra_op_threads=0: whole units), run in another process.
    data = cifar_like_npz(tmp_path / "cifar-like.npz", 64, 16)
    common = ["--model=preact_resnet", "--depth=20", "--stage_mode=scan", "--dataset=cifar10",
              f"--data_dir={data}", "--steps_per_epoch=3", "--epochs=1", "--seed=1",
              "--verbose=0"]
    losses, outputs = {}, {}
    for threads in ("1", "0"):
        cases = [common + [f"--batch_size={b}", f"--intra_op_threads={threads}",
                           f"--model_dir={tmp_path / f'{threads}-{b}'}"] for b in batches]
        results = run_cases("keras_identity_cli.train", cases)
        for b, (code, stderr, _) in zip(batches, results):
            assert code == 0, (threads, b, stderr[-3000:])
            history = json.loads((tmp_path / f"{threads}-{b}" / "history.json").read_text())
            losses[threads, b] = history[0]["loss"]
        outputs[threads] = results[0][2]
    if "TensorFlow CPU kernels: oneDNN" not in outputs["1"]:
        pytest.skip("the units run in parts with oneDNN's kernels only")
    assert "TensorFlow CPU threads: 1 per operation" in outputs["1"]
    for b in batches:
        np.testing.assert_allclose(losses["1", b], losses["0", b], rtol=1e-4,
                                   err_msg=f"batch {b}")
