"""A round's executors and the typed data between them and the scheduler (engine/README.md draws a round).

base.py        RoundPlan (rows by executor, each with its Reason), RoundItem, RowResult
eager.py       the eager round: one target forward, verified step by step
fast_path.py   the co-located fast path: its graphs and each request's next drafts
fused.py       a whole round as one CUDA graph (FusedRounds)
ahead.py       the round launched before the one in flight is read
graph_sampling.py  a graph round's sampling buffers and modes
tree.py        a tree of drafts: its shape, greedy acceptance down it, the accepted path's KV moved
"""
