"""Write a draft LM as a Hugging Face Llama checkpoint: config.json + model.safetensors + tokenizer.

The same directory loads in Tandem (``--draft DIR``) and in transformers
(``AutoModelForCausalLM.from_pretrained(DIR)``, e.g. as ``assistant_model`` for its assisted
generation), so both are compared on the very same draft. The writer lives in the engine
(``engine/models/weights/hf_writer.py``), shared with ``tandem export-hf`` and the synthetic targets.
"""

from __future__ import annotations

from engine.models.weights.hf_writer import hf_config, hf_tensors, save_hf

__all__ = ["hf_config", "hf_tensors", "save_hf"]
