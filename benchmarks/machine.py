"""Names the machine a benchmark ran on, and its Markdown tables."""

from keras_identity_cli.machine import describe

__all__ = ["describe", "table"]


def _cell(value, fmt):
    if value is None:
        return "-"
    return value if isinstance(value, str) else fmt.format(value)


def table(rows, columns):
    """A Markdown table of ``rows`` (dicts) with ``columns`` [(key, title, fmt)].

    A missing or ``None`` value is shown as ``-`` and a string as it is.
    """
    lines = ["| " + " | ".join(title for _, title, _ in columns) + " |",
             "|" + "|".join(" --- " for _ in columns) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(key), fmt) for key, _, fmt in columns)
                     + " |")
    return "\n".join(lines)
