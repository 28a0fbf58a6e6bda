"""A split's rows, read from the store: ``pool`` (a cache of decoded blocks
and the windows cut from them), ``loader`` (groups of blocks with their
halos, read at once on threads) and ``held`` (a split's rows held once, in
memory or spilled to local disk, for a uniform shuffle).
"""
