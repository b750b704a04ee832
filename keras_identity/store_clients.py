"""The clients that reach object stores (``gs://``, ``s3://``) for
:mod:`keras_identity.storage`: which fsspec package reaches each, one client
a store and process, the GCS emulator's settings, and the bound on a store
that stops answering.

``STORAGE_EMULATOR_HOST`` (the variable Google's clients honour) points
everything at a local GCS emulator: gcsfs reads it itself; its probe of a
bucket's type over gRPC, which an emulator does not answer (a minute's wait
per bucket), is turned off; and no credentials are looked for.  A user's own
setting of the probe is kept.

A store that stops answering (a stalled connection, a throttled bucket)
never holds a run for good: a request the store leaves unanswered for
:data:`STORE_TIMEOUT_S` seconds (connecting, or between two bytes of its
answer) fails and is retried by gcsfs, and each call of a client (one
file's read, write, listing, ... with those retries) is given up after
:data:`CALL_REQUESTS` times that (:func:`bounded`; the storage layer says
it in one line naming the path).  ``KERAS_IDENTITY_STORE_TIMEOUT_S`` sets
the seconds (the tests set a few).  Once a call of a store timed out, the
process's later calls of it (a lock's release, at the run's end) wait one
request's time, at most :data:`AFTER_STALL_S` seconds, each.

The client is also fsspec's default for its store (:func:`_shared`), so
that another library's client made with no options of its own (Orbax's,
through etils.epath) is this one: the same timeouts and one listing cache.
The clients' error logs of exceptions they raise to the caller anyway are
dropped (:class:`_RaisedErrors`): the caller says them in one line.
"""

import functools
import logging
import math
import os

# The object stores, and the fsspec package that reaches each.
PACKAGES = {"gs": "gcsfs", "s3": "s3fs"}


def emulator_host():
    """The URL of the GCS emulator that ``STORAGE_EMULATOR_HOST`` names, or
    None (Google's clients take ``default`` as none); a bare ``host:port``
    is taken as ``http://host:port``."""
    host = os.environ.get("STORAGE_EMULATOR_HOST", "")
    if host in ("", "default"):
        return None
    return host if "://" in host else f"http://{host}"


def _emulator():
    return emulator_host() is not None


def _configure_environment():
    if _emulator():
        os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


_configure_environment()


# The bounded wait on a store that stops answering (see the module's docstring).
STORE_TIMEOUT_VARIABLE = "KERAS_IDENTITY_STORE_TIMEOUT_S"
STORE_TIMEOUT_S = 120.0   # default: one request unanswered this long fails (and is retried)
# The most a setting may give: a store left unanswered an hour per request (three
# hours a call) is down, and a larger bound would in effect be none.
MAX_STORE_TIMEOUT_S = 3600.0
CALL_REQUESTS = 3         # one call (its retries included) waits at most this many times that
AFTER_STALL_S = 10.0      # a call after a store timed out: at most this (and one request's)
_STALLED = set()          # the buckets a call timed out on in this process


def store_timeout():
    """The seconds a request may go unanswered (``KERAS_IDENTITY_STORE_TIMEOUT_S``,
    else :data:`STORE_TIMEOUT_S`); a value that is no positive number of
    seconds, or one past :data:`MAX_STORE_TIMEOUT_S`, is a ``ValueError`` in
    one line."""
    text = os.environ.get(STORE_TIMEOUT_VARIABLE, "").strip()
    if not text:
        return STORE_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{STORE_TIMEOUT_VARIABLE}={text!r} is not a number of seconds; "
                         f"expected a positive number (default {STORE_TIMEOUT_S:g}), or unset it")
    if value > MAX_STORE_TIMEOUT_S:
        raise ValueError(f"{STORE_TIMEOUT_VARIABLE}={text!r} is past the maximum of "
                         f"{MAX_STORE_TIMEOUT_S:g} s a request (a larger bound is no bound on "
                         f"a store that stops answering); expected a positive number up to "
                         f"{MAX_STORE_TIMEOUT_S:g} (default {STORE_TIMEOUT_S:g}), or unset it")
    return value


def call_deadline(bucket):
    """The seconds one call of a store's client on ``bucket`` (``gs://name``)
    may wait, its retries included: :data:`CALL_REQUESTS` requests' time,
    or after a call of that bucket timed out (:func:`note_stall`) one
    request's, at most :data:`AFTER_STALL_S`."""
    deadline = CALL_REQUESTS * store_timeout()
    if bucket in _STALLED:
        deadline = min(deadline, store_timeout(), AFTER_STALL_S)
    return deadline


def note_stall(bucket):
    """Records that a call of ``bucket`` timed out in this process (its later
    calls then wait less: :func:`call_deadline`)."""
    _STALLED.add(bucket)


def has_stalled(bucket):
    """Whether a call of ``bucket`` timed out in this process."""
    return bucket in _STALLED


_FILESYSTEMS = {}


def filesystem(found, name="model_dir"):
    """The fsspec client of store ``found`` (``"gs"``, ``"s3"``), made once a
    process; ``name`` is the argument a missing package is said of (a
    ``ValueError`` in one line)."""
    if found not in _FILESYSTEMS:
        _configure_environment()  # an emulator named after this module was imported
        try:
            import fsspec

            options = {}
            if found == "gs":
                import aiohttp

                # gcsfs's default is no timeout at all: a stalled store held
                # a run for good.  A request that times out is retried by gcsfs.
                seconds = store_timeout()
                options["requests_timeout"] = aiohttp.ClientTimeout(
                    total=None, sock_connect=seconds, sock_read=seconds)
                # etils.epath's one option (Orbax's client): the same client (_shared).
                options["finalize_on_close"] = True
                if _emulator():
                    options["token"] = "anon"  # an emulator takes no credentials
                    _without_bucket_probe(fsspec)
            _quiet_client_logs()
            _FILESYSTEMS[found] = _shared(fsspec, found, options)
        except ImportError:
            raise ValueError(f"{name}: {found}:// paths need the {PACKAGES[found]} package, "
                             f"which is not installed: pip install {PACKAGES[found]}") from None
    return _FILESYSTEMS[found]


class _RaisedErrors(logging.Filter):
    """Drops the store clients' error logs of an exception they raise to the
    caller (gcsfs's ``... out of retries on exception`` and ``... non-retriable
    exception``, fsspec's read-ahead's errors), each with a traceback: the
    caller (keras_identity.storage, or Orbax) says it in one line."""

    def filter(self, record):
        if record.levelno < logging.ERROR:
            return True
        if record.name == "gcsfs":
            message = str(record.msg)
            return not ("out of retries on exception" in message
                        or "non-retriable exception" in message)
        return record.name != "fsspec.prefetcher"


def _quiet_client_logs():
    for name in ("gcsfs", "fsspec.prefetcher"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _RaisedErrors) for f in logger.filters):
            logger.addFilter(_RaisedErrors())


_SHARED = {}   # (store, option) -> the value this module made fsspec's default


def _shared(fsspec, found, options):
    """The store's client, made with ``options`` set as fsspec's defaults for
    it (a user's own settings kept), so that the client fsspec makes for
    another library with no options of its own (Orbax's ``etils.epath``) is
    this one (fsspec keeps one client per options): the same timeouts, and
    one listing cache, which keras_identity.storage's writes, renames and removals keep
    current (Orbax listed a checkpoint set aside there, and refused to write
    its step again)."""
    import fsspec.config

    defaults = fsspec.config.conf.setdefault(found, {})
    for key, value in options.items():
        if key not in defaults or _SHARED.get((found, key)) == defaults[key]:
            defaults[key] = _SHARED[(found, key)] = value
    return fsspec.filesystem(found)


def _without_bucket_probe(fsspec):
    """gcsfs chooses its class when it is imported: where that came before
    the emulator's setting, its experimental class (which probes each bucket's
    type over gRPC, unanswered by an emulator) is replaced by the plain one."""
    if os.environ.get("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "").lower() in ("true", "1"):
        return
    from gcsfs.core import GCSFileSystem

    for protocol in ("gs", "gcs"):
        fsspec.register_implementation(protocol, GCSFileSystem, clobber=True)


# The clients' calls keras_identity.storage makes: each is given a deadline.
_BOUNDED_CALLS = frozenset({"exists", "info", "ls", "cat_file", "pipe_file", "rm_file", "call",
                            "cp_file", "put_file", "get_file", "size", "find"})


class _Bounded:
    """A store's file system whose calls (:data:`_BOUNDED_CALLS`) are
    cancelled after :func:`call_deadline` (fsspec's ``timeout``: a
    ``FSTimeoutError``, an ``asyncio.TimeoutError``)."""

    def __init__(self, fs, bucket):
        self._fs, self._bucket = fs, bucket

    def __getattr__(self, name):
        attribute = getattr(self._fs, name)
        if name not in _BOUNDED_CALLS:
            return attribute
        return functools.partial(attribute, timeout=call_deadline(self._bucket))


def bounded(found, bucket):
    """Store ``found``'s client, each of whose calls on ``bucket`` is given
    up after :func:`call_deadline` (an ``asyncio.TimeoutError``)."""
    return _Bounded(filesystem(found), bucket)
