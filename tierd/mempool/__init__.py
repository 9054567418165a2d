"""The emulated CXL memory pool: regions of shared memory handed to tenants over a unix
socket (see :mod:`.pool` for the model, :mod:`.server` for the socket)."""

from tierd.mempool.pool import FarMemory, MemPool, PoolError, Region

__all__ = ["FarMemory", "MemPool", "PoolError", "Region"]
