"""keras_identity.training.checkpoints (and the file layer under it): files written whole."""

import pytest


def test_write_json_is_whole_or_absent_and_valid_json(tmp_path, monkeypatch):
    import json

    from keras_identity import storage

    path = str(tmp_path / "history.json")
    storage.write_json(path, [{"loss": float("nan"), "test_error": float("inf"),
                                   "step": 3}])
    text = open(path).read()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == [{"loss": None, "test_error": None, "step": 3}]

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(json, "dumps", full_disk)
    with pytest.raises(OSError):
        storage.write_json(path, {"step": 4})
    monkeypatch.undo()
    assert json.loads(open(path).read())[0]["step"] == 3   # the previous file, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["history.json"]
