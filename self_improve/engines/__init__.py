"""Inference engines behind one `Sampler`: batched transformers (`hf`), CTranslate2 (`ct2`) and vLLM
(in-process and as a server), chosen by `sample.backend` (`sampler.open_sampler`)."""
