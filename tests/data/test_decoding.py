import pytest

from keras_identity.data import DataError
from keras_identity.data import load_dataset
from tests.data.image_trees import png
from tests.data.image_trees import write_tree


def test_a_broken_or_odd_sized_image_is_named(tmp_path):
    root = tmp_path / "tree"
    write_tree(str(root))
    bad = root / "train" / "dog" / "0001.png"
    bad.write_bytes(b"not an image at all")
    with pytest.raises(DataError, match=r"train/dog/0001.png is not a readable image"):
        load_dataset("cifar10", str(root))
    bad.write_bytes(png(3, size=(8, 6)))
    with pytest.raises(DataError, match=r"train/dog/0001.png is 6x8x3, other images .* "
                                        r"are 6x6x3"):
        load_dataset("cifar10", str(root))
