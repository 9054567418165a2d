"""FUSE door of tierd (pyfuse3, asyncio mode). The adapter itself arrives with issue #4."""
