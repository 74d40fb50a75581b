"""Container runtime: the Driver protocol, its OCI and process drivers, and the image store."""
