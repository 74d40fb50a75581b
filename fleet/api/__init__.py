"""Object model: kind registry, defaults, validation, selectors, patches. No I/O here."""
