"""``python -m windowkit.native``: compile windowkit's ops now."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up lines

from windowkit.native import main

main()
