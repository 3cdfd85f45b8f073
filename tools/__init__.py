"""The project's own tooling: what setup.py, noxfile.py, the workflows and the
conda recipe run to build, check and package lltm. Nothing here ships.

``python -m tools.<check>`` runs a check from the repository's root;
``tools/machines/`` holds the harnesses that build whole machines (an
emulated aarch64 system, a fresh Debian root).
"""
