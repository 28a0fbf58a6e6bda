"""``python -m windowkit``: the ``windowkit`` command line (:func:`windowkit.cli.main`)."""

from windowkit.cli import main

if __name__ == "__main__":
    main(prog_name="windowkit")
