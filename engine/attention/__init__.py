"""Attention backends behind one interface (see ``base.AttentionBackend``)."""

from engine.attention.base import AttentionBackend, AttentionMetadata, create_backend

__all__ = ["AttentionBackend", "AttentionMetadata", "create_backend"]
