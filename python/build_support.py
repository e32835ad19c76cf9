"""Shared by python/setup.py and the repository root's setup.py: puts libfusejit.so next to the
package when it is built (`pip install ./python` or `pip install .`).

The library comes from $FUSEJIT_LIBRARY when set, else from the source tree's build/ folder,
built there with scripts/build.sh when missing."""
import os
import shutil
import subprocess

from setuptools import Distribution
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def find_or_build_library():
    env = os.environ.get("FUSEJIT_LIBRARY")
    if env:
        if not os.path.isfile(env):
            raise SystemExit("FUSEJIT_LIBRARY=%s is not a file" % env)
        return env
    path = os.path.join(ROOT, "build", "libfusejit.so.0")
    if not os.path.exists(path):
        script = os.path.join(ROOT, "scripts", "build.sh")
        print("building libfusejit.so with %s" % script)
        subprocess.check_call(["bash", script])
    if not os.path.exists(path):
        raise SystemExit("%s is missing after scripts/build.sh" % path)
    return path


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "fusejit")
        os.makedirs(target, exist_ok=True)
        shutil.copy2(find_or_build_library(), os.path.join(target, "libfusejit.so.0"))


class BinaryDistribution(Distribution):
    """The wheel holds a shared library: platform-specific, not pure."""

    def has_ext_modules(self):
        return True
