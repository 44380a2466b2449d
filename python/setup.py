"""The wheel carries a prebuilt libple.so (copied into src/ple/ by scripts/build-wheel.sh), so it
is a platform wheel: the distribution says it has binary content."""
from setuptools import setup
from setuptools.dist import Distribution


class BinaryDistribution(Distribution):
    def has_ext_modules(self) -> bool:
        return True


setup(distclass=BinaryDistribution)
