"""The refusal of a data source: :class:`DataError`, one line that names
the file or folder and says what to do, and how it crosses tf.data
(:func:`as_data_error`); :func:`first_line` of any error, for messages."""


class DataError(ValueError):
    """A data source could not be found or read; the message says what to do."""


# tf.data cannot raise a DataError: the error it raises for an image file it
# cannot read (keras_identity.data.pipeline) carries one's message between these.
TF_MESSAGE_START, TF_MESSAGE_END = "<DataError>", "</DataError>"


def as_data_error(error):
    """The :class:`DataError` that ``error``, raised while a model trains or
    is evaluated, reports: ``error`` itself, or the one that a tf.data
    pipeline raised inside TensorFlow (an ``InvalidArgumentError``) for an
    image file it cannot read, naming it; ``None`` for any other error."""
    if isinstance(error, DataError):
        return error
    text = str(error)
    start, end = text.find(TF_MESSAGE_START), text.find(TF_MESSAGE_END)
    if start < 0 or end < start:
        return None
    return DataError(text[start + len(TF_MESSAGE_START):end])


def first_line(error):
    """The first line of ``error``'s text (at most 200 characters), for a
    one-line refusal; ``"no details"`` when it has none."""
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else "no details"
