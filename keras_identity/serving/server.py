r"""A loopback stand-in for tensorflow_model_server (``keras-identity-serve``):
TF Serving's REST API (:func:`make_rest_handler`, :func:`route`) and gRPC
Predict (:func:`start_grpc`), answered by a
:class:`~keras_identity.serving.emulator.ServingEmulator`.  A predict body
(:func:`predict`) is the row format ``{"instances": [{"image_bytes": {"b64":
"..."}}]}`` (a lone input may drop its name) or the columnar ``{"inputs":
{...}}``, answered ``{"predictions": [...]}`` or ``{"outputs": {...}}``.
It holds load as a server does (:class:`BoundedHTTPServer`: workers, a
bounded queue, 503 beyond, one read deadline, 408 beyond) and frames bodies
as a careful HTTP/1.1 server (:func:`body_framing`): anything ambiguous is
refused and the connection closed.
"""

import base64
import io
import json
import re
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler
from http.server import HTTPServer

import numpy as np
import tensorflow as tf

from keras_identity.serving.emulator import InvalidArgument
from keras_identity.serving.warmup import serving_apis


def _invalid(message):
    return InvalidArgument(None, None, message)


def _decode(value, dtype):
    """JSON value -> numpy array of the signature's dtype (JSON true/false
    refused, as strings are for numbers)."""
    expected = 'strings or {"b64": ...}' if dtype == tf.string else "numbers"

    def convert(item):
        if isinstance(item, dict):
            if set(item) != {"b64"}:
                raise _invalid(f"JSON object {sorted(item)} is not valid here; only "
                               f"{{\"b64\": ...}} is")
            try:
                return base64.b64decode(item["b64"], validate=True)
            except (ValueError, TypeError):
                raise _invalid("the \"b64\" value is not valid base64") from None
        if isinstance(item, bool):  # JSON true/false: neither a number nor bytes
            raise _invalid(f"the JSON value {str(item).lower()} is not valid input; "
                           f"expected {expected}")
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


class BoundedHTTPServer(HTTPServer):
    """An HTTP server that slow clients cannot hold up.

    Every accepted connection is read by a thread of its own, under one
    deadline for the whole request (``read_timeout_s``: request line, headers
    and body), and only a request read in full takes one of ``workers``
    slots to run the model; so a client that trickles its bytes holds a
    thread of its own for at most the deadline and no worker at all.  At most
    ``workers + max_queued`` connections are open at once; beyond, the
    accepting thread answers 503 at once rather than letting the connection
    be reset.  ``request_queue_size`` is the listen backlog.
    """

    daemon_threads = True

    def __init__(self, address, handler, *, workers=4, max_queued=256, backlog=1024):
        self.request_queue_size = backlog
        self.model_slots = threading.BoundedSemaphore(workers)
        self._connections = threading.BoundedSemaphore(workers + max_queued)
        super().__init__(address, handler)

    def process_request(self, request, client_address):
        if not self._connections.acquire(blocking=False):
            try:
                body = b'{"error": "the server is busy; retry later"}'
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: "
                                b"application/json\r\nRetry-After: 1\r\nContent-Length: "
                                + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n"
                                + body)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            threading.Thread(target=self._work, args=(request, client_address),
                             daemon=True).start()
        except RuntimeError:  # no thread to be had: refuse this one, keep serving
            self.shutdown_request(request)
            self._connections.release()

    def _work(self, request, client_address):
        try:
            self.finish_request(request, client_address)
        except Exception:  # a client that went away; the server keeps serving
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            self._connections.release()

    def handle_error(self, request, client_address):
        pass


class _DeadlineReader(io.RawIOBase):
    """A socket's reads under one deadline: each read may wait only for what
    is left of it, so a client sending a byte at a time cannot stretch it."""

    def __init__(self, connection, seconds):
        self._connection = connection
        self._deadline = time.monotonic() + seconds
        self.timed_out = False

    def readable(self):
        return True

    def readinto(self, buffer):
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            self.timed_out = True
            raise TimeoutError("the request was not complete within its deadline")
        self._connection.settimeout(remaining)
        try:
            return self._connection.recv_into(buffer)
        except TimeoutError:
            self.timed_out = True
            raise


class _LineRecorder:
    """A reader's readline that keeps each line it returns in ``lines``."""

    def __init__(self, reader):
        self._reader, self.lines = reader, []

    def readline(self, limit=-1):
        line = self._reader.readline(limit)
        self.lines.append(line)
        return line



class FramingError(Exception):
    """A request whose body cannot be delimited for sure: answered ``code``
    with ``message`` (one line) and its connection closed, since where the
    next request would start is unknown (the request-smuggling class of bugs)."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code, self.message = code, message


# A header line as RFC 9112 has it: field-name ":" OWS field-value OWS, the name
# an RFC 9110 token and the value visible characters (obs-text included),
# spaces and tabs.  Anything else is refused, not left to the email parser
# under http.client.parse_headers: it drops a line it cannot parse (a space
# before the colon, no colon) and every header after it, joins obs-fold lines,
# and str.strip() takes VT and FF for whitespace.
_FIELD_NAME = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FIELD_VALUE = re.compile(rb"[\t\x20-\x7e\x80-\xff]*")
_OWS = " \t"


def check_header_lines(lines):
    """Raises FramingError (400) for the first of the request's raw header
    ``lines`` (bytes, each with its line ending; the blank line that ends them
    may be included) that is not ``name: value``: a line that starts with a
    space or tab (obs-fold, which RFC 9112 lets a server refuse), a line with
    no colon, a name that is not a token (a space before the colon), or a
    value with a control character other than HTAB."""
    for line in lines:
        field = line.removesuffix(b"\n").removesuffix(b"\r")
        if not field:
            continue  # the blank line after the headers
        if field[:1] in (b" ", b"\t"):
            raise FramingError(400, f"the header line {line[:40]!r} starts with a space or "
                                    f"tab (an obs-fold continuation line), which is refused; "
                                    f"send each header on one line as 'name: value'")
        name, colon, value = field.partition(b":")
        if not colon:
            raise FramingError(400, f"the header line {line[:40]!r} has no colon; expected "
                                    f"'name: value'")
        if not _FIELD_NAME.fullmatch(name):
            raise FramingError(400, f"the header name {name[:40]!r} is not valid; expected a "
                                    f"token (letters, digits, !#$%&'*+-.^_`|~) right before "
                                    f"the colon, no spaces")
        if not _FIELD_VALUE.fullmatch(value):
            value = value.strip(_OWS.encode())
            raise FramingError(400, f"the {name.decode()} header's value {value[:40]!r} has a "
                                    f"control character; only visible characters, spaces "
                                    f"and tabs are allowed")


def body_framing(headers, max_body_bytes, http10=False):
    """How a POST's body is delimited: its size in bytes (one Content-Length)
    or ``"chunked"`` (Transfer-Encoding: chunked alone).  Anything else raises
    FramingError: two Content-Length headers, equal or not (400: which one
    frames the body is what smuggling plays on); Content-Length with
    Transfer-Encoding (400); a coding other than chunked (501); neither header
    (411); a Content-Length that is not a size (400) or is over
    ``max_body_bytes`` (413); Transfer-Encoding in an HTTP/1.0 request (400,
    as RFC 9112 asks).  Values are read with only spaces and tabs (OWS)
    around them dropped: ``"\x0bchunked"`` is not chunked."""
    lengths = headers.get_all("Content-Length") or []
    codings = headers.get_all("Transfer-Encoding") or []
    if lengths and codings:
        raise FramingError(400, "Transfer-Encoding and Content-Length together are refused "
                                "(they could frame the body differently); send one of them")
    if len(lengths) > 1:
        values = ", ".join(repr(value[:20]) for value in lengths)
        raise FramingError(400, f"{len(lengths)} Content-Length headers ({values}) are "
                                f"refused, equal or not; send exactly one")
    if codings:
        value = ", ".join(coding.strip(_OWS) for coding in codings)
        if [token.strip(_OWS).lower() for token in value.split(",")] != ["chunked"]:
            raise FramingError(501, f"Transfer-Encoding {value[:100]!r} is not implemented; "
                                    f"only 'chunked' is (or send a Content-Length)")
        if http10:
            raise FramingError(400, "Transfer-Encoding in an HTTP/1.0 request is refused; "
                                    "send a Content-Length")
        return "chunked"
    if not lengths:
        raise FramingError(411, "a POST needs a Content-Length header (the body's size in "
                                "bytes) or Transfer-Encoding: chunked")
    declared = lengths[0]
    if not re.fullmatch(r"[0-9]+", declared.strip(_OWS)):
        raise FramingError(400, f"Content-Length {declared!r} is not valid; expected the "
                                f"body's size in bytes")
    size = int(declared.strip(_OWS))
    if size > max_body_bytes:
        raise FramingError(413, f"Content-Length {size} is over the server's limit "
                                f"of {max_body_bytes} bytes")
    return size


# A chunk's size line: hexadecimal digits, then optional ;extensions (ignored),
# then CRLF.  No leading spaces and no bare LF: what one parser takes and the
# next does not is what request smuggling is made of.
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*(?:;[^\r\n]*)?\r\n")
_MAX_LINE = 8192     # bytes in a chunk's size line or a trailer line
_MAX_TRAILERS = 100


_MODEL_URL = re.compile(r"/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>[^/:]+)|"
                        r"/labels/(?P<label>[^/:]+))?(?P<verb>:predict|/metadata)?")


def route(method, path, model_name, version):
    """``(None, kind)`` for a request this server answers (kind: ``"status"``,
    ``"metadata"`` or ``"predict"``), else ``(404, message)`` in TF Serving's
    words."""
    match = _MODEL_URL.fullmatch(path)
    verb = match and match["verb"]
    if not match or (method == "POST") != (verb == ":predict"):
        return 404, f"Malformed request: {method} {path}"
    name, asked, label = match["name"], match["version"], match["label"]
    if label is not None:
        return 404, f"Unrecognized servable version label: {label}"
    if name != model_name or (asked is not None and not (
            re.fullmatch(r"[0-9]{1,18}", asked) and int(asked) == int(version))):
        if verb is None:  # the model status API
            return 404, (f"Could not find version {asked} of model {name}" if asked
                         and name == model_name else f"Could not find any versions of model "
                         f"{name}")
        spec = f"Specific({name}, {asked})" if asked else f"Latest({name})"
        return 404, f"Servable not found for request: {spec}"
    return None, {None: "status", "/metadata": "metadata", ":predict": "predict"}[verb]


def make_rest_handler(emulator, model_name, version, read_timeout_s=10.0,
                      max_body_bytes=64 * 2 ** 20):
    class Handler(BaseHTTPRequestHandler):
        timeout = read_timeout_s

        def setup(self):
            super().setup()
            self.rfile.close()
            # One deadline for the whole request (see BoundedHTTPServer).
            self._reader = _DeadlineReader(self.connection, read_timeout_s)
            self.rfile = io.BufferedReader(self._reader)
            self._answered = False

        def handle(self):
            super().handle()  # a timeout while reading ends it without an answer
            if self._reader.timed_out and not self._answered:
                body = json.dumps({"error": f"the request was not complete within "
                                            f"{read_timeout_s:g} s (--read_timeout_s)"})
                try:
                    self.connection.settimeout(read_timeout_s)
                    self.connection.sendall(
                        f"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}"
                        .encode())
                except OSError:
                    pass

        def parse_request(self):
            # The header lines as sent, for check_header_lines: the parser
            # under parse_request drops a line it cannot read and all after it.
            recorder, rfile = _LineRecorder(self.rfile), self.rfile
            self.rfile = recorder
            try:
                if not super().parse_request():
                    return False
            finally:
                self.rfile = rfile
            try:
                check_header_lines(recorder.lines)
            except FramingError as error:
                self._send(error.code, {"error": error.message}, close=True)
                return False
            return True

        def _send(self, code, body, close=False):
            self._answered = True
            self.connection.settimeout(read_timeout_s)  # a client that never reads
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if close:  # what follows on the connection cannot be read as a request
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

        def send_error(self, code, message=None, explain=None):
            # http.server's own refusals (a request line over 64 KiB: 414;
            # too many or too long header lines: 431; a bad request line:
            # 400) in the server's one-line JSON, not its HTML page.
            if message is None:
                message = self.responses.get(code, ("error",))[0]
            self._send(int(code), {"error": message}, close=True)

        def do_GET(self):
            code, kind = route("GET", self.path, model_name, version)
            if code:
                self._send(code, {"error": kind})
            elif kind == "status":
                self._send(200, {"model_version_status": [
                    {"version": str(version), "state": "AVAILABLE",
                     "status": {"error_code": "OK", "error_message": ""}}]})
            else:
                sigs = {name: {"inputs": sorted(s.inputs), "outputs": sorted(s.outputs)}
                        for name, s in emulator.signature_defs.items()}
                self._send(200, {"model_spec": {"name": model_name, "version": str(version)},
                                 "metadata": {"signature_def": sigs}})

        def _read_body(self, length):
            """The body, or fewer bytes when the deadline passed first."""
            chunks, size = [], 0
            try:
                while size < length:
                    chunk = self.rfile.read1(min(length - size, 2 ** 20))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    size += len(chunk)
            except TimeoutError:
                pass
            return b"".join(chunks)

        def _read_chunked(self):
            """A Transfer-Encoding: chunked body, its chunk extensions and
            trailers dropped, under the same size limit as a Content-Length
            body.  Raises FramingError; a deadline that passes raises
            TimeoutError, which handle() answers 408."""
            ended = FramingError(400, "the Transfer-Encoding: chunked body ended before its "
                                      "last (0-size) chunk and the blank line after it")
            chunks, size = [], 0
            while True:
                line = self.rfile.readline(_MAX_LINE + 1)
                match = _CHUNK_SIZE.fullmatch(line)
                if not match:
                    if not line:
                        raise ended
                    if len(line) > _MAX_LINE:
                        raise FramingError(400, f"a chunk size line of the Transfer-Encoding: "
                                                f"chunked body is over {_MAX_LINE} bytes")
                    raise FramingError(400, f"the chunk size line {line[:40]!r} of the "
                                            f"Transfer-Encoding: chunked body is not valid; "
                                            f"expected hexadecimal digits, optional "
                                            f";extensions, then CRLF")
                length = int(match[1], 16)
                if length == 0:
                    break
                size += length
                if size > max_body_bytes:  # refused before its bytes are read
                    raise FramingError(413, f"the Transfer-Encoding: chunked body is over the "
                                            f"server's limit of {max_body_bytes} bytes")
                data = self._read_body(length + 2)  # the chunk and its CRLF
                if len(data) < length + 2:
                    if self._reader.timed_out:
                        raise TimeoutError("the chunked body was not complete in time")
                    raise ended
                if data[-2:] != b"\r\n":
                    raise FramingError(400, f"a chunk of the Transfer-Encoding: chunked body "
                                            f"is not followed by CRLF: its size line "
                                            f"({length:x}) does not match its data")
                chunks.append(data[:-2])
            for _ in range(_MAX_TRAILERS + 1):  # trailer fields, up to a blank line
                line = self.rfile.readline(_MAX_LINE + 1)
                if line == b"\r\n":
                    return b"".join(chunks)
                valid = line.endswith(b"\r\n") and b":" in line and len(line) <= _MAX_LINE
                if not valid:
                    if not line:
                        raise ended
                    raise FramingError(400, f"the trailer line {line[:40]!r} of the "
                                            f"Transfer-Encoding: chunked body is not valid; "
                                            f"expected 'name: value' lines of at most "
                                            f"{_MAX_LINE} bytes, then a blank line")
            raise FramingError(400, f"the Transfer-Encoding: chunked body has over "
                                    f"{_MAX_TRAILERS} trailer lines")

        def do_POST(self):
            code, message = route("POST", self.path, model_name, version)
            if code:
                self._send(code, {"error": message})
                return
            try:
                framing = body_framing(self.headers, max_body_bytes,
                                       http10=self.request_version == "HTTP/1.0")
                raw = self._read_chunked() if framing == "chunked" else None
            except FramingError as error:
                self._send(error.code, {"error": error.message}, close=True)
                return
            if raw is None:
                length = framing
                raw = self._read_body(length)
                if len(raw) < length and self._reader.timed_out:   # a slow client
                    self._send(408, {"error": f"the request was not complete within "
                                              f"{read_timeout_s:g} s (--read_timeout_s)"},
                               close=True)
                    return
                if len(raw) < length:   # the client closed its side early
                    self._send(400, {"error": f"the body has {len(raw)} bytes, fewer than "
                                              f"its Content-Length {length}"}, close=True)
                    return
            try:
                body = json.loads(raw or b"null")
                with self.server.model_slots:
                    answer = predict(emulator, body)
                self._send(200, answer)
            except json.JSONDecodeError as error:
                self._send(400, {"error": f"JSON Parse error: {error}"})
            except RecursionError:
                self._send(400, {"error": "JSON Parse error: the document nests too deeply"})
            except InvalidArgument as error:
                self._send(400, {"error": error.message})
            except (ValueError, TypeError, OverflowError, KeyError) as error:
                self._send(400, {"error": f"Malformed request: {type(error).__name__}: "
                                          f"{' '.join(str(error).split())[:300]}"})
            except Exception as error:  # answer, never drop the connection
                self._send(500, {"error": f"{type(error).__name__}: {error}"})

    return Handler


def start_grpc(emulator, port):
    """``tensorflow.serving.PredictionService/Predict`` on ``port``, without
    tensorflow-serving-api's generated stubs (a generic handler with the
    messages of ``warmup.serving_apis``; other methods: UNIMPLEMENTED)."""
    import grpc

    predict_pb2, _ = serving_apis()

    def predict(request, context):
        try:
            return emulator.predict(request)
        except InvalidArgument as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, error.message)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "tensorflow.serving.PredictionService", {"Predict": grpc.unary_unary_rpc_method_handler(
            predict, request_deserializer=predict_pb2.PredictRequest.FromString,
            response_serializer=predict_pb2.PredictResponse.SerializeToString)}),))
    if not server.add_insecure_port(f"127.0.0.1:{port}"):
        raise RuntimeError("the port is in use")
    server.start()
    return server
