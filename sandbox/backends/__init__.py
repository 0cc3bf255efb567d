"""Isolation layers, one module each; the runner composes them."""
