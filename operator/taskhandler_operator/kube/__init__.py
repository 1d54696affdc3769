"""CRD models and generator, probe Job builder, status conditions."""
