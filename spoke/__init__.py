"""fabric spoke package."""
