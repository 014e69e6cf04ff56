"""Where bytes live, who can see them, and in which order they are freed: the Topology, the host error records,
the NVL buffer of a node, the NVSHMEM session, symmetric buffers, and the byte layouts of those buffers. Every
resource object has destroy(collective). Imports the runtime, never an op."""
