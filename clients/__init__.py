"""Client side of tierd: SDK, fsspec filesystem, checkpoint API and the tierctl admin CLI."""
