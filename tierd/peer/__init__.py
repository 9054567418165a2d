"""The peer data door: nodes of a cluster read each other's unpersisted bytes.

A file written on node A lives in A's hot tier until it is persisted to the cold store; node
B reading it meanwhile fetches the bytes from A over HTTP, signed with the cluster's shared
secret.  :mod:`~tierd.peer.auth` signs and verifies, :mod:`~tierd.peer.registry` records
where each node's door is and whether it is alive, :mod:`~tierd.peer.server` answers,
:mod:`~tierd.peer.client` asks, and :mod:`~tierd.peer.door` runs one node's door.
"""
