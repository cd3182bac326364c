"""The pipeline's DVC stages, one thin module each (`python -m stages.<name>`): parse the arguments
dvc.yaml gives, call the library (`self_improve`), write the outputs.

Importing the library first pins the CPU kernels before torch loads (self_improve/cpu.py).
"""

import self_improve  # noqa: F401
