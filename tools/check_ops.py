"""lltm's operators, and a check that an installed lltm serves each with its kernels.

OPS is the list of the operators lltm defines. A new operator is one line here
(e.g. "lltm::my_new_op"), and from then on every packaged build must
register compiled kernels for it:

* the wheels' test commands (pyproject.toml, tools/cibuildwheel-cuda.toml,
  run by cibuildwheel and by ``nox -s cibuildwheel``, ``nox -s sdist`` and
  ``nox -s wheel``);
* the conda package's test (recipe/recipe.yaml).

Usage, in an environment with lltm (and lltm-cuda<major>) installed:

    python check_ops.py cpu         lltm's CPU kernels serve every operator
    python check_ops.py cpu cuda    and the CUDA plugin, loaded, serves every one

The check fails as well when lltm registers an operator that OPS does not list,
so that the list cannot fall behind. A kernel registered for a device's
dispatch key is a compiled lltm kernel: the composite fallback is registered
for CompositeExplicitAutograd, not per device. No GPU is needed.
"""

from __future__ import annotations

import sys

OPS = (
    "lltm::forward",
    "lltm::backward",
    "lltm::sequence_forward",
    "lltm::sequence_inference",
    "lltm::sequence_backward",
    "lltm::sequence_gate_grads",
)
# Operators with no CUDA kernel of their own, which the composite kernel (plain
# torch) serves on CUDA tensors: the CUDA check does not ask for one.
COMPOSITE_ON_CUDA: tuple[str, ...] = ()
DISPATCH_KEYS = {"cpu": "CPU", "cuda": "CUDA"}


def main(devices: list[str]) -> int:
    unknown = sorted(set(devices) - set(DISPATCH_KEYS))
    if not devices or unknown:
        sys.exit(f"usage: check_ops.py {{{','.join(DISPATCH_KEYS)}}}...; got {devices}")

    import torch

    import lltm

    registered = {
        name.split(".")[0]
        for name in torch._C._dispatch_get_all_op_names()
        if name.startswith("lltm::")
    }
    assert registered == set(OPS), (
        f"lltm {lltm.__version__} registers {sorted(registered)}; tools/check_ops.py "
        f"lists {sorted(OPS)}: update OPS"
    )
    if "cuda" in devices:
        from lltm import _backends

        assert _backends.PLUGIN.loaded, f"the CUDA plugin did not load: {_backends.PLUGIN.reason}"
    for device in devices:
        key = DISPATCH_KEYS[device]
        served = [op for op in OPS if not (device == "cuda" and op in COMPOSITE_ON_CUDA)]
        missing = [
            op for op in served if not torch._C._dispatch_has_kernel_for_dispatch_key(op, key)
        ]
        assert not missing, f"no compiled {key} kernel for {missing}"
        print(f"lltm {lltm.__version__}: compiled {key} kernels for {', '.join(served)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
