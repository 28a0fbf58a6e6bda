"""The NumPy engine: windows cut from decoded blocks or held rows with NumPy,
on threads, no TensorFlow.

What the Keras reader (and random access, ``Store.windows``) reads with, and
the uniform shuffle's rows and batches, which ``tf.data`` calls too:
``pool`` (a cache of decoded blocks and the windows cut from it), ``loader``
(groups of blocks with their halos, read at once), ``order`` (each epoch's
order of windows), ``held`` (a split's rows held once, in memory or spilled,
and its uniform batches), ``fields`` (what a batch holds).
"""
