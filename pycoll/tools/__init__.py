"""pycoll's command-line tools: pycoll-bench, the self-check (info) and the demo.

Nothing here is imported by the library itself; the tools use the library's public surface.
"""
