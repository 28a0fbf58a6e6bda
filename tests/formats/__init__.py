"""Tests of windowkit.formats: each format against the contract, and hostile stores."""
