"""A local Google Cloud Storage emulator for the tests, with preconditions.

    python -m tests.gcs_emulator --port=9023 --bucket=test-bucket
    python tests/gcs_emulator.py --port=9023 --bucket=test-bucket

starts gcp-storage-emulator's server in memory, with one bucket created, until
SIGTERM (or Ctrl-C).  Point gcsfs (and ``keras_identity.storage``) at it with
``STORAGE_EMULATOR_HOST=http://localhost:9023``.

Why this file and not ``gcp-storage-emulator start``: the emulator ignores
GCS's preconditions.  An upload with ``ifGenerationMatch=0`` (create only if
absent: gcsfs's ``pipe_file(..., mode="create")``, which
``keras_identity.storage.create_new`` and so a run's lock rely on) overwrites
an existing object there, where GCS answers 412 Precondition Failed.  So
before the server starts, the emulator's upload handlers (``objects.insert``:
the multipart, media and resumable uploads gcsfs sends to
``/upload/storage/v1/b/BUCKET/o``; ``objects.upload_partial``: a resumable
upload's chunks; ``objects.xml_upload``; and the copies: ``copy``,
``rewrite``, ``compose``) are wrapped: a request whose ``ifGenerationMatch``
(query parameter, or the ``x-goog-if-generation-match`` header) does not hold
for the object it writes (``0``: the object exists; ``N``: the object is
missing or its generation is not N) is answered 412 with GCS's JSON error
body, and the object is left as it was.  The check and the write happen under
one lock, so two racing creates cannot both succeed.

Reads get GCS's conditions and headers too, which TensorStore (Orbax's array
store) relies on: a media download carries the object's generation in
``x-goog-generation``, and honours ``ifGenerationMatch`` (412) and
``ifGenerationNotMatch`` (304 Not Modified: TensorStore's check that its
cached copy is current), which the emulator ignores.

A test can take write permission away from part of the bucket: while the
bucket holds an object named ``.refused-writes``, every write (an upload, a
copy or a compose; deletes still work) of an object whose name starts with
one of its lines is answered 403 Forbidden, as GCS answers a lost
permission, which clients do not retry.

It also answers GCS's atomic move (``POST .../o/SOURCE/moveTo/o/TARGET``),
which gcsfs's ``mv`` tries first: the emulator answers it 501, which gcsfs
retries for half a minute before it falls back to a copy and a delete.
"""

import argparse
import functools
import os
import re
import signal
import sys
import threading
from http import HTTPStatus

from gcp_storage_emulator import settings
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects

_LOCK = threading.RLock()

_MESSAGE = "At least one of the pre-conditions you specified did not hold."


def _precondition(request):
    """The generation the request requires of the object it writes, or None."""
    values = request.query.get("ifGenerationMatch")
    if values:
        return values[0]
    return request.get_header("x-goog-if-generation-match")


def _generation(storage, bucket, name):
    try:
        return str(storage.get_file_obj(bucket, name)["generation"])
    except NotFound:
        return None


def _holds(required, current):
    if str(required).strip() == "0":
        return current is None
    return current is not None and str(required).strip() == current


def _refuse(response):
    response.status = HTTPStatus.PRECONDITION_FAILED
    response.json({"error": {"code": 412, "message": _MESSAGE, "errors": [{
        "message": _MESSAGE, "domain": "global", "reason": "conditionNotMet",
        "locationType": "header", "location": "If-Match"}]}})


def _resumable_target(request, storage):
    try:
        obj = storage.get_resumable_file_obj(request.query["upload_id"][0])
    except NotFound:
        return None
    return obj.get("bucket"), obj.get("name")


def _insert_target(request, storage):
    if "upload_id" in request.query:  # a resumable chunk sent by POST
        return _resumable_target(request, storage)
    bucket = request.params["bucket_name"]
    if request.query.get("name"):
        return bucket, request.query["name"][0]
    data = request.data  # parsed once and kept by the request, for the handler too
    if isinstance(data, dict):
        meta = data.get("meta", data)
        if isinstance(meta, dict) and meta.get("name"):
            return bucket, meta["name"]
    return None


def _object_target(request, storage):
    return request.params["bucket_name"], request.params["object_id"]


def _object_target_for_delete(request, storage):
    return _object_target(request, storage)


def _destination_target(request, storage):
    return request.params["dest_bucket_name"], request.params["dest_object_id"]


REFUSED_WRITES = ".refused-writes"


def _write_refused(storage, bucket, name):
    if name == REFUSED_WRITES:
        return False
    try:
        listed = storage.get_file(bucket, REFUSED_WRITES)
    except NotFound:
        return False
    prefixes = [line.strip() for line in listed.decode().splitlines() if line.strip()]
    return any(name.startswith(prefix) for prefix in prefixes)


def _forbid(response, bucket, name):
    message = f"The caller does not have storage.objects.create access to {bucket}/{name}."
    response.status = HTTPStatus.FORBIDDEN
    response.json({"error": {"code": 403, "message": message, "errors": [{
        "message": message, "domain": "global", "reason": "forbidden"}]}})


def _guarded(handler, target):
    @functools.wraps(handler)
    def guarded(request, response, storage, *args, **kwargs):
        with _LOCK:
            found = target(request, storage)
            if found is not None and target is not _object_target_for_delete \
                    and _write_refused(storage, *found):
                _forbid(response, *found)
                return None
            required = _precondition(request)
            if required is not None:
                if found is not None and not _holds(required, _generation(storage, *found)):
                    _refuse(response)
                    return None
            return handler(request, response, storage, *args, **kwargs)

    guarded.__wrapped_for_preconditions__ = True
    return guarded


def _conditional_download(handler):
    @functools.wraps(handler)
    def download(request, response, storage, *args, **kwargs):
        with _LOCK:
            current = _generation(storage, *_object_target(request, storage))
        if current is not None:
            match = request.query.get("ifGenerationMatch")
            not_match = request.query.get("ifGenerationNotMatch")
            if match and not _holds(match[0], current):
                _refuse(response)
                return None
            if not_match and str(not_match[0]).strip() == current:
                response.status = HTTPStatus.NOT_MODIFIED
                response["x-goog-generation"] = current
                return None
            response["x-goog-generation"] = current
            response["x-goog-metageneration"] = "1"
        return handler(request, response, storage, *args, **kwargs)

    download.__wrapped_for_preconditions__ = True
    return download


def move(request, response, storage, *args, **kwargs):
    """GCS's objects.move in one bucket: ``moveTo``, under the precondition
    lock (``ifGenerationMatch`` applies to the target)."""
    bucket = request.params["bucket_name"]
    source, target = request.params["object_id"], request.params["dest_object_id"]
    try:
        moved = objects._copy(request.base_url, storage, bucket, source, bucket, target)
        storage.delete_file(bucket, source)
    except NotFound:
        response.status = HTTPStatus.NOT_FOUND
        response.json({"error": {"code": 404, "message": f"No such object: {bucket}/{source}"}})
        return
    response.json(moved)


def _move_target(request, storage):
    return request.params["bucket_name"], request.params["dest_object_id"]


_MOVE_ROUTE = (r"^(?:{})?/b/(?P<bucket_name>[-.\w]+)/o/(?P<object_id>.*[^/]+)/moveTo/o/"
               r"(?P<dest_object_id>.*[^/]+)$")

_TARGETS = {
    "insert": _insert_target,
    "upload_partial": _resumable_target,
    "xml_upload": _object_target,
    "compose": _object_target,
    "copy": _destination_target,
    "rewrite": _destination_target,
    "delete": _object_target_for_delete,
}


def install():
    """Wraps the emulator's write handlers (once), in ``objects`` and in the
    server's route table (built from them when the server module is
    imported)."""
    replaced = {}
    for name, target in _TARGETS.items():
        original = getattr(objects, name)
        if getattr(original, "__wrapped_for_preconditions__", False):
            continue
        wrapper = _guarded(original, target)
        setattr(objects, name, wrapper)
        replaced[original] = wrapper
    if not getattr(objects.download, "__wrapped_for_preconditions__", False):
        # objects.get calls objects.download by name for ?alt=media.
        wrapper = _conditional_download(objects.download)
        replaced[objects.download] = wrapper
        objects.download = wrapper
    from gcp_storage_emulator import server

    for _, handlers in server.HANDLERS:
        for method, handler in list(handlers.items()):
            if handler in replaced:
                handlers[method] = replaced[handler]
    if not any("moveTo" in regex for regex, _ in server.HANDLERS):
        # First: the object routes would take .../o/SOURCE/moveTo/o/TARGET for an object.
        route = _MOVE_ROUTE.format(re.escape(settings.API_ENDPOINT))
        server.HANDLERS = ((route, {server.POST: _guarded(move, _move_target)}),
                           *server.HANDLERS)


def _stop(signum, frame):
    raise SystemExit(0)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=9023)
    parser.add_argument("--bucket", default="test-bucket",
                        help="the bucket created at the start")
    parser.add_argument("--host", default="localhost")
    parser.add_argument("--quiet", action="store_true",
                        help="only the emulator's critical messages")
    args = parser.parse_args(argv)
    install()
    from gcp_storage_emulator.__main__ import main as emulator_main

    signal.signal(signal.SIGTERM, _stop)
    code = 0
    try:
        emulator_main(["start", f"--host={args.host}", f"--port={args.port}", "--in-memory",
                       f"--default-bucket={args.bucket}"] + (["--quiet"] if args.quiet else []))
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except KeyboardInterrupt:
        code = 0
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    # The emulator stops its server thread when its loop ends; a signal that
    # came before that thread had started must not leave the process waiting.
    os._exit(code)


if __name__ == "__main__":
    main()
