"""The ``tandem`` command line: the edge where flags become validated configuration."""
