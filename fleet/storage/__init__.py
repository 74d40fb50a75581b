"""Storage: the CSI-style driver interface, in-tree drivers and the provisioner loop.

See `driver.py` for the interface and `registry.py` for how drivers are found.
"""
