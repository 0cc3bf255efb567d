import pathlib
import sys

# The sample is a plain folder, not an installed package: make `sample` importable.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
