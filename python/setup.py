"""The wheel carries a prebuilt libple.so (copied into src/ple/ by scripts/build-wheel.sh) and no
Python extension: the package loads the library with ctypes. So it is tagged for any CPython 3 on
the library's platform, ``py3-none-<platform>`` (``py3-none-linux_x86_64``): platform-specific for
the shared library, independent of the Python version and its ABI."""
from typing import Tuple

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.dist import Distribution


class BinaryDistribution(Distribution):
    def has_ext_modules(self) -> bool:
        return True  # a platform wheel: it holds a shared library


class Py3Wheel(bdist_wheel):
    def get_tag(self) -> Tuple[str, str, str]:
        _, _, platform = super().get_tag()
        return "py3", "none", platform


setup(distclass=BinaryDistribution, cmdclass={"bdist_wheel": Py3Wheel})
