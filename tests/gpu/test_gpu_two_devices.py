"""A service's engine on the second GPU (a drafter on cuda:1 beside a verifier on cuda:0: issue 21, two GPUs).

The current CUDA device is a thread's own: a service's engine thread must make its device current itself
(engine/factory.py ``engine_thread``), else its warm-up captures graphs on cuda:0's stream with cuda:1's tensors
and fails (``operation not permitted when stream is capturing``; seen on a two-H200 machine at a66702e). Needs two
CUDA devices (nvidia-h100-x2).
"""

from __future__ import annotations

import asyncio

import pytest
import torch

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")


def test_the_drafter_service_warms_up_and_drafts_on_cuda_1():
    from drafter_svc.main import build, warm_up
    from drafter_svc.servicer import DrafterServicer
    from drafter_svc.settings import DrafterSettings

    settings = DrafterSettings(device="cuda:1", draft="auto", attention="torch")
    config = settings.engine_config(wire=True)
    engine = build(settings, config)
    servicer = DrafterServicer(engine, config.draft_top_m or engine.vocab, config.device)

    async def go():
        await servicer.run(warm_up, engine)  # prefill graphs captured, two drafts
        return await servicer.run(torch.cuda.current_device)

    assert asyncio.run(go()) == 1


def test_a_verifier_engine_thread_warms_up_on_cuda_1():
    from engine.factory import build_engine
    from engine.graphs import PAD_SEQ
    from verifier_svc.core import LocalEngine
    from verifier_svc.service import VerifierEngine
    from verifier_svc.settings import VerifierSettings

    settings = VerifierSettings(device="cuda:1", draft="auto", attention="torch", engine_process=False)
    built = build_engine(settings.model, settings.draft, settings.engine_config(), progress=False)
    local = LocalEngine(VerifierEngine(built.decoder, settings.lease_s), settings.engine_config().device)

    async def go():
        await local.call("warm_up")  # prefill and round graphs captured; a prefill, a verify and two steps run
        return await asyncio.get_running_loop().run_in_executor(local.pool, torch.cuda.current_device)

    assert asyncio.run(go()) == 1
    alloc = built.decoder.target.allocator  # the warm-up's requests released: every block free but the graphs' scratch
    assert alloc.free_blocks == alloc.num_blocks - (PAD_SEQ in alloc)
