"""keras_identity.storage on a local folder and in a bucket (a local GCS
emulator with GCS's preconditions: tests/gcs_emulator.py, the `gcs_emulator`
fixture of tests/conftest.py; the bucket's cases are skipped where
gcp-storage-emulator or gcsfs is not installed)."""

import json
import math
import os
import subprocess
import sys
import threading

import pytest

from keras_identity import storage
from keras_identity import store_clients

pytestmark = pytest.mark.quick  # the quick tier (docs/testing.md)

MISSING_BUCKET = "gs://nobucket-xyz"


@pytest.fixture(params=["local", "gcs"])
def root(request, tmp_path):
    """A fresh, empty folder: a local one, or a prefix in the emulator's bucket."""
    if request.param == "local":
        return str(tmp_path / "run")
    return request.getfixturevalue("gcs_emulator")()


@pytest.fixture
def bucket_root(gcs_emulator):
    return gcs_emulator()


def _write_files(base, files):
    for relative, data in files.items():
        path = os.path.join(base, *relative.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)


# --- Paths ------------------------------------------------------------------------


def test_path_helpers():
    assert storage.scheme("gs://b/x") == "gs"
    assert storage.scheme("S3://b/x") == "s3"
    assert storage.scheme("/tmp/run") is None
    assert storage.scheme("file:///tmp/run") is None
    assert storage.is_remote("gs://b/run") and not storage.is_remote("relative/run")
    assert storage.join("gs://b/run", "ckpt", "a.json") == "gs://b/run/ckpt/a.json"
    assert storage.join("run", "a.json") == os.path.join("run", "a.json")
    assert storage.basename("gs://b/run/ckpt/") == "ckpt"
    assert storage.dirname("gs://b/run/ckpt/") == "gs://b/run"
    assert storage.normalize("GS://b//run/./x/../y") == "gs://b/run/y"
    assert storage.bucket_of("gs://b/run/x") == "gs://b"


@pytest.mark.parametrize("path, position", [
    ("gs://bucket/run\nx", 15), ("/tmp/run\nx", 8), ("runs/a\tb", 6), ("gs://b-1/x\x7f", 10),
    ("runs/\x1b[31m", 5), ("runs/a\u2028b", 6)])
def test_check_path_refuses_control_characters_on_a_disk_and_in_a_bucket(path, position):
    # A newline pasted into --model_dir trained into object names holding it,
    # and split every line that named them in two.
    with pytest.raises(ValueError) as info:
        storage.check_path(path)
    assert str(info.value) == (f"model_dir={path!r} holds a control character "
                               f"({path[position]!r} at position {position}); expected a path "
                               f"without control characters")
    assert "\n" not in str(info.value)
    storage.check_path("runs/ünïcode run")  # printable characters are names like any other


def test_check_object_names_refuses_a_folder_whose_files_pass_the_stores_limit():
    names = ["tensorboard/" + "t" * 40, "checkpoints/" + "c" * 20]   # the longest: 52 bytes
    room = 1024 - 52 - 1
    storage.check_object_names("gs://b-1/" + "r" * room, names)
    storage.check_object_names("s3://b-1/" + "r" * room + "/", names)
    storage.check_object_names("/local/" + "r" * 2000, names)   # a disk: its own limits
    with pytest.raises(ValueError) as info:
        storage.check_object_names("gs://b-1/" + "r" * (room + 1), names, name="export_dir")
    assert str(info.value) == (
        f"export_dir='gs://b-1/{'r' * (room + 1)}' is too long for GCS: the run's file "
        f"'tensorboard/{'t' * 40}' there would be an object named with 1,025 bytes, past GCS's "
        f"limit of 1,024; expected a export_dir whose path in the bucket takes at most 971 bytes")
    # Bytes, not characters: UTF-8 names count each ü twice.
    with pytest.raises(ValueError, match="1,025 bytes"):
        storage.check_object_names("gs://b-1/" + "ü" * 486, names)


def test_check_path_refuses_other_schemes_and_a_missing_bucket():
    with pytest.raises(ValueError, match=r"model_dir='ftp://x/y': ftp:// is not a store") as info:
        storage.check_path("ftp://x/y")
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match=r"export_dir='ftp://x/y'"):
        storage.check_path("ftp://x/y", name="export_dir")
    with pytest.raises(ValueError, match=r"model_dir='gs:///nobucket' names no bucket"):
        storage.check_path("gs:///nobucket")
    storage.check_path("/tmp/some/run")
    storage.check_path("relative/run")


@pytest.mark.parametrize("path, expected", [
    ("gs:/bucket/x", r"'gs:/bucket/x' is not a bucket URL \(gs: takes '//'\) and would be a "
                     r"local folder 'gs:'; expected gs://bucket/x \(a local folder of that "
                     r"name: \./gs:/bucket/x\)$"),
    ("gs:bucket/x", r"would be a local folder 'gs:bucket'; expected gs://bucket/x "),
    ("S3:b/x", r"'S3:b/x' is not a bucket URL \(S3: takes '//'\).* expected s3://b/x "),
    ("GS://bucket/x", r"'GS://bucket/x': a bucket URL's scheme is in lower case; expected "
                      r"gs://bucket/x$"),
    ("gs://bucket//x", r"no empty, '\.' or '\.\.' parts .*; expected gs://bucket/x$"),
    ("gs://bucket/./x", r"expected gs://bucket/x$"),
    ("gs://bucket/a/../b", r"expected gs://bucket/b$"),
    ("gs://bucket/a/../../x", r"expected gs://bucket/<path> without them$"),   # not gs://x
    ("gs://bucket/a/", None),
    ("gs://bucket/", None),
    ("gs.local/run", None),         # a local folder, not a scheme
    ("./gs:/bucket/x", None),
])
def test_check_path_refuses_what_would_mean_another_place(path, expected, gcs_emulator):
    """A store's URL mistyped into a local folder's name, or a bucket path
    with another spelling of the same objects, is one line naming the flag."""
    if expected is None:
        storage.check_path(path)
        return
    with pytest.raises(ValueError, match=expected) as info:
        storage.check_path(path)
    assert str(info.value).startswith(f"model_dir={path!r}")
    assert "\n" not in str(info.value)


def test_check_path_accepts_a_bucket(gcs_emulator):
    # With the emulator: no credentials looked for (a lookup can take 15 s
    # where a metadata server half answers).
    storage.check_path("gs://some-bucket/run")
    storage.check_path(gcs_emulator(), name="export_dir")


# --- Environment ------------------------------------------------------------------


@pytest.fixture
def clean_environment(monkeypatch):
    for name in ("STORAGE_EMULATOR_HOST", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_an_emulator_turns_off_gcsfs_bucket_type_probe(clean_environment):
    clean_environment.setenv("STORAGE_EMULATOR_HOST", "localhost:4443")
    store_clients._configure_environment()
    assert os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] == "false"


def test_environment_keeps_the_users_own_values(clean_environment):
    clean_environment.setenv("STORAGE_EMULATOR_HOST", "http://localhost:4443")
    clean_environment.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "true")
    store_clients._configure_environment()
    assert os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] == "true"


@pytest.mark.parametrize("value", ["", "default"])
def test_environment_without_an_emulator_is_left_alone(clean_environment, value):
    clean_environment.setenv("STORAGE_EMULATOR_HOST", value)
    store_clients._configure_environment()
    assert "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT" not in os.environ


def test_environment_is_set_when_the_module_is_imported(tmp_path):
    """In a new process (the module alone, by its file: no Keras to import)."""
    environment = {k: v for k, v in os.environ.items()
                   if k != "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"}
    environment["STORAGE_EMULATOR_HOST"] = "http://localhost:4443"
    program = ("import importlib.util, json, os, sys\n"
               "spec = importlib.util.spec_from_file_location('s', sys.argv[1])\n"
               "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
               "print(json.dumps({k: os.environ.get(k) for k in ("
               "'GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT', 'EPATH_USE_TF')}))\n")
    output = subprocess.run([sys.executable, "-c", program, storage.__file__], env=environment,
                            capture_output=True, text=True, check=True, timeout=60).stdout
    # Nothing else of the user's process is changed (etils.epath's choice included).
    assert json.loads(output) == {"GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
                                  "EPATH_USE_TF": os.environ.get("EPATH_USE_TF")}


# --- Reading and writing ------------------------------------------------------------


def test_bytes_text_and_json_round_trip(root):
    storage.makedirs(root)
    path = storage.join(root, "a.bin")
    storage.write_bytes(path, b"\x00\x01first")
    assert storage.read_bytes(path) == b"\x00\x01first"
    storage.write_bytes(path, bytearray(b"second"))
    assert storage.read_bytes(path) == b"second"
    storage.write_text(storage.join(root, "t.txt"), "héllo")
    assert storage.read_text(storage.join(root, "t.txt")) == "héllo"
    record = storage.join(root, "record.json")
    storage.write_json(record, {"loss": math.nan, "best": [1.5, math.inf, (2, -math.inf)],
                                "nested": {"x": math.nan, "name": "run"}})
    assert storage.read_json(record) == {"loss": None, "best": [1.5, None, [2, None]],
                                         "nested": {"x": None, "name": "run"}}
    assert "NaN" not in storage.read_text(record)
    # Nothing but the files themselves (no temporary file left beside them).
    assert storage.listdir(root) == ["a.bin", "record.json", "t.txt"]


def test_reading_a_missing_file_is_file_not_found(root):
    storage.makedirs(root)
    path = storage.join(root, "missing.json")
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(path)
    assert not isinstance(_raised(storage.read_json, path), storage.StorageError)


def _raised(function, *args):
    try:
        function(*args)
    except Exception as error:  # noqa: BLE001
        return error
    raise AssertionError(f"{function.__name__}{args} raised nothing")


def test_a_failed_local_write_keeps_the_previous_file(tmp_path):
    path = str(tmp_path / "state.json")
    storage.write_bytes(path, b"previous")
    with pytest.raises(TypeError):
        storage.write_bytes(path, object())  # fails while the file is written
    assert storage.read_bytes(path) == b"previous"
    assert os.listdir(tmp_path) == ["state.json"]


def test_listdir(root):
    storage.makedirs(root)
    for name in ("b.json", "a.json", "sub/c.json", "sub/deeper/d.json"):
        storage.makedirs(storage.dirname(storage.join(root, name)))
        storage.write_bytes(storage.join(root, name), b"{}")
    assert storage.listdir(root) == ["a.json", "b.json", "sub"]
    assert storage.listdir(root + "/") == ["a.json", "b.json", "sub"]
    assert storage.listdir(storage.join(root, "sub")) == ["c.json", "deeper"]
    assert storage.listdir(storage.join(root, "missing")) == []


def test_isfile_isdir_exists_and_kind(root):
    storage.makedirs(storage.join(root, "folder"))
    file, folder = storage.join(root, "folder", "f.txt"), storage.join(root, "folder")
    storage.write_bytes(file, b"x")
    missing = storage.join(root, "missing")
    assert storage.isfile(file) and not storage.isdir(file)
    assert storage.isdir(folder) and not storage.isfile(folder)
    assert not storage.isfile(missing) and not storage.isdir(missing)
    assert storage.exists(file) and storage.exists(folder) and not storage.exists(missing)
    assert storage.kind(file) == "a file"
    assert storage.kind(folder) == "a folder"
    assert storage.kind(missing) == "missing"
    assert not storage.islink(file)


def test_kind_of_local_links_and_fifos(tmp_path):
    target = tmp_path / "target"
    target.write_bytes(b"x")
    (tmp_path / "link").symlink_to(target)
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    assert storage.kind(str(tmp_path / "link")) == f"a symbolic link to {target}"
    assert storage.kind(str(tmp_path / "dangling")) == \
        f"a symbolic link to {tmp_path / 'gone'}, which does not exist"
    assert storage.islink(str(tmp_path / "link"))
    assert not storage.isfile(str(tmp_path / "link"))
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo")
        assert storage.kind(str(tmp_path / "fifo")) == "a FIFO"
        assert not storage.isfile(str(tmp_path / "fifo"))


def test_remove_and_rmtree(root):
    storage.makedirs(storage.join(root, "tree", "sub"))
    path = storage.join(root, "a.txt")
    storage.write_bytes(path, b"x")
    storage.remove(path)
    assert not storage.exists(path)
    storage.remove(path)  # missing: nothing to do
    with pytest.raises(FileNotFoundError):
        storage.remove(path, missing_ok=False)
    storage.write_bytes(storage.join(root, "tree", "b.txt"), b"y")
    storage.write_bytes(storage.join(root, "tree", "sub", "c.txt"), b"z")
    storage.write_bytes(storage.join(root, "kept.txt"), b"k")
    storage.rmtree(storage.join(root, "tree"))
    assert storage.listdir(root) == ["kept.txt"]
    storage.rmtree(storage.join(root, "tree"))  # missing: nothing to do


def test_rename_folder_moves_every_file_and_only_the_folder(root):
    for name, data in (("ckpt_1/a", b"a"), ("ckpt_1/sub/b", b"b"), ("ckpt_12/c", b"c")):
        storage.makedirs(storage.dirname(storage.join(root, name)))
        storage.write_bytes(storage.join(root, name), data)
    storage.rename_folder(storage.join(root, "ckpt_1"), storage.join(root, "ckpt_1.unread"))
    assert storage.list_files(root) == ["ckpt_1.unread/a", "ckpt_1.unread/sub/b", "ckpt_12/c"]
    assert storage.read_bytes(storage.join(root, "ckpt_1.unread", "sub", "b")) == b"b"


def test_rename(root):
    storage.makedirs(root)
    source, target = storage.join(root, "a.tmp"), storage.join(root, "a.json")
    storage.write_bytes(source, b"new")
    storage.write_bytes(target, b"old")
    storage.rename(source, target)
    assert storage.read_bytes(target) == b"new"
    assert not storage.exists(source)
    assert storage.listdir(root) == ["a.json"]
    with pytest.raises(FileNotFoundError):
        storage.rename(source, target)
    assert storage.read_bytes(target) == b"new"


def test_upload_tree_uploads_only_what_changed(root, tmp_path, monkeypatch):
    uploaded = []
    original = storage.upload

    def counting(local_path, path):
        uploaded.append(os.path.relpath(local_path, local).replace(os.sep, "/"))
        original(local_path, path)

    monkeypatch.setattr(storage, "upload", counting)
    local = str(tmp_path / "logs")
    _write_files(local, {"events.1": b"aa", "train/events.2": b"bbb"})
    storage.makedirs(root)
    storage.makedirs(storage.join(root, "train"))  # local targets: the folders exist
    stamps = storage.upload_tree(local, root)
    assert sorted(uploaded) == ["events.1", "train/events.2"]
    assert {r: size for r, (size, _) in stamps.items()} == {"events.1": 2, "train/events.2": 3}
    assert storage.read_bytes(storage.join(root, "train", "events.2")) == b"bbb"

    uploaded.clear()
    assert storage.upload_tree(local, root, stamps) == stamps
    assert uploaded == []

    _write_files(local, {"train/events.2": b"bbbbb", "events.3": b"c"})
    storage.upload_tree(local, root, stamps)
    assert sorted(uploaded) == ["events.3", "train/events.2"]
    assert {r: size for r, (size, _) in stamps.items()} == {
        "events.1": 2, "train/events.2": 5, "events.3": 1}
    assert storage.read_bytes(storage.join(root, "train", "events.2")) == b"bbbbb"
    assert storage.listdir(root) == ["events.1", "events.3", "train"]

    # A rewrite of the same length (Keras Tuner's JSON files) is uploaded too;
    # the files named last go after the others, in that order.
    uploaded.clear()
    os.utime(os.path.join(local, "events.1"), ns=(1, 1))
    _write_files(local, {"events.3": b"d"})
    os.utime(os.path.join(local, "events.3"), ns=(2, 2))  # a clock's tick may be coarse
    storage.upload_tree(local, root, stamps, last=("events.3", "events.1"))
    assert uploaded == ["events.3", "events.1"]
    assert storage.read_bytes(storage.join(root, "events.3")) == b"d"


def test_staged_file_and_folder(root):
    storage.makedirs(root)
    path = storage.join(root, "model.keras")
    with storage.staged(path) as local:
        assert not storage.is_remote(local)
        with open(local, "wb") as f:
            f.write(b"weights")
    assert storage.read_bytes(path) == b"weights"

    folder = storage.join(root, "saved_model")
    storage.makedirs(folder)
    with storage.staged(folder) as local:
        _write_files(local, {"saved_model.pb": b"pb", "variables/variables.index": b"ix"})
    assert storage.listdir(folder) == ["saved_model.pb", "variables"]
    assert storage.read_bytes(storage.join(folder, "variables", "variables.index")) == b"ix"


def test_staged_uploads_nothing_after_an_error(bucket_root):
    path = storage.join(bucket_root, "model.keras")
    with pytest.raises(RuntimeError):
        with storage.staged(path) as local:
            with open(local, "wb") as f:
                f.write(b"half")
            raise RuntimeError("export failed")
    assert not storage.exists(path)
    assert not os.path.exists(local)


def test_local_copy(root):
    storage.makedirs(root)
    path = storage.join(root, "model")
    storage.write_bytes(path, b"model bytes")
    with storage.local_copy(path, suffix=".keras") as local:
        assert not storage.is_remote(local)
        with open(local, "rb") as f:
            assert f.read() == b"model bytes"
        if storage.is_remote(root):
            assert local.endswith("model.keras")
        else:
            assert local == path
    if storage.is_remote(root):
        assert not os.path.exists(local)


# --- Exclusive creation and generations ----------------------------------------------


def test_create_new_is_exclusive(root):
    storage.makedirs(root)
    path = storage.join(root, "lock")
    assert storage.create_new(path, b"first") is True
    assert storage.create_new(path, b"second") is False
    assert storage.read_bytes(path) == b"first"
    storage.remove(path)
    assert storage.create_new(path, b"third") is True
    assert storage.read_bytes(path) == b"third"


def test_create_new_racing_threads_one_wins(root):
    storage.makedirs(root)
    path = storage.join(root, "lock")
    count = 8
    barrier = threading.Barrier(count)
    results, errors = [None] * count, []

    def contend(index):
        try:
            barrier.wait(timeout=10)
            results[index] = storage.create_new(path, f"run {index}".encode())
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert results.count(True) == 1 and results.count(False) == count - 1
    assert storage.read_bytes(path) == f"run {results.index(True)}".encode()


def test_generation_changes_when_the_file_is_rewritten(root):
    storage.makedirs(root)
    path = storage.join(root, "lock")
    assert storage.generation(path) is None
    storage.write_bytes(path, b"one")
    first = storage.generation(path)
    assert first is not None
    assert storage.generation(path) == first  # unchanged: the same answer
    storage.write_bytes(path, b"two")
    second = storage.generation(path)
    assert second is not None and second != first
    storage.remove(path)
    assert storage.generation(path) is None


# --- Errors ------------------------------------------------------------------------


@pytest.mark.parametrize("operation", ["read", "write", "listdir"])
def test_a_missing_bucket_is_one_line_naming_it(gcs_emulator, operation):
    path = f"{MISSING_BUCKET}/run/state.json"
    call = {"read": lambda: storage.read_bytes(path),
            "write": lambda: storage.write_bytes(path, b"x"),
            "listdir": lambda: storage.listdir(f"{MISSING_BUCKET}/run")}[operation]
    with pytest.raises(storage.StorageError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    assert f"the bucket {MISSING_BUCKET} does not exist" in message


def test_check_writable_on_a_missing_bucket(gcs_emulator):
    with pytest.raises(ValueError) as info:
        storage.check_writable(f"{MISSING_BUCKET}/run")
    message = str(info.value)
    assert message.startswith(f"model_dir='{MISSING_BUCKET}/run' cannot be written")
    assert f"the bucket {MISSING_BUCKET} does not exist" in message
    assert "\n" not in message


def test_check_writable_leaves_nothing(root):
    storage.check_writable(root)
    assert storage.listdir(root) == []
    if not storage.is_remote(root):
        assert os.path.isdir(root)


def test_check_writable_refuses_a_folder_under_a_file(tmp_path):
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"^model_dir='.*file/run' is not a writable directory"):
        storage.check_writable(str(tmp_path / "file" / "run"))


def test_free_bytes(tmp_path):
    assert storage.free_bytes(str(tmp_path / "not" / "yet")) > 0
    assert storage.free_bytes("gs://some-bucket/run") is None


# --- The emulator itself ---------------------------------------------------------------


def test_emulator_refuses_a_stale_generation(bucket_root):
    """tests/gcs_emulator.py answers ifGenerationMatch=N as GCS does (412)."""
    path = storage.join(bucket_root, "state")
    storage.write_bytes(path, b"one")
    current = storage.generation(path)
    filesystem = storage._fs(path)
    bucket, key, _ = filesystem.split_path(path)
    stale = str(int(current) - 1)
    upload = f"{filesystem._location}/upload/storage/v1/b/{bucket}/o"
    body = b"two"
    with pytest.raises(FileExistsError):
        filesystem.call("POST", upload, uploadType="media", name=key, ifGenerationMatch=stale,
                        data=body, headers={"Content-Type": "application/octet-stream"})
    assert storage.read_bytes(path) == b"one"
    filesystem.call("POST", upload, uploadType="media", name=key, ifGenerationMatch=current,
                    data=body, headers={"Content-Type": "application/octet-stream"})
    assert storage.read_bytes(path) == b"two"


def test_the_emulator_gets_no_bucket_probe(bucket_root):
    """gcsfs, imported before STORAGE_EMULATOR_HOST was set (here: by the
    fixture), chose its experimental class, whose probe of each bucket over
    gRPC an emulator never answers: the store's client is the plain one."""
    assert type(store_clients.filesystem(storage.scheme(bucket_root))).__module__ == "gcsfs.core"


def test_local_generation_changes_within_one_clock_tick(tmp_path):
    """A file system's clock may tick once in a few milliseconds: a rewrite
    that keeps the modification time is still a new generation."""
    path = str(tmp_path / "lock")
    storage.write_bytes(path, b"one")
    first, mtime = storage.generation(path), os.stat(path).st_mtime_ns
    storage.write_bytes(path, b"two")
    os.utime(path, ns=(mtime, mtime))  # as a coarse clock would have it
    assert storage.generation(path) != first


@pytest.mark.parametrize("where", ["local", "bucket"])
def test_remove_if_unchanged_removes_only_the_version_that_was_read(where, tmp_path,
                                                                   gcs_emulator):
    base = str(tmp_path) if where == "local" else gcs_emulator("unchanged")
    path = storage.join(base, "lock")
    storage.write_bytes(path, b"first")
    read = storage.generation(path)
    storage.write_bytes(path, b"second")          # another process rewrote it
    assert storage.remove_if_unchanged(path, read) is False
    assert storage.read_bytes(path) == b"second"
    assert storage.remove_if_unchanged(path, storage.generation(path)) is True
    assert not storage.exists(path)
    assert storage.remove_if_unchanged(path, read) is False   # gone: nothing to remove


def test_rmtree_and_rename_take_names_literally(gcs_emulator):
    base = gcs_emulator("literal")
    for name in ("exp1/a", "exp2/a", "exp[12]/a"):
        storage.write_bytes(storage.join(base, name), name.encode())
    storage.rename(storage.join(base, "exp[12]/a"), storage.join(base, "exp[12]/b"))
    storage.rmtree(storage.join(base, "exp[12]"))
    assert storage.list_files(base) == ["exp1/a", "exp2/a"]
    assert storage.read_bytes(storage.join(base, "exp1/a")) == b"exp1/a"


def test_a_model_starts_from_weights_in_a_bucket(gcs_emulator, tmp_path):
    import keras
    import numpy as np

    from keras_identity import models

    source = models.highway_net(depth=3, input_shape=(8, 8, 1), num_classes=3)
    local = str(tmp_path / "source.keras")
    source.save(local)
    remote = storage.join(gcs_emulator("weights"), "source.keras")
    storage.upload(local, remote)
    target = models.highway_net(depth=3, input_shape=(8, 8, 1), num_classes=3,
                                weights=remote)
    assert all(np.array_equal(a, b) for a, b in zip(source.get_weights(), target.get_weights()))
    with pytest.raises(ValueError, match=r"weights='gs://.*/missing.keras' does not exist"):
        models.highway_net(depth=3, input_shape=(8, 8, 1), num_classes=3,
                           weights=storage.join(gcs_emulator("weights"), "missing.keras"))
    keras.backend.clear_session()


def test_the_clients_logs_of_errors_they_raise_are_dropped(bucket_root, caplog):
    import logging

    storage.exists(bucket_root)   # the client made: its filters installed
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler = Keep(level=logging.DEBUG)
    for name in ("gcsfs", "fsspec.prefetcher"):
        logging.getLogger(name).addHandler(handler)
    try:
        try:
            raise ConnectionError("Cannot connect to host localhost:1")
        except ConnectionError as error:
            # gcsfs logs these with a traceback, then raises them to the caller.
            logging.getLogger("gcsfs").exception(f"_request out of retries on exception: {error}")
            logging.getLogger("gcsfs").exception(f"_request non-retriable exception: {error}")
            logging.getLogger("fsspec.prefetcher").exception("Consumer caught an error.")
            logging.getLogger("gcsfs").error("something else went wrong")
        logging.getLogger("gcsfs").warning("_request out of retries, a warning")
    finally:
        for name in ("gcsfs", "fsspec.prefetcher"):
            logging.getLogger(name).removeHandler(handler)
    assert records == ["something else went wrong", "_request out of retries, a warning"]
