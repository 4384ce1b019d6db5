"""fabric: a hub/spoke data fabric for AI training."""

__version__ = "0.1.0"
