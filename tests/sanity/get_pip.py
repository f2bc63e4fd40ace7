"""Stand-in for get-pip.py in ansible-test's virtual environments.

ansible-test bootstraps pip in each sanity virtual environment with a get-pip.py it downloads
from ci-files.testing.ansible.com, which this machine cannot reach (only PyPI is). It runs
that script as `python get_pip.py [pip options] pip==X [--no-setuptools] [--no-wheel]` in a
virtual environment made with --without-pip. This does the same job from what is reachable:
the interpreter's bundled pip (ensurepip, offline), then the packages asked for, from the
index pip is configured with. tests/sanity/run.sh puts it in ansible-test's cache when no
get-pip.py is cached there yet.
"""

import subprocess
import sys

SKIP = {"--no-setuptools", "--no-wheel"}  # get-pip options, not pip install options


def main():
    subprocess.run([sys.executable, "-m", "ensurepip", "--default-pip"], check=True, stdout=subprocess.DEVNULL)
    args = [arg for arg in sys.argv[1:] if arg not in SKIP]
    rc = subprocess.call([sys.executable, "-m", "pip", "install", "--quiet", *args])
    # ensurepip brings setuptools on Python < 3.12; get-pip.py leaves out what it is told to.
    unwanted = [name for name in ("setuptools", "wheel") if "--no-%s" % name in sys.argv[1:]]
    if rc == 0 and unwanted:
        rc = subprocess.call([sys.executable, "-m", "pip", "uninstall", "--quiet", "--yes", *unwanted])
    return rc


if __name__ == "__main__":
    sys.exit(main())
