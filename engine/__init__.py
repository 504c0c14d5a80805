"""Everything that runs a model inside one process."""
