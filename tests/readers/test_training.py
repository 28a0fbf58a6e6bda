"""Training-shaped checks: small models learn from each format's readers.

An LSTM autoencoder learns to reverse windows in a custom ``tf.GradientTape``
loop over ``tf_dataset``; a convolutional next-frame predictor of ``[C, H, W]``
frames trains with ``model.fit`` on ``keras_dataset`` and on ``tf_dataset``,
with validation on a store of held-out series. The data are small and smooth,
so a few epochs suffice for the loss to fall clearly.
"""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import windowkit as wk

FRAME = (2, 8, 8)  # [C, H, W]
FRAME_SPEC = wk.WindowSpec(length=4, horizon=1)


def _waves(count: int, rows: int, seed: int) -> list[np.ndarray]:
    """Series of three sinusoids with random frequencies and phases."""
    rng = np.random.default_rng(seed)
    t = np.arange(rows, dtype=np.float64)[:, None]
    return [np.sin(t * rng.uniform(0.1, 0.4, 3) + rng.uniform(0, 2 * np.pi, 3))
            .astype(np.float32) for _ in range(count)]


def _moving_blobs(count: int, rows: int, seed: int) -> list[np.ndarray]:
    """Series of ``[2, 8, 8]`` frames: a Gaussian blob circling the frame (channel 0)
    and a plane wave travelling across it (channel 1), each at its own speed."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:FRAME[1], 0:FRAME[2]].astype(np.float64)
    out = []
    for _ in range(count):
        speed, phase = rng.uniform(0.3, 0.6), rng.uniform(0, 2 * np.pi)
        angle = phase + speed * np.arange(rows)[:, None, None]
        cy, cx = 3.5 + 2.5 * np.sin(angle), 3.5 + 2.5 * np.cos(angle)
        blob = np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / 3.0)
        wave = 0.5 + 0.5 * np.sin(0.8 * (xx + yy) - 2 * angle)
        out.append(np.stack([blob, wave], axis=1).astype(np.float32))
    return out


def _falls(losses: list[float], factor: float = 0.5) -> bool:
    """Finite throughout, and the last epoch's loss well below the first's."""
    return bool(np.isfinite(losses).all() and losses[-1] < factor * losses[0])


def test_lstm_autoencoder_reverses_windows_with_gradient_tape(concept_format: str,
                                                              tmp_path: Path) -> None:
    keras.utils.set_random_seed(0)
    store = wk.convert(_waves(8, 160, seed=0), tmp_path / "waves", format=concept_format, window=12,
                       block_rows=64)
    ds = store.tf_dataset("train", 64, seed=0)
    length, features = 12, 3
    model = keras.Sequential([
        keras.Input((length, features)),
        keras.layers.LSTM(32),
        keras.layers.RepeatVector(length),
        keras.layers.LSTM(32, return_sequences=True),
        keras.layers.TimeDistributed(keras.layers.Dense(features)),
    ])
    optimizer = keras.optimizers.Adam(0.01)
    loss_fn = keras.losses.MeanSquaredError()

    @tf.function(input_signature=[ds.element_spec])
    def train_step(x: tf.Tensor) -> tf.Tensor:
        target = x[:, ::-1]
        with tf.GradientTape() as tape:
            loss = loss_fn(target, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    epoch_losses = []
    for _ in range(4):
        losses = [float(train_step(x)) for x in ds]
        assert len(losses) == -(-store.num_windows("train") // 64)
        epoch_losses.append(float(np.mean(losses)))
    assert _falls(epoch_losses), epoch_losses


def _next_frame_model() -> keras.Model:
    """Frames stacked along channels (channels-last inside), two small convolutions."""
    channels, height, width = FRAME
    inputs = keras.Input((FRAME_SPEC.length, *FRAME))
    h = keras.layers.Permute((3, 4, 1, 2))(inputs)  # [H, W, L, C]
    h = keras.layers.Reshape((height, width, FRAME_SPEC.length * channels))(h)
    h = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(h)
    h = keras.layers.Conv2D(channels, 3, padding="same")(h)
    h = keras.layers.Permute((3, 1, 2))(h)  # [C, H, W]
    outputs = keras.layers.Reshape((1, *FRAME))(h)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


@pytest.mark.parametrize("reader", ["keras", "tf"])
def test_next_frame_prediction_with_fit(concept_format: str, tmp_path: Path, reader: str) -> None:
    keras.utils.set_random_seed(0)
    train = wk.convert(_moving_blobs(6, 80, seed=1), tmp_path / "train", format=concept_format,
                       window=FRAME_SPEC, block_rows=32)
    held_out = wk.convert(_moving_blobs(2, 80, seed=2), tmp_path / "val", format=concept_format,
                          window=FRAME_SPEC, block_rows=32)
    if reader == "keras":
        data = train.keras_dataset("train", 32, seed=0)
        val = held_out.keras_dataset("train", 64, shuffle=False)
        x, y = data[0]
        assert x.shape == (32, 4, *FRAME) and y.shape == (32, 1, *FRAME)
    else:
        data = train.tf_dataset("train", 32, seed=0)
        val = held_out.tf_dataset("train", 64, shuffle=False)
    history = _next_frame_model().fit(data, validation_data=val, epochs=4, shuffle=False,
                                      verbose=0).history
    assert _falls(history["loss"]), history["loss"]
    assert _falls(history["val_loss"]), history["val_loss"]
