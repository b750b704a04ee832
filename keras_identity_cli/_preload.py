"""keras_identity's standard-library module that the programs use before
keras_identity is imported: ``cpu_kernels`` (keras_identity._cpu_kernels,
which chooses TensorFlow's CPU kernels before TensorFlow is imported).

Importing it as ``keras_identity._cpu_kernels`` would run
keras_identity/__init__.py, which imports Keras (and TensorFlow), before the
program has chosen the backend and the kernels (see the package docstring).
So it is loaded here from its file, under its own name: keras_identity's
later import finds this same module in ``sys.modules`` (one state: the
choice and its reason).  A ``TF_ENABLE_ONEDNN_OPTS`` that TensorFlow would
ignore is refused here, in one line (exit status 2), before anything else.
"""

import importlib.util
import os
import sys


def _load(name):
    qualified = f"keras_identity.{name}"
    module = sys.modules.get(qualified)
    if module is None:
        package = importlib.util.find_spec("keras_identity")
        path = os.path.join(package.submodule_search_locations[0], f"{name}.py")
        spec = importlib.util.spec_from_file_location(qualified, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[qualified] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[qualified]
            raise
    return module


cpu_kernels = _load("_cpu_kernels")

if cpu_kernels.invalid_setting():
    from keras_identity_cli._common import fail

    fail(cpu_kernels.invalid_setting(), 2)
