"""Warm-up records without tensorflow-serving-api (issue 61, case 7): the
package is not a dependency, so an export after ``pip install ".[cpu]"``
writes and replays them with the messages of ``serving._predict_protos``."""

import subprocess
import sys

import pytest
tf = pytest.importorskip("tensorflow")  # TensorFlow-only module

from keras_identity.serving import warmup  # noqa: E402
from tests.conftest import REPO  # noqa: E402

pytestmark = pytest.mark.needs_tensorflow

# tensorflow_serving cannot be imported (None in sys.modules), as after
# pip install ".[cpu]".
WITHOUT_SERVING_API = r"""
import sys
sys.modules["tensorflow_serving"] = None
from keras_identity.serving import warmup
predict_pb2, _ = warmup.serving_apis()
assert predict_pb2.__name__ == "keras_identity.serving._predict_protos", predict_pb2
warmup.write_warmup(sys.argv[1], warmup.build_requests("pre11", 8, 6, 3))
requests = warmup.read_warmup(sys.argv[1])
print(",".join(f"{r.model_spec.name}:{r.model_spec.signature_name}:{sorted(r.inputs)}"
               for r in requests))
"""


def records(version_dir):
    path = f"{version_dir}/{warmup.WARMUP_FILE}"
    return [record.numpy() for record in tf.data.TFRecordDataset(path)]


def test_warmup_records_without_the_serving_api(tmp_path):
    result = subprocess.run([sys.executable, "-c", WITHOUT_SERVING_API, str(tmp_path / "a")],
                            cwd=REPO, text=True, capture_output=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[-1] == (
        "pre11:serving_default:['images'],pre11:serving_uint8:['images'],"
        "pre11:serving_bytes:['image_bytes']")
    written = records(tmp_path / "a")
    assert len(written) == 3
    # Where the package is installed: the same bytes as its messages give.
    pytest.importorskip("tensorflow_serving")
    from tensorflow_serving.apis import prediction_log_pb2

    predict_pb2, _ = warmup.serving_apis()
    assert predict_pb2.__name__ == "tensorflow_serving.apis.predict_pb2"
    warmup.write_warmup(str(tmp_path / "b"), warmup.build_requests("pre11", 8, 6, 3))
    assert written == records(tmp_path / "b")
    for record, request in zip(written, warmup.read_warmup(str(tmp_path / "b"))):
        log = prediction_log_pb2.PredictionLog.FromString(record)
        assert log.WhichOneof("log_type") == "predict_log"
        assert log.predict_log.request == request


def test_stand_in_messages_match_the_serving_api():
    """Request and response: the same bytes both ways, with every field the
    emulator reads or writes."""
    import numpy as np

    from keras_identity.serving import _predict_protos as ours

    pytest.importorskip("tensorflow_serving")
    from tensorflow_serving.apis import predict_pb2

    tensor = tf.make_tensor_proto(np.arange(12, dtype=np.uint8).reshape(1, 2, 2, 3))
    pairs = []
    for module in (ours, predict_pb2):
        request = module.PredictRequest()
        request.model_spec.name = "pre11"
        request.model_spec.signature_name = "serving_uint8"
        request.inputs["images"].CopyFrom(tensor)
        request.output_filter.append("probabilities")
        response = module.PredictResponse()
        response.model_spec.CopyFrom(request.model_spec)
        response.outputs["probabilities"].CopyFrom(tensor)
        pairs.append((request.SerializeToString(), response.SerializeToString()))
    assert pairs[0] == pairs[1]
    parsed = ours.PredictRequest.FromString(pairs[1][0])
    assert parsed.model_spec.signature_name == "serving_uint8"
    assert parsed.output_filter == ["probabilities"]
    np.testing.assert_array_equal(tf.make_ndarray(parsed.inputs["images"]),
                                  tf.make_ndarray(tensor))
