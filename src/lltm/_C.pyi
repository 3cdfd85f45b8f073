# The compiled library (csrc/cpu/module.cpp): importing it registers lltm's
# operators with torch. A plain CPython module, described here for type checkers.

device: str
lltm_version: str
torch_target_version: str

def cpu_isa() -> str: ...
