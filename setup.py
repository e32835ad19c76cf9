import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "python"))
from build_support import BinaryDistribution, BuildPyWithLibrary  # noqa: E402
from setuptools import setup  # noqa: E402

setup(packages=["fusejit"], package_dir={"": "python"}, cmdclass={"build_py": BuildPyWithLibrary},
      distclass=BinaryDistribution)
