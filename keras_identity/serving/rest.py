"""TF Serving's REST API request and response formats.

``POST /v1/models/<name>:predict`` takes either the row format

    {"signature_name": "serving_bytes",
     "instances": [{"image_bytes": {"b64": "..."}}, ...]}

(one entry per example; a lone input may drop its name:
``"instances": [{"b64": "..."}]``) or the columnar format

    {"signature_name": "serving_default", "inputs": {"images": [[[[...]]]]}}

and answers ``{"predictions": [...]}`` (one entry per example, a dict of
outputs) or ``{"outputs": {...}}``.  JSON numbers become tensors of the
signature's dtype; ``{"b64": ...}`` objects become bytes for string
inputs.  String outputs are returned as UTF-8 text.
"""

import base64

import numpy as np
import tensorflow as tf

from keras_identity.serving.emulator import InvalidArgument


def _invalid(message):
    return InvalidArgument(None, None, message)


def _decode(value, dtype):
    """JSON value -> numpy array of the signature's dtype."""
    def convert(item):
        if isinstance(item, dict):
            if set(item) != {"b64"}:
                raise _invalid(f"JSON object {sorted(item)} is not valid here; only "
                               f"{{\"b64\": ...}} is")
            try:
                return base64.b64decode(item["b64"], validate=True)
            except (ValueError, TypeError):
                raise _invalid("the \"b64\" value is not valid base64") from None
        if isinstance(item, list):
            return [convert(i) for i in item]
        if isinstance(item, str):
            return item.encode("utf-8")
        return item

    value = convert(value)
    if dtype == tf.string:
        return np.array(value, dtype=object)
    try:
        return np.array(value, dtype=dtype.as_numpy_dtype)
    except (ValueError, TypeError):
        raise _invalid(f"the JSON values cannot be converted to {dtype.name}") from None


def request_to_inputs(body, input_dtypes):
    """Converts a REST request body (dict) to ``(signature_name, inputs, row)``."""
    if not isinstance(body, dict):
        raise _invalid("the request body must be a JSON object")
    signature = body.get("signature_name", "serving_default")
    if ("instances" in body) == ("inputs" in body):
        raise _invalid("the request must have exactly one of \"instances\" (row format) "
                       "or \"inputs\" (columnar format)")
    names = sorted(input_dtypes)
    if "instances" in body:
        instances = body["instances"]
        if not isinstance(instances, list) or not instances:
            raise _invalid("\"instances\" must be a non-empty list")
        named = all(isinstance(i, dict) and set(i) <= set(names) and "b64" not in i
                    for i in instances)
        if not named:
            if len(names) != 1:
                raise _invalid(f"instances must name the inputs {names}")
            instances = [{names[0]: i} for i in instances]
        inputs = {n: _decode([i.get(n) for i in instances], input_dtypes[n]) for n in names}
        return signature, inputs, True
    columns = body["inputs"]
    if not isinstance(columns, dict) or (len(names) == 1 and names[0] not in columns):
        columns = {names[0]: columns} if len(names) == 1 else columns
    return signature, {n: _decode(v, input_dtypes[n]) for n, v in columns.items()}, False


def _jsonable(value):
    if value.dtype == object:
        return np.vectorize(lambda b: b.decode("utf-8", "replace"), otypes=[object])(
            value).tolist()
    return value.tolist()


def outputs_to_response(outputs, row):
    if row:
        batch = len(next(iter(outputs.values())))
        rows = [{name: _jsonable(np.asarray(value[i])) for name, value in outputs.items()}
                for i in range(batch)]
        return {"predictions": rows}
    return {"outputs": {name: _jsonable(np.asarray(v)) for name, v in outputs.items()}}


def predict(emulator, body):
    """Answers a REST predict request body (dict) with a response dict."""
    signature = body.get("signature_name", "serving_default") if isinstance(body, dict) \
        else None
    dtypes = emulator.input_dtypes(signature)
    signature, inputs, row = request_to_inputs(body, dtypes)
    return outputs_to_response(emulator.run(signature, inputs), row)
