# Puts python/ (the fusejit package sources) and this folder (seed_models.py) on sys.path, so the
# tests import fusejit._recognize from the checkout without installing anything.
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
for _path in (os.path.join(_HERE, "..", "..", "python"), _HERE):
    _path = os.path.normpath(_path)
    if _path not in sys.path:
        sys.path.insert(0, _path)

from gpu_pretend import gpu, gpu_nosaved  # noqa: E402,F401  (the usage tests' fixtures)
