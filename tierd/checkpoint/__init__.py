"""Checkpoints staged in the memory pool and persisted through the tiers
(:mod:`.service`; the on-disk form in :mod:`.manifest`)."""
