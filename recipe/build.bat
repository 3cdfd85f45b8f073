:: Build script of recipe.yaml (Windows): lltm with its CPU kernels.
set MAX_JOBS=%CPU_COUNT%
set LLTM_VARIANT=cpu
%PYTHON% -m pip install . --no-deps --no-build-isolation -vv
if errorlevel 1 exit 1
