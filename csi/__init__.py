"""fabric csi package."""
