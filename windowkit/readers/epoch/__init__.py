"""The epoch every reader shares: keyed permutations (``permutation``) and
the order of storage blocks they give each epoch (``sampler``), which
shuffle a split gets (``choice``), each epoch's order of windows
(``order``), each shard's or rank's share of it (``shares``), the state a
reader saves to resume mid-epoch (``saved``) and the epoch's batches of
windows, cut with NumPy (``batches``: what the Keras, PyTorch and Grain
readers yield and what ``tf.data`` reads a uniform shuffle from).
"""
