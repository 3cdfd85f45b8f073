"""What setup.py needs besides setuptools and torch: the checks before a
build from source (source_build) and the C++ runtime lltm shares with torch
(cxx_runtime). Part of the sdist: every build runs them."""
