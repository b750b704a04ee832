"""The JAX route's image files decoded in Grain's worker processes: the
threads' stream exactly (resumed, per process, evaluation padded), any batch
asked for again, bad ``workers`` refused, and a script that cannot start
workers told why in one line.  A file refused inside a worker:
tests/data/test_hostile_files.py.  The tests that start worker processes
run on the JAX leg (tests/backend.py: ``jax_route``)."""

import os
import select
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from PIL import Image

from keras_identity import _cpu_kernels as cpu_kernels
from keras_identity.data import arrays
from keras_identity.data.image_dataset import ImageDataset
from keras_identity.data.normalization import Normalization
from tests.backend import jax_route

pytest.importorskip("grain")


def _files(root, n=10):
    """``n`` PNGs of noise of several sizes, two classes, as an ImageNet-style dataset."""
    rng = np.random.default_rng(0)
    paths = []
    for i in range(n):
        path = os.path.join(root, f"{i}.png")
        Image.fromarray(rng.integers(0, 256, (40 + 3 * i, 50, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    labels = np.arange(n, dtype=np.int32) % 2
    return ImageDataset(name="imagenet", num_classes=2, class_names=["a", "b"],
                        image_shape=(224, 224, 3), source=str(root),
                        files_train=(paths, labels), files_test=(paths, labels))


def _batches(stream, indices):
    return [tuple(np.asarray(part) for part in stream[i]) for i in indices]


@jax_route
def test_worker_processes_give_the_threads_stream(tmp_path):
    data = _files(tmp_path)
    norm = Normalization.imagenet()
    kwargs = dict(batch_size=4, normalization=norm, augmentation="imagenet", seed=3,
                  start_step=2, process_index=1, process_count=2, raw_pixels=True)
    threads = arrays.TrainBatches(data, worker_processes=0, **kwargs)
    workers = arrays.TrainBatches(data, worker_processes=2, **kwargs)
    try:
        assert workers.worker_processes == 2 and threads.worker_processes == 0
        assert workers.workers == threads.workers == 1  # Keras's own: one caller
        # Batches 2..5 of the stream (past the first pass of 10 images),
        # then batch 3 again: the workers start over there.
        expected = _batches(threads, [0, 1, 2, 3, 1])
        got = _batches(workers, [0, 1, 2, 3, 1])
        for (x0, y0), (x1, y1) in zip(expected, got):
            assert x1.shape == (2, 224, 224, 3) and x1.dtype == np.float32
            np.testing.assert_array_equal(x1, x0)
            np.testing.assert_array_equal(y1, y0)
    finally:
        threads.close()
        workers.close()
    # Evaluation: padded batches of process 1 of 2, with their weights.
    kwargs = dict(batch_size=4, normalization=norm, pad_to_batch=True, process_index=1,
                  process_count=2, raw_pixels=True)
    threads = arrays.EvalBatches(data, worker_processes=0, **kwargs)
    workers = arrays.EvalBatches(data, worker_processes=2, **kwargs)
    try:
        assert workers.num_batches == 3
        for ours, theirs in zip(_batches(workers, range(3)), _batches(threads, range(3))):
            for a, b in zip(ours, theirs):
                np.testing.assert_array_equal(a, b)
        assert _batches(workers, [2])[0][2].tolist() == [0.0, 0.0]  # rows 10, 11: padding
    finally:
        threads.close()
        workers.close()


def test_workers_default_to_the_cores_for_files_and_threads_for_arrays(tmp_path,
                                                                      monkeypatch):
    data = _files(tmp_path, n=4)
    for cores, expected in ((8, 8), (3, 3), (2, 0), (1, 0)):  # 2 threads use 2 cores
        monkeypatch.setattr(cpu_kernels, "cores", lambda: cores)
        stream = arrays.TrainBatches(data, batch_size=2, normalization=Normalization("scale"))
        assert stream.worker_processes == expected
        stream.close()
    memory = ImageDataset(name="cifar10", num_classes=2, class_names=["a", "b"],
                          image_shape=(8, 8, 3), source="arrays",
                          x_train=np.zeros((4, 8, 8, 3), np.uint8),
                          y_train=np.zeros(4, np.int32), x_test=np.zeros((2, 8, 8, 3), np.uint8),
                          y_test=np.zeros(2, np.int32))
    stream = arrays.TrainBatches(memory, batch_size=2, normalization=Normalization("scale"))
    assert stream.worker_processes == 0
    stream.close()


@pytest.mark.parametrize("workers, words", [
    (-1, "worker_processes=-1 is not valid; expected an integer >= 0."),
    (True, "worker_processes=True is not valid; expected an integer >= 0."),
    (1.5, "worker_processes=1.5 is not valid; expected an integer >= 0."),
])
def test_bad_workers_are_refused(tmp_path, workers, words):
    with pytest.raises(ValueError) as error:
        arrays.TrainBatches(_files(tmp_path, n=2), batch_size=2,
                            normalization=Normalization("scale"),
                            worker_processes=workers)
    assert str(error.value) == words


def test_workers_are_bounded_by_the_cores(tmp_path, monkeypatch):
    """Issue 61, case 14: --input_workers=1000 on 2 cores was accepted,
    trained nothing in 150 s and left thousands of semaphores behind."""
    data = _files(tmp_path, n=2)
    monkeypatch.setattr(cpu_kernels, "cores", lambda: 2)
    assert arrays.resolve_worker_processes(8, data, name="input_workers") == 8
    for workers in (9, 1000):
        with pytest.raises(ValueError) as error:
            arrays.resolve_worker_processes(workers, data, name="input_workers")
        assert str(error.value) == (
            f"input_workers={workers} is not valid on this machine of 2 cores; expected at "
            f"most 8 (4 per core: each worker is a process holding its batches in memory).")
    with pytest.raises(ValueError, match=r"^worker_processes=1000 is not valid on this "
                                         r"machine of 2 cores; expected at most 8 "):
        arrays.TrainBatches(data, batch_size=2, normalization=Normalization("scale"),
                            worker_processes=1000)


def test_workers_for_arrays_in_memory_are_refused():
    memory = ImageDataset(name="cifar10", num_classes=2, class_names=["a", "b"],
                          image_shape=(8, 8, 3), source="arrays",
                          x_train=np.zeros((4, 8, 8, 3), np.uint8),
                          y_train=np.zeros(4, np.int32), x_test=np.zeros((2, 8, 8, 3), np.uint8),
                          y_test=np.zeros(2, np.int32))
    with pytest.raises(ValueError, match=r"^worker_processes=2 is not valid for arrays, which "
                                         r"is held in memory"):
        arrays.EvalBatches(memory, batch_size=2, normalization=Normalization("scale"),
                           worker_processes=2)


@jax_route
def test_a_script_without_a_main_guard_is_told_why_its_workers_stopped(tmp_path):
    """Worker processes are spawned, so they import the script again; one
    that trains at its top level stops them: one line says what to do."""
    data = tmp_path / "data"
    data.mkdir()
    script = tmp_path / "unguarded.py"
    script.write_text(textwrap.dedent(f"""
        import numpy as np
        from keras_identity.data import arrays, ImageDataset, Normalization
        paths = [{str(data / '0.png')!r}] * 2
        Image = __import__("PIL.Image").Image
        Image.fromarray(np.zeros((9, 9, 3), np.uint8)).save(paths[0])
        data = ImageDataset(name="imagenet", num_classes=1, class_names=["a"],
                            image_shape=(224, 224, 3), source="d",
                            files_train=(paths, np.zeros(2, np.int32)),
                            files_test=(paths, np.zeros(2, np.int32)))
        stream = arrays.TrainBatches(data, batch_size=2, normalization=Normalization("scale"),
                                     worker_processes=1)
        stream[0]
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=os.getcwd()))
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: an input worker process stopped (exit code 1; its "
                           "error, if any, is printed above): a script that reads image "
                           "files in worker processes must train under `if __name__ == "), last
    assert last.endswith("(worker_processes=0, --input_workers=0).")


_STREAMS = textwrap.dedent("""
    import multiprocessing, os, sys, time
    import numpy as np
    from PIL import Image
    from keras_identity.data import arrays, ImageDataset, Normalization

    def data(root, n=10):
        rng = np.random.default_rng(0)
        paths = []
        for i in range(n):
            paths.append(os.path.join(root, f"{i}.png"))
            Image.fromarray(rng.integers(0, 256, (40 + 3 * i, 50, 3), np.uint8)).save(paths[-1])
        labels = np.arange(n, dtype=np.int32) % 2
        return ImageDataset(name="imagenet", num_classes=2, class_names=["a", "b"],
                            image_shape=(224, 224, 3), source=root,
                            files_train=(paths, labels), files_test=(paths, labels))

    def train(data):
        return arrays.TrainBatches(data, batch_size=4, normalization=Normalization.imagenet(),
                                   augmentation="imagenet", seed=3, worker_processes=2)
""")


def _run_streams(tmp_path, body, **kwargs):
    script = tmp_path / "streams.py"
    script.write_text(_STREAMS + textwrap.dedent(body))
    return subprocess.Popen([sys.executable, str(script), str(tmp_path)], text=True,
                            env=dict(os.environ, PYTHONPATH=os.getcwd()), **kwargs)


@jax_route
def test_streams_read_and_ended_leave_no_shared_memory(tmp_path):
    """Issue 61, case 6: a run with --input_workers=2 ended with "There
    appear to be 4 leaked shared_memory objects": the evaluation stream's
    workers reached its end, and Grain's end of a worker kept a batch alive
    (in an exception's traceback) past the program's end.  Read to the end
    and again, closed or not, the streams leave nothing."""
    proc = _run_streams(tmp_path, """
        if __name__ == "__main__":
            data = data(sys.argv[1])
            evaluation = arrays.EvalBatches(data, batch_size=4, worker_processes=2,
                                            normalization=Normalization.imagenet())
            for index in [0, 1, 2, 0]:
                evaluation[index]
            evaluation.close()
            closed, left = train(data), train(data)
            for index in range(3):
                closed[index], left[index]
            closed.close()
            print("read", flush=True)  # and left open: the program's end closes it
    """, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and out == "read\n", err[-2000:]
    assert "leaked shared_memory" not in err, err[-2000:]


def _gone(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" in f.read()  # a zombie: ended, not yet reaped
    except FileNotFoundError:
        return True


def _mapped_shared_memory(pid):
    """The names of the /dev/shm segments process ``pid`` maps (not unlinked)."""
    with open(f"/proc/{pid}/maps") as f:
        return {line.split("/dev/shm/")[1].strip() for line in f
                if "/dev/shm/psm_" in line and "(deleted)" not in line}


@jax_route
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_workers_exit_when_the_training_process_is_killed(tmp_path):
    """Issue 61, case 14: a SIGKILL to the training process left both Grain
    workers running (30 s later) and their batches in /dev/shm.  The
    workers now exit within a second or two, and the batches go with them."""
    proc = _run_streams(tmp_path, """
        if __name__ == "__main__":
            stream = train(data(sys.argv[1]))
            stream[0], stream[1]
            time.sleep(2)  # the workers fill their buffers
            print(" ".join(str(p.pid) for p in multiprocessing.active_children()), flush=True)
            time.sleep(600)
    """, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    workers = []
    try:
        assert select.select([proc.stdout], [], [], 180)[0], "the streams did not start"
        workers += [int(pid) for pid in proc.stdout.readline().split()]
        assert len(workers) == 2, workers
        deadline = time.monotonic() + 30   # the batches prepared ahead (a loaded machine)
        while not (segments := set().union(*(_mapped_shared_memory(p)
                                             for p in [proc.pid, *workers]))):
            assert time.monotonic() < deadline, "no batch in shared memory"
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        deadline = time.monotonic() + 20
        while not all(_gone(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert all(_gone(pid) for pid in workers), "the workers outlived the killed process"
        while time.monotonic() < deadline and any(
                os.path.exists(f"/dev/shm/{name}") for name in segments):
            time.sleep(0.2)
        assert not [name for name in segments if os.path.exists(f"/dev/shm/{name}")]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in workers:  # those a failure left behind
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_program_refuses_bad_input_workers_in_one_line_for_an_image_folder(tmp_path):
    # keras-identity-train on the JAX route, an ImageNet-style folder (files
    # decoded a batch at a time): -1 and more than 4 a core are one line,
    # status 2, before anything is built.
    from tests.programs import error_lines
    from tests.programs import run_refusals

    root = tmp_path / "folder"
    for split in ("train", "val"):
        for cls in ("a", "b"):
            os.makedirs(root / split / cls)
            Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(root / split / cls / "0.jpg")
    cores = cpu_kernels.cores()
    common = ["--model=resnet", "--depth=18", "--dataset=imagenet", f"--data_dir={root}",
              "--batch_size=2", "--train_steps=1", "--verbose=0"]
    results = run_refusals("keras_identity_cli.train", [
        common + [f"--input_workers={w}", f"--model_dir={tmp_path / str(w)}"]
        for w in (-1, 4 * cores + 1)], env={"KERAS_BACKEND": "jax"})
    expected = ["input_workers=-1 is not valid; expected an integer >= 0.",
                f"input_workers={4 * cores + 1} is not valid on this machine of {cores} "
                f"core{'s' if cores != 1 else ''}; expected at most {4 * cores}"]
    for (code, stderr), words in zip(results, expected):
        lines = error_lines(stderr)
        assert code == 2 and len(lines) == 1 and words in lines[0], stderr[-3000:]
        assert "Traceback" not in stderr
