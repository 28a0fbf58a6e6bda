"""The pieces of the ``tf.data`` reader: block groups in the sampler's order
(``groups``), how a group's rows are read (``reads``: in the graph for a
TFRecord store, else by the format's row reader; ``digests`` and ``xxh3``
check each block read in the graph), windows cut and normalized in the graph
(``cut``), whole batches carried across groups (``carry``), a uniform
shuffle's batches as a dataset (``uniform``), epochs counted and saved in a
checkpoint (``epochs``) and reading through a tf.data dispatcher
(``service``). :mod:`windowkit.readers.tf` puts them together.
"""
