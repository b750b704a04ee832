import keras
import numpy as np
import pytest

import keras_identity as ki
from keras_identity.data import Normalization


@pytest.fixture(scope="module")
def cifar_export(tmp_path_factory):
    """A pre-activation ResNet with a gated shortcut, exported once per module."""
    from keras_identity.serving import export_saved_model

    keras.utils.set_random_seed(5)
    model = ki.models.preact_resnet(11, shortcut="exclusive_gating", gate_bias_init=-2.0)
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (4, 32, 32, 3)).astype(np.uint8)
    prep = {"normalization": Normalization.from_images("per_pixel_mean", images),
            "image_shape": [32, 32, 3], "eval_resize": None,
            "class_names": ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog",
                            "horse", "ship", "truck"]}
    base = tmp_path_factory.mktemp("serving") / "pre11"
    version_dir = export_saved_model(model, str(base), prep, model_name="pre11")
    expected = model.predict(np.asarray(prep["normalization"](images)), verbose=0)
    return {"model": model, "prep": prep, "images": images, "expected": expected,
            "version_dir": version_dir, "base": str(base)}
