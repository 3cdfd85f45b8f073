"""Harnesses that build whole machines to run lltm on: a Debian root made
from Debian's packages (debian_root), an emulated linux-aarch64 system under
qemu (emulated_aarch64), a fresh machine that runs the README as a new user
would (fresh_machine)."""
