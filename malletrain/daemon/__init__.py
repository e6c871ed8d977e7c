"""malletrain.daemon."""
