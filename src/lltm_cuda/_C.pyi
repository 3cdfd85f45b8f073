# The compiled CUDA plugin (csrc/cuda/module.cpp): importing it registers the
# CUDA kernels. A plain CPython module, described here for type checkers.

device: str
lltm_version: str
cuda_version: str
cuda_archs: str

def kernel_image_problem(device: int, /) -> str: ...
