"""What the staged vLLM peer's runs touch (bench/device/peer_import_check.py checks it on the GPU machine): the
modules of each use, the names the benchmark calls, the CUDA extensions a CPU machine cannot load, the shape of the
Llama model the peer runs with made-up weights, and the decoding methods it runs."""

from __future__ import annotations

# (a)-(e) and what a CUDA run imports on the way.
GROUPS: dict[str, list[str]] = {
    "a offline LLM": [
        "vllm",
        "vllm.entrypoints.llm",
        "vllm.sampling_params",
        "vllm.engine.arg_utils",
        "vllm.config",
        "vllm.v1.engine.core",
        "vllm.v1.engine.core_client",
        "vllm.v1.engine.input_processor",
        "vllm.v1.engine.output_processor",
        "vllm.v1.engine.detokenizer",
        "vllm.v1.core.sched.scheduler",
        "vllm.v1.core.sched.async_scheduler",
        "vllm.v1.core.kv_cache_manager",
        "vllm.v1.executor.abstract",
        "vllm.v1.executor.uniproc_executor",
        "vllm.v1.executor.multiproc_executor",
        "vllm.v1.structured_output",
        "vllm.tokenizers.hf",
        "vllm.renderers.hf",
        "vllm.transformers_utils.config",
        "vllm.usage.usage_lib",
    ],
    "cuda worker": [
        "vllm.platforms.cuda",
        "vllm.v1.worker.gpu_worker",
        "vllm.v1.worker.gpu_model_runner",
        "vllm.v1.worker.gpu.model_runner",
        "vllm.v1.worker.gpu.sample.sampler",
        "vllm.v1.worker.gpu.spec_decode.rejection_sampler",
        "vllm.v1.worker.gpu.cudagraph_utils",
        "vllm.v1.sample.sampler",
        "vllm.v1.sample.rejection_sampler",
        "vllm.v1.sample.ops.topk_topp_sampler",
        "vllm.compilation.backends",
        "vllm.compilation.cuda_graph",
        "vllm.compilation.decorators",
        "vllm.distributed.parallel_state",
        "vllm.distributed.device_communicators.cuda_communicator",
        "vllm.model_executor.warmup.kernel_warmup",
    ],
    "attention": [
        "vllm.vllm_flash_attn",
        "vllm.vllm_flash_attn.flash_attn_interface",
        "vllm.v1.attention.backends.fa_utils",
        "vllm.v1.attention.backends.flash_attn",
        "vllm.v1.attention.backends.triton_attn",
        "vllm.v1.attention.backends.flashinfer",
        "vllm.v1.attention.selector",
        "flashinfer.sampling",
    ],
    "b ngram speculation": [
        "vllm.config.speculative",
        "vllm.v1.spec_decode.ngram_proposer",
        "vllm.v1.spec_decode.ngram_proposer_gpu",
        "vllm.v1.spec_decode.metadata",
        "vllm.v1.spec_decode.metrics",
        "numba",
    ],
    "c llama + dummy load": [
        "vllm.model_executor.models.registry",
        "vllm.model_executor.models.llama",
        "vllm.model_executor.model_loader",
        "vllm.model_executor.model_loader.dummy_loader",
        "vllm.model_executor.model_loader.default_loader",
        "vllm.model_executor.layers.linear",
        "vllm.model_executor.layers.layernorm",
        "vllm.model_executor.layers.rotary_embedding",
        "vllm.model_executor.layers.vocab_parallel_embedding",
        "vllm.model_executor.layers.logits_processor",
        "vllm.model_executor.layers.activation",
    ],
    "d openai server": [
        "vllm.entrypoints.cli.main",
        "vllm.entrypoints.cli.serve",
        "vllm.entrypoints.openai.api_server",
        "vllm.entrypoints.openai.cli_args",
        "vllm.entrypoints.openai.completion.serving",
        "vllm.entrypoints.openai.completion.api_router",
        "vllm.entrypoints.openai.chat_completion.serving",
        "vllm.entrypoints.serve.instrumentator.metrics",
        "vllm.v1.engine.async_llm",
        "uvicorn",
        "uvloop",
        "httptools",
        "fastapi",
    ],
    "e engine stepping": [
        "vllm.engine.llm_engine",
        "vllm.v1.engine.llm_engine",
        "vllm.outputs",
    ],
}

# Names the benchmark calls.
ATTRS = [
    ("vllm", "LLM"),
    ("vllm", "SamplingParams"),
    ("vllm", "LLMEngine"),
    ("vllm", "EngineArgs"),
    ("vllm", "AsyncLLMEngine"),
    ("vllm.v1.engine.llm_engine", "LLMEngine"),
    ("vllm.v1.spec_decode.ngram_proposer", "NgramProposer"),
    ("vllm.v1.spec_decode.ngram_proposer_gpu", "NgramProposerGPU"),
]

# A CUDA extension failing to load because the CUDA libraries are absent (CPU machine).
CUDA_MARKERS = ("libcuda.so", "libcudart", "libtorch_cuda", "libc10_cuda", "libnvrtc",
                "requires the CUDA flash attention extensions", "libnvidia-ml")
CUDA_EXTS = [
    "vllm._C_stable_libtorch",
    "vllm._moe_C_stable_libtorch",
    "vllm._qutlass_C",
    "vllm._flashmla_C",
    "vllm.cumem_allocator",
    "vllm.vllm_flash_attn._vllm_fa3_C",
]

# Llama-3.2-1B's config.json (the shape; load_format="dummy" makes up the weights).
LLAMA_1B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
    "intermediate_size": 8192, "num_attention_heads": 32, "num_key_value_heads": 8,
    "num_hidden_layers": 16, "head_dim": 64, "vocab_size": 128256,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "bos_token_id": 128000,
    "eos_token_id": 128001, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
}

# The decoding methods the peer runs: configuration (always) and --smoke (GPU).
NGRAM_KEYS = {"num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
CASES = {
    "plain": None,
    "ngram": {"method": "ngram", **NGRAM_KEYS},
    "ngram_gpu": {"method": "ngram_gpu", **NGRAM_KEYS},
}
