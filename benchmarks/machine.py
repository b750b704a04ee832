"""Names the machine a benchmark ran on."""

import os
import platform


def describe():
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    text = f"{cpu}, {cores} cores"
    try:
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            details = tf.config.experimental.get_device_details(gpus[0])
            text += f", GPU {details.get('device_name', gpus[0].name)} x{len(gpus)}"
        text += f", TensorFlow {tf.__version__}"
    except Exception:  # pragma: no cover - the description is informative only
        pass
    try:
        import jax

        text += f", JAX {jax.__version__}"
    except ImportError:
        pass
    return text


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
