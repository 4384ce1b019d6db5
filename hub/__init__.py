"""fabric hub package."""
