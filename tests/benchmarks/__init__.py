"""The `make bench` harnesses (not collected by pytest)."""
