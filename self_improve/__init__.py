"""self-improve: a language model improving itself without human labels, one versioned stage at a time.

The library behind the DVC stages (`stages/`), the Prefect flows (`flows/`) and the scripts. Importing
it pins the CPU kernels before torch loads (`cpu.py` says why): the one import-time effect, and
the reason every entry point imports this package first.
"""

from self_improve.cpu import pin_cpu_kernels

pin_cpu_kernels()
