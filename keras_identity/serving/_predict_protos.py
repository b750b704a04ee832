"""TF Serving's predict messages without ``tensorflow-serving-api``.

The package cannot be a dependency (it pulls ``tensorflow`` beside
``tensorflow-cpu``), yet an export writes ``PredictionLog`` warm-up records
and replays them.  The five messages involved are small and public
(``tensorflow_serving/apis/model.proto``, ``predict.proto`` and
``prediction_log.proto``), so they are declared here, with the same field
numbers, as a ``FileDescriptorProto`` and turned into message classes by
``google.protobuf`` at import.  That keeps the real message API
(``request.model_spec.name``, ``request.inputs[...]``, ``FromString``), so
the writer, reader and emulator run the same code either way, which
hand-encoding the wire format would not give.

Only the fields an export uses are declared; a record with others still
parses (protobuf keeps unknown fields).  The messages live in the proto
package ``keras_identity.serving``, not ``tensorflow.serving``: the bytes
are the same (the wire has field numbers, not names) and they do not clash
with the real package when both are imported.
"""

from google.protobuf import descriptor_pb2
from google.protobuf import descriptor_pool
from google.protobuf import message_factory
from tensorflow.core.framework import tensor_pb2

_PACKAGE = "keras_identity.serving"
_Field = descriptor_pb2.FieldDescriptorProto


def _field(name, number, type_name=None, repeated=False):
    """A string field, or a message field of ``type_name`` (a full name)."""
    field = _Field(name=name, number=number,
                   label=_Field.LABEL_REPEATED if repeated else _Field.LABEL_OPTIONAL,
                   type=_Field.TYPE_MESSAGE if type_name else _Field.TYPE_STRING)
    if type_name:
        field.type_name = "." + type_name
    return field


def _tensor_map(message, name, number):
    """``map<string, tensorflow.TensorProto> name = number;`` in ``message``."""
    entry = "".join(part.capitalize() for part in name.split("_")) + "Entry"
    message.nested_type.add(name=entry, field=[_field("key", 1), _field(
        "value", 2, "tensorflow.TensorProto")]).options.map_entry = True
    message.field.append(_field(name, number, f"{_PACKAGE}.{message.name}.{entry}",
                                repeated=True))


def _file():
    file = descriptor_pb2.FileDescriptorProto(
        name="keras_identity/serving/predict_protos.proto", package=_PACKAGE,
        syntax="proto3", dependency=[tensor_pb2.DESCRIPTOR.name])
    spec = f"{_PACKAGE}.ModelSpec"
    file.message_type.add(name="ModelSpec", field=[       # model.proto
        _field("name", 1), _field("signature_name", 3)])
    request = file.message_type.add(name="PredictRequest", field=[   # predict.proto
        _field("model_spec", 1, spec)])
    _tensor_map(request, "inputs", 2)
    request.field.append(_field("output_filter", 3, repeated=True))
    response = file.message_type.add(name="PredictResponse")
    _tensor_map(response, "outputs", 1)
    response.field.append(_field("model_spec", 2, spec))
    file.message_type.add(name="PredictLog", field=[     # prediction_log.proto
        _field("request", 1, f"{_PACKAGE}.PredictRequest"),
        _field("response", 2, f"{_PACKAGE}.PredictResponse")])
    file.message_type.add(name="PredictionLog", field=[
        _field("predict_log", 6, f"{_PACKAGE}.PredictLog")])
    return file


def _classes():
    pool = descriptor_pool.Default()   # holds tensorflow.TensorProto
    file = _file()
    try:
        pool.FindFileByName(file.name)
    except KeyError:
        pool.AddSerializedFile(file.SerializeToString())
    get_class = getattr(message_factory, "GetMessageClass", None) or (   # protobuf < 4.22
        message_factory.MessageFactory(pool).GetPrototype)
    return {name: get_class(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}")) for name in (
        "ModelSpec", "PredictRequest", "PredictResponse", "PredictLog", "PredictionLog")}


_CLASSES = _classes()
ModelSpec = _CLASSES["ModelSpec"]
PredictRequest = _CLASSES["PredictRequest"]
PredictResponse = _CLASSES["PredictResponse"]
PredictLog = _CLASSES["PredictLog"]
PredictionLog = _CLASSES["PredictionLog"]
