"""Puts libkiln_c.so (the C API the package loads) into the kiln package: from KILN_LIBRARY, from
this checkout's CMake build, or by building the kiln_c target with the default preset. kiln._fast
(_fast.abi3.so, the C hot path of ExecutionContext.run) goes with it when the build made it beside
the library; without it the package runs on ctypes alone."""
import glob
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = os.path.dirname(os.path.abspath(__file__))


def find_library():
    env = os.environ.get("KILN_LIBRARY")
    if env:
        return env
    built = os.path.join(ROOT, "build", "src", "kiln", "api", "libkiln_c.so")
    if not os.path.exists(os.path.join(ROOT, "build", "build.ninja")):
        subprocess.check_call(["cmake", "--preset", "default"], cwd=ROOT)
    # Up to date (ninja does nothing when it is), or built now.
    subprocess.check_call(["cmake", "--build", "build", "--target", "kiln_c"], cwd=ROOT)
    # Absent when CMake found no Python headers (python3-dev): the package then runs on ctypes.
    if subprocess.call(["cmake", "--build", "build", "--target", "kiln_python_fast"],
                       cwd=ROOT) != 0:
        print("kiln: kiln._fast not built (no Python headers?): the package runs on ctypes alone")
    return built


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        library = find_library()
        shutil.copyfile(library, os.path.join(self.build_lib, "kiln", "libkiln_c.so"))
        for module in glob.glob(os.path.join(os.path.dirname(library), "_fast*.so")):
            shutil.copyfile(module, os.path.join(self.build_lib, "kiln", os.path.basename(module)))


class BinaryDistribution(Distribution):
    """The wheel carries a native library: tag it for this platform, not as pure Python."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPyWithLibrary}, distclass=BinaryDistribution,
      # setuptools' own build directory must not be CMake's build/.
      options={"build": {"build_base": ".pybuild"}})
