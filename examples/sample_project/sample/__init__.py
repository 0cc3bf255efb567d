"""A tiny library for the gateway's demo: an inventory with prices."""
