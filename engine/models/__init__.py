"""Model families (one file each), weight readers and the loader (``engine.models.loader``)."""
