"""The model card (keras_identity.training.model_card): the papers' numbers it
quotes, and its Markdown."""

import pytest

from keras_identity.training import model_card

pytestmark = pytest.mark.quick  # the quick tier (docs/testing.md)


def _card(**changes):
    card = {
        "model": "resnet52_mnist", "configuration": "resnet52_mnist", "builder": "resnet",
        "arguments": {"depth": 52, "dataset": "mnist"}, "parameters": 117802,
        "data": {"dataset": "mnist", "source": "built-in MNIST", "fingerprint": "sha256:ab",
                 "train_images": 60000, "test_images": 10000},
        "recipe": {"name": "highway_mnist", "description": "SGD", "global_batch": 128,
                   "learning_rate": 0.1, "steps": 9360, "epochs": 20},
        "test_error": 0.006, "test_loss": 0.02, "train_loss": 0.001,
        "paper_test_error": None, "paper_source": "no error", "command": "keras-identity-train",
        "package": {"version": "0.1", "commit": "abc"}, "backend": "tensorflow",
        "precision": "float32", "machine": "a CPU", "training_seconds": 5100.0,
        "model_file": "model.keras", "sha256": "00"}
    card.update(changes)
    return card


def test_paper_errors_by_configuration():
    assert model_card.paper_error("resnet", {"depth": 20}) == (8.75, "He et al. 2015, Table 6")
    assert model_card.paper_error("preact_resnet", {"depth": 1001}) == (
        4.92, "He et al. 2016, Table 3")
    error, source = model_card.paper_error("resnet", {"depth": 52, "dataset": "mnist"})
    assert error is None and "lecture notes" in source


def test_markdown_names_the_configuration_and_numbers():
    text = model_card.render(_card())
    assert text.startswith("# resnet52_mnist\n")
    assert "| test error | **0.60%** on the 10,000 test images" in text
    assert "| training time | 85.0 min |" in text
    assert "117,802 trainable parameters" in text
    # A twin whose Keras model carries its sibling's name is headed by its own.
    twin = model_card.render(_card(configuration="resnet52_mnist_plain"))
    assert twin.startswith("# resnet52_mnist_plain (Keras model `resnet52_mnist`)\n")
    paper = model_card.render(_card(paper_test_error=0.0875, paper_source="Table 6"))
    assert "| paper | 8.75% (Table 6) |" in paper
    assert "on this data" not in paper


def test_a_cifar_card_on_the_jpeg_copy_stands_beside_that_copys_reference():
    """On the shared JPEG copy of CIFAR-10 the paper's 8.75% is on other pixels:
    the card quotes the paper schedule's error on this copy too."""
    jpeg = model_card.CIFAR10_JPEG
    reference = model_card.data_reference("resnet", {"depth": 20, "dataset": "cifar10"}, jpeg)
    assert reference["test_error"] == pytest.approx(0.1263)
    assert "12.37%" in reference["source"]
    # other data, another network: none
    assert model_card.data_reference("resnet", {"depth": 20}, "sha256:ab") is None
    assert model_card.data_reference("preact_resnet", {"depth": 20}, jpeg) is None
    text = model_card.render(_card(data_reference=reference, paper_test_error=0.0875,
                                   paper_source="He et al. 2015, Table 6"))
    assert "| paper | 8.75% (He et al. 2015, Table 6) |\n| on this data | 12.63% (the " \
           "paper's whole schedule" in text
