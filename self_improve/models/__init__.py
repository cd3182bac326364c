"""Models: the base record (`base`), loading any HF model or the tiny default with its adapter chain
(`loading`), and exporting an iteration as a standalone HF directory (`export`)."""
