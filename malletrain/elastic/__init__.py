"""malletrain.elastic."""
