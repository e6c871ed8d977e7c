"""malletrain.sim."""
