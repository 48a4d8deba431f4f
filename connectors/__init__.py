"""The node: its client, its simulator, and the normalisation of its answers."""
