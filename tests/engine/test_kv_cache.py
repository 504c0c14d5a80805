import pytest
import torch

from engine.kv_cache import BlockAllocator, KVCacheFull, PagedKVCache


def test_extend_truncate_free_roundtrip():
    a = BlockAllocator(num_blocks=8, block_size=4)
    a.extend("x", 9)  # 3 blocks
    assert a.length("x") == 9 and len(a.block_table("x")) == 3 and a.free_blocks == 5
    a.extend("y", 4)
    assert a.free_blocks == 4
    a.truncate("x", 4)  # roll back rejected drafts: one block kept
    assert a.length("x") == 4 and len(a.block_table("x")) == 1 and a.free_blocks == 6
    a.truncate("x", 0)
    assert a.block_table("x") == [] and a.free_blocks == 7
    a.free("x")
    a.free("y")
    assert a.free_blocks == 8 and "x" not in a


def test_slots_follow_block_table():
    a = BlockAllocator(num_blocks=6, block_size=4)
    a.extend("other", 4)
    a.extend("x", 6)
    table = a.block_table("x")
    assert a.slots("x", 0, 6) == [table[0] * 4 + i for i in range(4)] + [table[1] * 4, table[1] * 4 + 1]
    # blocks are owned exclusively
    assert not set(table) & set(a.block_table("other"))


def test_full_cache_raises_and_keeps_state():
    a = BlockAllocator(num_blocks=2, block_size=4)
    a.extend("x", 8)
    with pytest.raises(KVCacheFull):
        a.extend("y", 1)
    assert a.free_blocks == 0 and a.length("x") == 8


def test_bad_lengths_rejected():
    a = BlockAllocator(num_blocks=4, block_size=4)
    a.extend("x", 5)
    with pytest.raises(ValueError):
        a.extend("x", 3)
    with pytest.raises(ValueError):
        a.truncate("x", 6)


def test_write_lands_in_slots():
    cache = PagedKVCache(num_layers=2, num_kv_heads=2, head_dim=3, num_tokens=16, block_size=4,
                         dtype=torch.float32, device="cpu")
    k = torch.randn(3, 2, 3)
    v = torch.randn(3, 2, 3)
    slots = torch.tensor([5, 0, 13])
    cache.write(1, slots, k, v)
    flat_k = cache.k[1].view(-1, 2, 3)
    assert torch.equal(flat_k[slots], k) and torch.equal(cache.v[1].view(-1, 2, 3)[slots], v)
    assert cache.k[0].abs().sum() == 0  # other layers untouched
