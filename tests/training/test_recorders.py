"""What a run records (keras_identity.training.recorders): TensorBoard
scalars written without TensorFlow."""

import pytest

from keras_identity.training import recorders


def test_epoch_summaries_write_train_and_validation_scalars(tmp_path):
    from tensorboard.backend.event_processing import event_accumulator

    writer = recorders.EpochSummaries(str(tmp_path))
    writer.on_epoch_end(0, {"loss": 2.5, "accuracy": 0.25, "val_loss": 2.0,
                            "val_accuracy": 0.5})
    writer.on_epoch_end(1, {"loss": 1.5, "accuracy": 0.5, "val_loss": 1.0,
                            "val_accuracy": 0.75})
    writer.on_train_end()
    for run, expected in (("train", {"epoch_loss": [2.5, 1.5], "epoch_accuracy": [0.25, 0.5]}),
                          ("validation", {"epoch_loss": [2.0, 1.0],
                                          "epoch_accuracy": [0.5, 0.75]})):
        events = event_accumulator.EventAccumulator(str(tmp_path / run))
        events.Reload()
        assert sorted(events.Tags()["scalars"]) == sorted(expected)
        for tag, values in expected.items():
            scalars = events.Scalars(tag)
            assert [s.step for s in scalars] == [0, 1]
            assert [s.value for s in scalars] == pytest.approx(values)
