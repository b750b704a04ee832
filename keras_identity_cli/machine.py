"""Names the machine a benchmark or an experiment ran on."""

import os
import platform

from keras_identity_cli._preload import cpu_kernels

cores = cpu_kernels.cores


def describe():
    """One line: the CPU and its vector units, its cores, the GPUs or TPUs, the
    TensorFlow version and whether its oneDNN or Eigen kernels ran, and the
    JAX version."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    flags = cpu_kernels.cpu_flags()
    # The vector extensions decide float32 and (above all) bfloat16 speed.
    vector = [name for flag, name in (("avx2", "AVX2"), ("avx512f", "AVX-512"),
                                      ("avx512_bf16", "AVX512_BF16"), ("amx_bf16", "AMX"))
              if flag in flags]
    if vector:
        cpu += f" ({', '.join(vector)})"
    text = f"{cpu}, {cores()} cores"
    # A cap on the vector units oneDNN may use (both frameworks read it): the
    # stated proxy for a CPU without the ones above it (e.g. AVX2 on AVX-512).
    cap = cpu_kernels.onednn_isa_cap()
    if cap:
        text += f", oneDNN capped at {cap} (ONEDNN_MAX_CPU_ISA)"
    aten = os.environ.get("ATEN_CPU_CAPABILITY")
    if aten:
        text += f", PyTorch's ATen capped at {aten}"
    try:
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            details = tf.config.experimental.get_device_details(gpus[0])
            text += f", GPU {details.get('device_name', gpus[0].name)} x{len(gpus)}"
        text += f", TensorFlow {tf.__version__}"
        # Which kernels its CPU convolutions ran (keras_identity._cpu_kernels).
        if cpu_kernels.kernels():
            text += f" ({cpu_kernels.kernels()} CPU kernels)"
    except Exception:  # pragma: no cover - the description is informative only
        pass
    try:
        import jax

        if ", GPU " not in text:  # no TensorFlow to name it
            gpus = [d for d in jax.devices() if d.platform == "gpu"]
            if gpus:
                text += f", GPU {gpus[0].device_kind} x{len(gpus)}"
        tpus = [d for d in jax.devices() if d.platform == "tpu"]
        if tpus:
            text += f", {tpus[0].device_kind} x{len(tpus)}"  # "TPU v5 lite", ...
        text += f", JAX {jax.__version__}"
    except ImportError:
        pass
    except RuntimeError:  # a JAX backend that fails to start
        text += f", JAX {jax.__version__}"
    return text
