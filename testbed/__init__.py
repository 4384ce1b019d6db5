"""Development tools for tests and benchmarks: the WAN emulator (``fabric
wan-proxy``). Services never import this package.
"""
