"""pvFed's networks: the ID encoder, its distillation, the output-layer split, the autoencoder."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from models.pvfed import (IdEncoder, VectorAutoencoder, autoencoder_aggregation, encoder_arrays,
                          encoder_from_arrays, fit_full_batch, fit_id_encoder, split_output_layer)
from models.small_cnn import SmallCNN
from strategies.vertical.pvfed_aggregation import AggregationSettings


def test_id_encoder_maps_each_patient_index_to_a_vector_and_is_seeded():
    encoder = IdEncoder(num_ids=10, hidden=16, width=5, seed=3)
    assert encoder(torch.tensor([0, 9])).shape == (2, 5)
    assert encoder.vectors().shape == (10, 5)
    np.testing.assert_array_equal(encoder.vectors(), IdEncoder(10, 16, 5, seed=3).vectors())
    assert not np.allclose(encoder.vectors(), IdEncoder(10, 16, 5, seed=4).vectors())


def test_distillation_fits_the_targets():
    targets = np.random.default_rng(0).normal(size=(12, 4)).astype(np.float32)
    encoder = IdEncoder(12, 32, 4, seed=0)
    losses = fit_id_encoder(encoder, targets, epochs=400, lr=0.02)
    assert len(losses) == 401 and losses[-1] < 0.01 * losses[0]
    np.testing.assert_allclose(encoder.vectors(), targets, atol=0.1)


def test_distillation_refuses_targets_of_another_shape():
    with pytest.raises(ValueError, match=r"targets of shape \(12, 3\)"):
        fit_id_encoder(IdEncoder(12, 8, 4), np.zeros((12, 3)), epochs=1, lr=0.1)


def test_encoder_weights_round_trip_with_sizes_from_their_shapes():
    encoder = IdEncoder(7, 6, 3, seed=1)
    arrays = encoder_arrays(encoder)
    assert {k: v.shape for k, v in arrays.items()} == {
        "embedding.weight": (7, 6), "output.weight": (3, 6), "output.bias": (3,)}
    copy = encoder_from_arrays(arrays)
    assert (copy.num_ids, copy.width) == (7, 3)
    np.testing.assert_array_equal(copy.vectors(), encoder.vectors())
    with pytest.raises(ValueError, match="missing"):
        encoder_from_arrays({"embedding.weight": arrays["embedding.weight"]})
    with pytest.raises(ValueError, match="not an ID encoder"):
        encoder_from_arrays({**arrays, "output.bias": np.zeros(4, np.float32)})


def test_split_output_layer_gives_the_extractor_and_the_last_linear():
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 1))
    extractor, output = split_output_layer(model)
    x = torch.randn(3, 5)
    assert extractor(x).shape == (3, 8) and output.in_features == 8
    torch.testing.assert_close(output(extractor(x)), model(x))
    assert isinstance(model[2], nn.Linear)  # the model itself is unchanged


def test_split_output_layer_finds_a_nested_head():
    model = SmallCNN((8,), norm=None, image_size=8).eval()
    extractor, output = split_output_layer(model)
    x = torch.randn(2, 1, 8, 8)
    assert extractor(x).shape == (2, 8 * 4 * 4)
    torch.testing.assert_close(output(extractor(x)), model(x))


def test_split_output_layer_refuses_a_model_not_ending_in_a_linear():
    with pytest.raises(ValueError, match="last module"):
        split_output_layer(nn.Sequential(nn.Linear(3, 1), nn.Sigmoid()))


def test_autoencoder_reconstruction_loss_decreases():
    z = torch.as_tensor(np.random.default_rng(1).normal(size=(20, 6)), dtype=torch.float32)
    net = VectorAutoencoder(columns=6, hidden=16, code=3)
    losses = fit_full_batch(net, z, z, epochs=200, lr=0.01)
    assert losses[-1] < 0.5 * losses[0]
    assert net.encode(z).shape == (20, 3) and net(z).shape == (20, 6)


def test_autoencoder_aggregation_gives_seeded_codes_of_length_dim():
    outputs = [np.random.default_rng(k).normal(size=(15, 4)) for k in range(3)]
    settings = AggregationSettings(dim=5, hidden=16, epochs=50, lr=0.01, seed=2)
    codes = autoencoder_aggregation(outputs, settings)
    assert codes.shape == (15, 5) and codes.dtype == np.float32 and np.isfinite(codes).all()
    np.testing.assert_array_equal(codes, autoencoder_aggregation(outputs, settings))
