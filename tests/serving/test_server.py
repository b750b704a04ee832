"""The local server (keras_identity.serving.server, keras-identity-serve's)
frames request bodies as a careful HTTP/1.1 server does: one Content-Length or
Transfer-Encoding: chunked, anything ambiguous refused in one line and the
connection closed (the request-smuggling class of bugs)."""

import json
import socket
import threading

import pytest

tf = pytest.importorskip("tensorflow")  # keras_identity.serving.server: TensorFlow

from tests.backend import backend_neutral  # noqa: E402

# The local server's HTTP handling: TensorFlow, once (see tests/backend.py).
pytestmark = [pytest.mark.needs_tensorflow, backend_neutral, pytest.mark.quick]

PREDICT = b"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\n"
BODY = b'{"instances": [[1.0, 2.0], [3.0, 4.0]]}'
LIMIT = 4096   # the server's body limit in these tests


class DoublingEmulator:
    """Enough of ServingEmulator for server.predict: one float32 input x, y = 2x."""

    signature_defs = {}

    def input_dtypes(self, signature):
        return {"x": tf.float32}

    def run(self, signature, inputs):
        return {"y": inputs["x"] * 2}


@pytest.fixture(scope="module")
def port():
    from keras_identity.serving import server as server_lib

    handler = server_lib.make_rest_handler(DoublingEmulator(), "m", 1, read_timeout_s=2.0,
                                      max_body_bytes=LIMIT)
    server = server_lib.BoundedHTTPServer(("127.0.0.1", 0), handler, workers=2, max_queued=8)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def exchange(port, data, close=False):
    """Sends ``data`` (then the end of the stream if ``close``) and reads the
    answer to its end: (status, headers, body)."""
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(data)
        if close:
            connection.shutdown(socket.SHUT_WR)
        try:
            while chunk := connection.recv(65536):
                answer += chunk
        except ConnectionResetError:  # closed with our unread bytes: the answer came first
            pass
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    return int(lines[0].split()[1]), headers, json.loads(body)


def chunked(*chunks, trailer=b""):
    """A chunked body: the chunks, the last (0-size) chunk, ``trailer``, a blank line."""
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for chunk in chunks)
    return body + b"0\r\n" + trailer + b"\r\n"


def test_a_chunked_body_predicts_as_its_content_length_twin(port):
    code, _, expected = exchange(port, PREDICT + b"Content-Length: %d\r\n\r\n" % len(BODY)
                                 + BODY)
    assert code == 200 and expected == {"predictions": [{"y": [2.0, 4.0]},
                                                        {"y": [6.0, 8.0]}]}
    te = PREDICT + b"Transfer-Encoding: chunked\r\n\r\n"
    for body in (chunked(BODY[:10], BODY[10:]),
                 # Upper-case hex with an extension, one byte a chunk, a trailer.
                 b"1A;name=value\r\n" + BODY[:26] + b"\r\n" + chunked(
                     *[BODY[i:i + 1] for i in range(26, len(BODY))],
                     trailer=b"X-Checksum: 1\r\n")):
        assert exchange(port, te + body)[::2] == (200, expected)


@pytest.mark.parametrize("headers, body, code, words", [
    (b"Content-Length: 5\r\nContent-Length: 5\r\n", b"{}   ", 400,
     ["2 Content-Length headers ('5', '5')", "send exactly one"]),
    (b"Content-Length: 2\r\nContent-Length: 40\r\n", b"{}" + BODY, 400,
     ["2 Content-Length headers ('2', '40')"]),
    (b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n" % len(BODY), chunked(BODY), 400,
     ["Transfer-Encoding and Content-Length together", "send one of them"]),
    (b"Transfer-Encoding: chunked\r\n", b"%x\r\n" % (LIMIT + 1) + b"a" * (LIMIT + 1), 413,
     ["Transfer-Encoding: chunked body is over the server's limit of 4096 bytes"]),
    (b"Transfer-Encoding: chunked\r\n", chunked(b"a" * 3000, b"a" * 3000), 413,
     ["over the server's limit"]),   # each chunk under it, the two over
    (b"Transfer-Encoding: chunked\r\n", b"zz\r\n{}\r\n0\r\n\r\n", 400,
     ["chunk size line b'zz\\r\\n'", "expected hexadecimal digits"]),
    (b"Transfer-Encoding: chunked\r\n", b" 2\r\n{}\r\n0\r\n\r\n", 400, ["not valid"]),
    (b"Transfer-Encoding: chunked\r\n", b"3\r\n{}\r\n0\r\n\r\n", 400,
     ["not followed by CRLF"]),   # a size that lies
    (b"Transfer-Encoding: chunked\r\n", b"2\r\n{}\r\n0\r\nno colon\r\n\r\n", 400,
     ["trailer line b'no colon\\r\\n'"]),
    (b"Transfer-Encoding: gzip\r\n", b"", 501,
     ["Transfer-Encoding 'gzip' is not implemented", "only 'chunked'"]),
    (b"Transfer-Encoding: gzip, chunked\r\n", chunked(BODY), 501, ["'gzip, chunked'"]),
    (b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", chunked(BODY), 501,
     ["'chunked, chunked'"]),
    (b"", b"", 411, ["needs a Content-Length header", "Transfer-Encoding: chunked"]),
    # A valid size over the limit, however many digits it has: 413, not "not valid".
    (b"Content-Length: 1000000000000\r\n", b"", 413,
     ["Content-Length 1000000000000 is over the server's limit of 4096 bytes"]),
    (b"Content-Length: 4097\r\n", b"", 413, ["over the server's limit of 4096 bytes"]),
])
def test_ambiguous_framing_is_refused_in_one_line_and_the_connection_closed(
        port, headers, body, code, words):
    status, response_headers, answer = exchange(port, PREDICT + headers + b"\r\n" + body)
    assert status == code, answer
    assert response_headers["connection"] == "close"
    assert set(answer) == {"error"} and "\n" not in answer["error"]
    for word in words:
        assert word in answer["error"], answer["error"]


def test_a_chunked_body_cut_short_or_stalled(port):
    te = PREDICT + b"Transfer-Encoding: chunked\r\n\r\n"
    # No last chunk: the client closes its side.
    code, headers, answer = exchange(port, te + b"2\r\n{}\r\n", close=True)
    assert code == 400 and headers["connection"] == "close"
    assert "ended before its last (0-size) chunk" in answer["error"]
    # A chunk that stalls past the deadline (--read_timeout_s, 2 s here).
    code, headers, answer = exchange(port, te + b"2\r\n{")
    assert code == 408 and headers["connection"] == "close"
    assert "not complete within 2 s" in answer["error"]


def test_http10_requests_may_not_be_chunked(port):
    request = b"POST /v1/models/m:predict HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"
    code, _, answer = exchange(port, request + chunked(BODY))
    assert code == 400 and "Transfer-Encoding in an HTTP/1.0 request" in answer["error"]


# Header lines that are not "name: value" (RFC 9112): http.client.parse_headers
# drops a line it cannot parse and every header after it, so each would frame
# the body on headers the client did not send.
TOKEN_WORDS = ["is not valid", "expected a token", "no spaces"]
VALUE_WORDS = ["has a control character", "only visible characters, spaces and tabs"]


@pytest.mark.parametrize("headers, body, words", [
    # A space before the colon: with a Content-Length before it (S14b, was
    # 200 on the Content-Length), alone (S14, was 411), before one (S14c, 411).
    (b"Content-Length: %d\r\nTransfer-Encoding : chunked\r\n" % len(BODY), BODY,
     ["the header name b'Transfer-Encoding '"] + TOKEN_WORDS),
    (b"Transfer-Encoding : chunked\r\n", chunked(BODY),
     ["the header name b'Transfer-Encoding '"] + TOKEN_WORDS),
    (b"Transfer-Encoding : chunked\r\nContent-Length: %d\r\n" % len(BODY), BODY,
     ["the header name b'Transfer-Encoding '"] + TOKEN_WORDS),
    (b"Transfer-Encoding\t: chunked\r\n", chunked(BODY),
     ["the header name b'Transfer-Encoding\\t'"] + TOKEN_WORDS),
    # VT and FF are not OWS, and no field value may hold them (S34: was chunked).
    (b"Transfer-Encoding: \x0bchunked\r\n", chunked(BODY),
     ["the Transfer-Encoding header's value b'\\x0bchunked'"] + VALUE_WORDS),
    (b"Transfer-Encoding: chunked\x0c\r\n", chunked(BODY),
     ["the Transfer-Encoding header's value b'chunked\\x0c'"] + VALUE_WORDS),
    # Other control characters: a bare CR (the parser splits the line there
    # and drops the rest), NUL, DEL.
    (b"X-Note: a\rb\r\nContent-Length: %d\r\n" % len(BODY), BODY,
     ["the X-Note header's value b'a\\rb'"] + VALUE_WORDS),
    (b"Content-Length: %d\r\nX-Note: a\x00b\r\n" % len(BODY), BODY,
     ["the X-Note header's value b'a\\x00b'"] + VALUE_WORDS),
    (b"Content-Length: %d\r\nX-Note: a\x7f\r\n" % len(BODY), BODY,
     ["the X-Note header's value"] + VALUE_WORDS),
    # obs-fold: a line that starts with a space or a tab continues the last one.
    (b"X-Note: a\r\n b\r\nContent-Length: %d\r\n" % len(BODY), BODY,
     ["the header line b' b\\r\\n' starts with a space or tab", "obs-fold",
      "send each header on one line"]),
    (b"Content-Length: %d\r\n\tTransfer-Encoding: chunked\r\n" % len(BODY), BODY,
     ["the header line b'\\tTransfer-Encoding: chunked\\r\\n' starts with a space or tab"]),
    # No colon, then names that are not tokens (the parser kept both of these).
    (b"X-No-Colon\r\nContent-Length: %d\r\n" % len(BODY), BODY,
     ["the header line b'X-No-Colon\\r\\n' has no colon", "expected 'name: value'"]),
    (b"Content-Length: %d\r\nX(Note): a\r\n" % len(BODY), BODY,
     ["the header name b'X(Note)'"] + TOKEN_WORDS),
    (b"Content-Length: %d\r\n: a\r\n" % len(BODY), BODY, ["the header name b''"] + TOKEN_WORDS),
])
def test_malformed_header_lines_are_refused_in_one_line_and_the_connection_closed(
        port, headers, body, words):
    status, response_headers, answer = exchange(port, PREDICT + headers + b"\r\n" + body)
    assert status == 400, answer
    assert response_headers["connection"] == "close"
    assert set(answer) == {"error"} and "\n" not in answer["error"]
    for word in words:
        assert word in answer["error"], answer["error"]


def test_malformed_header_lines_are_refused_on_any_request_and_the_server_goes_on(port):
    code, headers, answer = exchange(port, b"GET /v1/models/m HTTP/1.1\r\nHost : x\r\n\r\n")
    assert code == 400 and headers["connection"] == "close"
    assert "the header name b'Host '" in answer["error"]
    code, _, answer = exchange(port, b"GET /v1/models/m HTTP/1.1\r\nHost: x\r\n\r\n")
    assert code == 200 and answer["model_version_status"][0]["state"] == "AVAILABLE"


def test_well_formed_header_lines_still_pass(port):
    # OWS of spaces and tabs, an empty value, obs-text, a token's punctuation,
    # a Content-Length with OWS after it.
    headers = (b"X-Empty:\r\nX-Tabs:\t a \t\r\nX-Latin: caf\xe9\r\n"
               b"X-!#$%&'*+-.^_`|~: 1\r\nContent-Length: " + b"%d \t\r\n" % len(BODY))
    code, _, answer = exchange(port, PREDICT + headers + b"\r\n" + BODY)
    assert code == 200 and answer == {"predictions": [{"y": [2.0, 4.0]},
                                                      {"y": [6.0, 8.0]}]}


@pytest.mark.parametrize("value", ["\x0bchunked", "chunked\x0c", "\x0cchunked\x0b"])
def test_body_framing_strips_only_spaces_and_tabs_from_transfer_encoding(value):
    import http.client

    from keras_identity.serving import server as server_lib

    headers = http.client.HTTPMessage()
    headers["Transfer-Encoding"] = value
    with pytest.raises(server_lib.FramingError) as raised:
        server_lib.body_framing(headers, LIMIT)
    assert raised.value.code == 501 and "is not implemented" in raised.value.message
    headers.replace_header("Transfer-Encoding", " \tchunked\t ")
    assert server_lib.body_framing(headers, LIMIT) == "chunked"


@pytest.mark.parametrize("request_bytes, code, words", [
    (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414, ["URI Too Long"]),
    (b"GET /v1/models/m HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(10_000))
     + b"\r\n", 431, ["Too many headers"]),
    (b"GET /v1/models/m HTTP/1.1\r\nX-Long: " + b"a" * 70_000 + b"\r\n\r\n", 431,
     ["Line too long"]),
    (b"BREW /v1/models/m HTTP/1.1\r\n\r\n", 501, ["Unsupported method ('BREW')"]),
])
def test_http_servers_own_refusals_are_the_one_line_json_error(port, request_bytes, code,
                                                                words):
    """What http.server refuses before the handler runs gets the server's
    documented one-line JSON error, not http.server's HTML page."""
    status, headers, answer = exchange(port, request_bytes)
    assert status == code and headers["content-type"] == "application/json", answer
    assert headers["connection"] == "close"
    assert set(answer) == {"error"} and "\n" not in answer["error"]
    for word in words:
        assert word in answer["error"], answer["error"]


@pytest.mark.parametrize("body, words", [
    (b'{"instances": [[true, 2.0]]}', "the JSON value true is not valid input; expected "
                                      "numbers"),
    (b'{"inputs": [[1.0, false]]}', "the JSON value false is not valid input; expected "
                                    "numbers"),
    (b'{"instances": [["a", 2.0]]}', "the JSON values cannot be converted to float32"),
])
def test_booleans_are_refused_as_strings_are(port, body, words):
    code, _, answer = exchange(port, PREDICT + b"Content-Length: %d\r\n\r\n" % len(body)
                               + body)
    assert code == 400 and answer == {"error": words}
