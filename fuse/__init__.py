"""fabric fuse package."""
