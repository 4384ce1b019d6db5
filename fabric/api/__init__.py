"""Protocol frontends served by both the hub and the spoke over any data plane."""
